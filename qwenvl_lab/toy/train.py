"""`python -m qwenvl_lab.toy.train` — train the toy Qwen-VL on shape pictures (CPU, seeded) and save it.

Images enter exactly as at inference: the vision tower's `input_vit` becomes the prompt table and the
image spans hold fake prompt ids (TensorRT-LLM's lookup). The vocabulary keeps its real size (151936),
but only the rows the data uses are trained; every other row of `wte` and `lm_head` stays zero, which
keeps the shipped checkpoint small. The loss is the full-vocabulary cross-entropy all the same: the
zero rows give logit 0, so they enter the softmax as one extra column of logit log(#zero rows).
Each training sequence is a multi-turn chat about its pictures (every question the templates allow,
in mixed languages), so one pass over the 256 image tokens supervises several answers. While training,
a throw-away linear probe on `input_vit` also learns what covers each patch (colour, kind and
left-to-right rank of the shape): this dense auxiliary signal teaches the small vision tower to see
in minutes. The probe is not part of the model and is not saved.
"""

import argparse
import itertools
import math
import random
from pathlib import Path

import numpy as np
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
from .shapes import (COLORS, KINDS, LANGS, Scene, Shape, color_of, count, describe, make_example, question, random_scene,
                     which_picture)

SPAN_NAME = "picture{k}.png"  # the path written in training spans (replaced by fake ids before the model sees it)


def encode_chat(tokenizer, n_images: int, text: str) -> list[int]:
    """Context ids of a chat turn asking `text` about `n_images` pictures (span paths are placeholders)."""
    ids, [(start, _)] = encode_conversation(tokenizer, n_images, [(text, "")])
    return ids[:start]


def encode_conversation(tokenizer, n_images: int, turns) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids of a multi-turn chat about the pictures, and where each answer (with its <|im_end|>) sits."""
    query = tokenizer.from_list_format([{"image": SPAN_NAME.format(k=k + 1)} for k in range(n_images)] + [{"text": turns[0][0]}])
    ids, spans, history = [], [], []
    for k, (text, answer) in enumerate(turns):
        turn_query = query if k == 0 else text
        context = make_context(tokenizer, turn_query, history=history)[1]
        if context[: len(ids)] != ids:
            raise RuntimeError("make_context did not extend the previous turns: the chat format changed")
        answer_ids = tokenizer.encode(answer) + [IM_END_ID]
        spans.append((len(context), len(context) + len(answer_ids)))
        ids = context + answer_ids
        history.append((turn_query, answer))
    return ids, spans


def encode_example(tokenizer, example):
    """(context ids, answer ids + <|im_end|>) of an example in Qwen-VL's chat format."""
    ids, [(start, _)] = encode_conversation(tokenizer, len(example.images), [(example.question, example.answer)])
    return ids[:start], ids[start:]


def make_conversation(rng: random.Random, pictures: int) -> tuple[list[Scene], list[tuple[str, str]]]:
    """Pictures and a multi-turn chat asking the questions the templates allow about them, languages mixed."""
    if pictures == 2:
        scenes = make_example(rng, "which", "en").images  # two pictures that differ
        first, second = ({(s.color, s.kind) for s in scene.shapes} for scene in scenes)
        options = sorted(first ^ second)
        rng.shuffle(options)
        turns = []
        for color, kind in options[:2]:
            lang = rng.choice(LANGS)
            turns.append((question("which", lang, shape=kind, color=color), which_picture(scenes, color, kind, lang)))
        return scenes, turns
    scene = random_scene(rng)
    once = [k for k in KINDS if sum(s.kind == k for s in scene.shapes) == 1]
    turns = []
    for kind in ("what", "count", "color"):
        lang = rng.choice(LANGS)
        if kind == "what":
            turns.append((question("what", lang), describe(scene, lang)))
        elif kind == "count":
            turns.append((question("count", lang), count(scene, lang)))
        elif once:
            shape = rng.choice(once)
            turns.append((question("color", lang, shape=shape), color_of(scene, shape, lang)))
    rng.shuffle(turns)
    return [scene], turns


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
        inputs.update(tokenizer.encode(prompt))  # the same question asked in a later turn
    return sorted(inputs), sorted(outputs)


