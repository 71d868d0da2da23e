"""`python -m qwenvl_lab.toy.evaluate --seed S --n N` — exact-match accuracy on a fresh held-out set."""

import argparse
from collections import defaultdict

import torch

from ..prompt_table import single_table_batch
from ..tokenizing import ENDOFTEXT_ID, IM_END_ID, IM_START_ID, load_tokenizer, make_context
from ..vision import load_image
from . import load_toy_model
from .shapes import LANGS, QUESTION_KINDS, answer_matches, make_dataset
from .train import SPAN_NAME


def chat_batch(tokenizer, pictures, questions, history=None):
    """Left-padded context ids [B, L] and mask of a batch of questions; pictures[b] lists question b's pictures."""
    contexts = []
    for pics, text in zip(pictures, questions):
        spans = [p if isinstance(p, str) else SPAN_NAME.format(k=k + 1) for k, p in enumerate(pics)]
        query = tokenizer.from_list_format([{"image": s} for s in spans] + [{"text": text}])
        contexts.append(make_context(tokenizer, query, history=history)[1])
    length = max(map(len, contexts))
    ids = torch.tensor([[ENDOFTEXT_ID] * (length - len(c)) + c for c in contexts])  # left padding
    mask = torch.tensor([[0] * (length - len(c)) + [1] * len(c) for c in contexts])
    return ids, mask


def answer_with_features(model, tokenizer, ids, mask, input_vit, max_new_tokens=24) -> list[str]:
    """Greedy answers when the pictures of `ids` (in order) are given as `input_vit` [N, 256, H] through the prompt table
    (on the model's device, CPU or CUDA)."""
    ids, mask = ids.to(model.device), mask.to(model.device)
    with torch.inference_mode():
        fake_ids, table, tasks, task_vocab_size = single_table_batch(ids, input_vit.to(model.device, model.dtype),
                                                                     model.config.vocab_size)
        out = model.generate(fake_ids, attention_mask=mask, prompt_table=table if len(table) else None, tasks=tasks,
                             task_vocab_size=task_vocab_size, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=[IM_END_ID, IM_START_ID], pad_token_id=ENDOFTEXT_ID)
    return [tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True).strip() for row in out]


def ask(model, tokenizer, pictures, questions, zero_table=False, max_new_tokens=24, history=None) -> list[str]:
    """Greedy answers of the eager model for a batch: pictures[b] is a list of paths/PIL images for question b."""
    ids, mask = chat_batch(tokenizer, pictures, questions, history)
    images = [load_image(p) for pics in pictures for p in pics]
    with torch.inference_mode():
        input_vit = (model.transformer.visual.encode(images) if images
                     else torch.zeros(0, 256, model.config.hidden_size, device=model.device))
    if zero_table:
        input_vit = torch.zeros_like(input_vit)
    return answer_with_features(model, tokenizer, ids, mask, input_vit, max_new_tokens)


def evaluate(model, tokenizer, seed=1, n=500, zero_table=False, batch_size=32, examples=None) -> dict:
    """Accuracy per (kind, lang) and overall on `make_dataset(seed, n)` (or the given examples)."""
    examples = make_dataset(seed, n) if examples is None else examples
    hits = defaultdict(list)
    by_images = defaultdict(list)
    for e in examples:
        by_images[len(e.images)].append(e)
    for group in by_images.values():
        for start in range(0, len(group), batch_size):
            chunk = group[start : start + batch_size]
            answers = ask(model, tokenizer, [e.pictures() for e in chunk], [e.question for e in chunk], zero_table)
            for e, a in zip(chunk, answers):
                hits[(e.kind, e.lang)].append(answer_matches(a, e))
    result = {f"{k}/{lang}": sum(v) / len(v) for (k, lang), v in sorted(hits.items())}
    result["overall"] = sum(sum(v) for v in hits.values()) / sum(len(v) for v in hits.values())
    return result


def main(argv=None):
    """Command line: print accuracy per question kind and language, with the prompt table and zeroed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (default: the shipped toy model)")
    args = parser.parse_args(argv)
    model, tokenizer = load_toy_model(args.checkpoint), load_tokenizer()
    real = evaluate(model, tokenizer, args.seed, args.n)
    zero = evaluate(model, tokenizer, args.seed, args.n, zero_table=True)
    print(f"held-out set: seed {args.seed}, {args.n} questions")
    print(f"{'question':<12}{'accuracy':>10}{'table zeroed':>14}")
    for key in [f"{k}/{lang}" for k in QUESTION_KINDS for lang in LANGS] + ["overall"]:
        if key in real:
            print(f"{key:<12}{real[key]:>10.3f}{zero[key]:>14.3f}")


if __name__ == "__main__":
    main()
