"""`python -m qwenvl_lab.toy.train` — train the toy Qwen-VL on shape pictures (CPU, seeded) and save it.

Images enter exactly as at inference: the vision tower's `input_vit` becomes the prompt table and the
image spans hold fake prompt ids (TensorRT-LLM's lookup). The vocabulary keeps its real size (151936),
but only the rows the data uses are trained; every other row of `wte` and `lm_head` stays zero, which
keeps the shipped checkpoint small. The loss is the full-vocabulary cross-entropy all the same: the
zero rows give logit 0, so they enter the softmax as one extra column of logit log(#zero rows).
"""

import argparse
import itertools
import math
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..checkpoint import save_checkpoint
from ..img_pos import locate_img_pos
from ..modeling import QWenLMHeadModel, QWenVLConfig
from ..prompt_table import prompt_tuning_embedding, single_table_batch
from ..tokenizing import ENDOFTEXT_ID, IM_END_ID, load_tokenizer, make_context
from ..vision import preprocess_images
from . import TOY_CONFIG, TOY_DIR
from .shapes import (COLORS, KINDS, LANGS, QUESTION_KINDS, Scene, Shape, color_of, count, describe, make_example, question,
                     which_picture)

SPAN_NAME = "picture{k}.png"  # the path written in training spans (replaced by fake ids before the model sees it)


def encode_chat(tokenizer, n_images: int, text: str) -> list[int]:
    """Context ids of a chat turn asking `text` about `n_images` pictures (span paths are placeholders)."""
    query = tokenizer.from_list_format([{"image": SPAN_NAME.format(k=k + 1)} for k in range(n_images)] + [{"text": text}])
    return make_context(tokenizer, query)[1]


def encode_example(tokenizer, example):
    """(context ids, answer ids + <|im_end|>) of an example in Qwen-VL's chat format."""
    return encode_chat(tokenizer, len(example.images), example.question), tokenizer.encode(example.answer) + [IM_END_ID]


def all_answers() -> list[str]:
    """Every answer string the templates can produce, in both languages."""
    answers = set()
    shapes = [(c, k) for c in COLORS for k in KINDS]
    boxes = [(0.05, 0.05, 0.25, 0.25), (0.4, 0.05, 0.6, 0.25), (0.75, 0.05, 0.95, 0.25)]
    for lang in LANGS:
        for n in (1, 2, 3):
            for combo in itertools.product(shapes, repeat=n):
                scene = Scene(tuple(Shape(k, c, boxes[i]) for i, (c, k) in enumerate(combo)))
                answers.add(describe(scene, lang))
                answers.add(count(scene, lang))
        for c in COLORS:
            answers.add(color_of(Scene((Shape("circle", c, boxes[0]),)), "circle", lang))
        one = Scene((Shape("circle", "red", boxes[0]),))
        two = Scene((Shape("square", "blue", boxes[0]),))
        answers.add(which_picture([one, two], "red", "circle", lang))
        answers.add(which_picture([one, two], "blue", "square", lang))
    return sorted(answers)


def all_prompts() -> list[str]:
    """Every question the templates can ask, in both languages."""
    out = []
    for lang in LANGS:
        out += [question("what", lang), question("count", lang)]
        out += [question("color", lang, shape=k) for k in KINDS]
        out += [question("which", lang, shape=k, color=c) for k in KINDS for c in COLORS]
    return out


def used_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """(input ids the data can contain, output ids the answers can contain), both sorted."""
    outputs = {IM_END_ID}
    for answer in all_answers():
        outputs.update(tokenizer.encode(answer))
    inputs = set(outputs) | {ENDOFTEXT_ID}
    for prompt in all_prompts():
        for n in (1, 2):
            context = torch.tensor(encode_chat(tokenizer, n, prompt))
            for _, a, b in locate_img_pos(context).tolist():
                context[a + 1 : b] = ENDOFTEXT_ID  # path bytes become fake ids: they need no embedding row
            inputs.update(context.tolist())
    return sorted(inputs), sorted(outputs)


def make_batch(tokenizer, examples):
    """Right-padded ids [B, L], attention mask, target mask (positions whose next token is an answer token), targets."""
    rows = [encode_example(tokenizer, e) for e in examples]
    length = max(len(c) + len(a) for c, a in rows)
    ids = torch.full((len(rows), length), ENDOFTEXT_ID)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    target_mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for b, (context, answer) in enumerate(rows):
        seq = context + answer
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
        target_mask[b, len(context) - 1 : len(seq) - 1] = True  # predicts answer tokens
    targets = torch.roll(ids, -1, dims=1)[target_mask]
    pixels = preprocess_images([p for e in examples for p in e.pictures()], TOY_CONFIG["visual"]["image_size"])
    return ids, mask, target_mask, targets, pixels