def make_batch(tokenizer, conversations):
    """Right-padded ids [B, L], attention mask, target mask (positions whose next token is an answer token), targets, pixels."""
    rows = [encode_conversation(tokenizer, len(scenes), turns) for scenes, turns in conversations]
    length = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), length), ENDOFTEXT_ID)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    target_mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for b, (seq, spans) in enumerate(rows):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
        for start, stop in spans:
            target_mask[b, start - 1 : stop - 1] = True  # these positions predict answer tokens
    targets = torch.roll(ids, -1, dims=1)[target_mask]
    size = TOY_CONFIG["visual"]["image_size"]
    pixels = preprocess_images([scene.render(size) for scenes, _ in conversations for scene in scenes], size)
    return ids, mask, target_mask, targets, pixels


def patch_labels(scene: Scene, size: int, grid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per patch, raster order [grid²]: the shape at its centre (0 background, else 1 + colour·3 + kind), and its rank."""
    order = scene.left_to_right()
    codes = Scene(tuple(Shape(s.kind, s.color, s.box, (1 + COLORS.index(s.color) * 3 + KINDS.index(s.kind), 1 + order.index(s), 0))
                        for s in scene.shapes), background=(0, 0, 0))
    step = size // grid
    centres = np.asarray(codes.render(size))[step // 2 :: step, step // 2 :: step][:grid, :grid]  # [grid, grid, 3]
    return torch.from_numpy(centres[..., 0].reshape(-1).astype(np.int64)), torch.from_numpy(centres[..., 1].reshape(-1).astype(np.int64))


class PatchProbe(torch.nn.Module):
    """Auxiliary training head: from each `input_vit` row, the shape covering that patch and its left-to-right rank."""

    def __init__(self, hidden: int):
        super().__init__()
        self.shape = torch.nn.Linear(hidden, 1 + len(COLORS) * len(KINDS))
        self.rank = torch.nn.Linear(hidden, 4)

    def loss(self, input_vit, scenes) -> torch.Tensor:
        """Cross-entropy of both probes over every patch of every picture."""
        visual = TOY_CONFIG["visual"]
        grid = visual["image_size"] // visual["patch_size"]
        shape, rank = (torch.stack(t) for t in zip(*(patch_labels(s, visual["image_size"], grid) for s in scenes)))  # [N, 256]
        rows = input_vit.reshape(-1, input_vit.shape[-1])  # [N*256, H]
        return F.cross_entropy(self.shape(rows), shape.reshape(-1)) + F.cross_entropy(self.rank(rows), rank.reshape(-1))


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


def train(steps=3200, batch_size=16, lr=1e-3, seed=0, output_dir=TOY_DIR, eval_every=500):
    """Train the toy model and save it in Qwen-VL-Chat's layout; returns the model."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = load_tokenizer()
    model = QWenLMHeadModel(QWenVLConfig(**TOY_CONFIG))
    vocab = CompactVocab(model, *used_token_ids(tokenizer))
    probe = PatchProbe(model.config.hidden_size)
    body = [p for n, p in model.named_parameters() if not n.endswith(("wte.weight", "lm_head.weight"))]
    body += list(probe.parameters())
    opt = torch.optim.AdamW([{"params": body, "weight_decay": 0.01}, {"params": vocab.parameters(), "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    vocab_size = model.config.vocab_size
    bar = tqdm(range(steps), desc="training the toy Qwen-VL")
    model.train()
    for step in bar:
        pictures = 2 if step % 4 == 3 else 1  # two-picture batches on their own: similar lengths
        conversations = [make_conversation(rng, pictures) for _ in range(batch_size)]
        ids, mask, target_mask, targets, pixels = make_batch(tokenizer, conversations)
        input_vit = model.transformer.visual(pixels)  # [N, 256, H]
        fake_ids, prompt_table, tasks, task_vocab_size = single_table_batch(ids, input_vit, vocab_size)
        embeds = vocab.embed(fake_ids, prompt_table, tasks, task_vocab_size, vocab_size)  # [B, L, H]
        hidden, _ = model.transformer(inputs_embeds=embeds, attention_mask=mask)
        loss = vocab.loss(hidden[target_mask], targets)
        aux = probe.loss(input_vit, [scene for scenes, _ in conversations for scene in scenes])
        opt.zero_grad(set_to_none=True)
        (loss + aux).backward()
        torch.nn.utils.clip_grad_norm_([*body, *vocab.parameters()], 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.4f}", probe=f"{aux.item():.3f}")
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
    parser.add_argument("--steps", type=int, default=3200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=TOY_DIR)
    parser.add_argument("--eval-every", type=int, default=800)
    args = parser.parse_args(argv)
    train(args.steps, args.batch_size, args.lr, args.seed, args.out, args.eval_every)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
