"""`python -m qwenvl_lab.toy.evaluate --seed S --n N` — exact-match accuracy on a fresh held-out set."""

from collections import defaultdict

import torch

from .. import options
from ..chat import ModelAsRunner, ask_batch
from ..options import Parser
from ..tokenizing import IMG_TOKEN_SPAN, load_tokenizer
from .course import load_toy_model
from .shapes import LANGS, QUESTION_KINDS, answer_matches, grounding_score, make_dataset, no_picture


def ask(model, tokenizer, pictures, questions, zero_table=False, max_new_tokens=32, history=None) -> list[str]:
    """Greedy answers of the eager model for a batch: pictures[b] is a list of paths/PIL images for question b
    (zero_table: every picture's features replaced by zeros, so the model sees no picture content)."""
    vision, input_vit = model.transformer.visual, None
    if zero_table:
        count = sum(len(p) for p in pictures)
        input_vit = torch.zeros(count, IMG_TOKEN_SPAN, model.config.hidden_size)  # [N, 256, H]
    return ask_batch(
        ModelAsRunner(model),
        vision,
        tokenizer,
        list(zip(pictures, questions)),
        history,
        input_vit=input_vit,
        max_new_tokens=max_new_tokens,
    )


def is_right(answer: str, example) -> bool:
    """A hit: the exact answer, or for "where" a box that overlaps the shape's (IoU >= 0.5) with the right name."""
    if example.kind == "where":
        score = grounding_score(answer, example)
        return score["right_shape"] and score["iou"] >= 0.5
    return answer_matches(answer, example)


def evaluate(model, tokenizer, seed=1, n=500, zero_table=False, batch_size=32, examples=None) -> dict:
    """Accuracy per (kind, lang) and overall on `make_dataset(seed, n)` (or the given examples)."""
    examples = make_dataset(seed, n) if examples is None else examples
    if not examples:
        raise ValueError(f"no questions to evaluate (n={n}): ask for at least one (--n 1 or more)")
    hits = defaultdict(list)
    by_images = defaultdict(list)
    for e in examples:
        by_images[len(e.images)].append(e)
    for group in by_images.values():
        for start in range(0, len(group), batch_size):
            chunk = group[start : start + batch_size]
            answers = ask(model, tokenizer, [e.pictures() for e in chunk], [e.question for e in chunk], zero_table)
            for e, a in zip(chunk, answers):
                hits[(e.kind, e.lang)].append(is_right(a, e))
    result = {f"{k}/{lang}": sum(v) / len(v) for (k, lang), v in sorted(hits.items())}
    result["overall"] = sum(sum(v) for v in hits.values()) / sum(len(v) for v in hits.values())
    return result


def no_picture_accuracy(model, tokenizer, examples, batch_size=32) -> dict:
    """Per language ("none/en", "none/zh"), the share of the examples' questions, asked with no picture, that get the
    no-picture answer in their own language."""
    hits = defaultdict(list)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        answers = ask(model, tokenizer, [[] for _ in chunk], [e.question for e in chunk])
        for e, a in zip(chunk, answers):
            hits[e.lang].append(a.strip() == no_picture(e.lang))
    return {f"none/{lang}": sum(v) / len(v) for lang, v in sorted(hits.items())}


MOST_QUESTIONS = 1_000_000  # --n: a held-out set of a million questions takes days on a CPU already


def parser() -> Parser:
    """`qwenvl-lab evaluate`'s options."""
    parser = Parser(prog="qwenvl-lab evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=options.whole(0, options.SEED_MAX), default=1)
    parser.add_argument("--n", type=options.whole(1, MOST_QUESTIONS), default=500, help="questions (default: 500)")
    parser.add_argument(
        "--checkpoint",
        type=options.folder_with("config.json", "a Qwen-VL checkpoint directory"),
        default=None,
        help="checkpoint directory (default: the shipped toy model)",
    )
    parser.add_argument("--device", type=options.device, default="cpu", help="cpu or cuda (default: %(default)s)")
    return parser


def main(argv=None):
    """Command line: print accuracy per question kind and language, with the prompt table and zeroed."""
    args = parser().parse_args(argv)
    model, tokenizer = load_toy_model(args.checkpoint, device=args.device), load_tokenizer()
    examples = make_dataset(args.seed, args.n)
    real = evaluate(model, tokenizer, examples=examples)
    zero = evaluate(model, tokenizer, examples=examples, zero_table=True)
    print(f"held-out set: seed {args.seed}, {args.n} questions ('where': a box of IoU >= 0.5 with the shape's)")
    print(f"{'question':<12}{'accuracy':>10}{'table zeroed':>14}")
    for key in [f"{k}/{lang}" for k in QUESTION_KINDS for lang in LANGS] + ["overall"]:
        if key in real:
            print(f"{key:<12}{real[key]:>10.3f}{zero[key]:>14.3f}")
    for key, value in no_picture_accuracy(model, tokenizer, examples).items():
        print(f"{key:<12}{value:>10.3f}   the same questions with no picture: '{no_picture(key[-2:])}'")


if __name__ == "__main__":
    main()