class CompactVocab(torch.nn.Module):
    """Trainable rows of `wte` and `lm_head` for the ids the data uses (all other rows stay zero)."""

    def __init__(self, model, input_ids_used, output_ids_used):
        super().__init__()
        vocab_size = model.config.vocab_size
        self.register_buffer("remap", torch.full((vocab_size,), -1, dtype=torch.long))
        self.remap[torch.tensor(input_ids_used)] = torch.arange(len(input_ids_used))
        self.input_ids_used, self.output_ids_used = input_ids_used, output_ids_used
        self.wte = torch.nn.Parameter(model.transformer.wte.weight.data[input_ids_used].clone())
        self.head = torch.nn.Parameter(model.lm_head.weight.data[output_ids_used].clone())
        self.head_index = {t: i for i, t in enumerate(output_ids_used)}
        self.log_zero_rows = math.log(vocab_size - len(output_ids_used))

    def embed(self, ids, prompt_table, tasks, task_vocab_size, vocab_size):
        """The real prompt-table lookup, over the compact vocabulary."""
        fake = ids >= vocab_size
        compact = torch.where(fake, ids - vocab_size + len(self.input_ids_used), self.remap[ids.clamp(max=vocab_size - 1)])
        if (compact < 0).any():
            raise ValueError("a training sequence holds a token outside the compact vocabulary")
        return prompt_tuning_embedding(compact, self.wte, prompt_table, tasks, task_vocab_size, len(self.input_ids_used))

    def loss(self, hidden, targets):
        """Full-vocabulary cross-entropy: trained rows + the zero rows as one column of logit log(count)."""
        logits = hidden @ self.head.T  # [T, U]
        logits = torch.cat([logits, logits.new_full((logits.shape[0], 1), self.log_zero_rows)], dim=1)
        index = torch.tensor([self.head_index[int(t)] for t in targets])
        return F.cross_entropy(logits, index)

    def write_back(self, model):
        """Copy the trained rows into the full-size matrices, zeroing every other row."""
        with torch.no_grad():
            model.transformer.wte.weight.zero_()
            model.transformer.wte.weight[self.input_ids_used] = self.wte
            model.lm_head.weight.zero_()
            model.lm_head.weight[self.output_ids_used] = self.head


def train(steps=3000, batch_size=24, lr=2e-3, seed=0, output_dir=TOY_DIR, eval_every=500):
    """Train the toy model and save it in Qwen-VL-Chat's layout; returns the model."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = load_tokenizer()
    model = QWenLMHeadModel(QWenVLConfig(**TOY_CONFIG))
    vocab = CompactVocab(model, *used_token_ids(tokenizer))
    body = [p for n, p in model.named_parameters() if not n.endswith(("wte.weight", "lm_head.weight"))]
    opt = torch.optim.AdamW([{"params": body, "weight_decay": 0.01}, {"params": vocab.parameters(), "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    vocab_size = model.config.vocab_size
    single = [k for k in QUESTION_KINDS if k != "which"]
    bar = tqdm(range(steps), desc="training the toy Qwen-VL")
    model.train()
    for step in bar:
        kinds = ["which"] if step % 4 == 3 else single  # two-picture batches on their own: similar lengths
        examples = [make_example(rng, rng.choice(kinds), rng.choice(LANGS)) for _ in range(batch_size)]
        ids, mask, target_mask, targets, pixels = make_batch(tokenizer, examples)
        input_vit = model.transformer.visual(pixels)  # [N, 256, H]
        fake_ids, prompt_table, tasks, task_vocab_size = single_table_batch(ids, input_vit, vocab_size)
        embeds = vocab.embed(fake_ids, prompt_table, tasks, task_vocab_size, vocab_size)  # [B, L, H]
        hidden, _ = model.transformer(inputs_embeds=embeds, attention_mask=mask)
        loss = vocab.loss(hidden[target_mask], targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*body, *vocab.parameters()], 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if eval_every and (step + 1) % eval_every == 0:
            vocab.write_back(model)
            from .evaluate import evaluate

            model.eval()
            print(f"step {step + 1}: loss {loss.item():.4f}; held-out accuracy "
                  f"{evaluate(model, tokenizer, seed=10_000 + step, n=48)['overall']:.3f}")
            model.train()
    vocab.write_back(model)
    model.eval()
    model.to(torch.bfloat16)
    save_checkpoint(model, output_dir, max_shard_size="100MB")
    return model.float()


def main(argv=None):
    """Command line: python -m qwenvl_lab.toy.train [--steps N] [--out DIR]."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=TOY_DIR)
    parser.add_argument("--eval-every", type=int, default=500)
    args = parser.parse_args(argv)
    train(args.steps, args.batch_size, args.lr, args.seed, args.out, args.eval_every)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
