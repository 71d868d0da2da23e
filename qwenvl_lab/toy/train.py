"""`python -m qwenvl_lab.toy.train` — train the toy Qwen-VL on shape pictures (CPU, seeded) and save it.

Images enter exactly as at inference: the vision tower's `input_vit` becomes the prompt table and the
image spans hold fake prompt ids (TensorRT-LLM's lookup). The vocabulary keeps its real size (151936),
but only the rows the data uses are trained; every other row of `wte` and `lm_head` stays zero, which
keeps the shipped checkpoint small. The loss is the full-vocabulary cross-entropy all the same: the
zero rows give logit 0, so they enter the softmax as one extra column of logit log(#zero rows).

Three stages, in bfloat16 autocast (about 1.7× faster than float32 on a CPU with AVX-512 BF16):
1. The vision tower alone learns what covers each image query's grid cell (colour and kind of the shape,
   and its left-to-right rank), through a throw-away linear probe on `input_vit`. The loss is counted
   over all queries and again over the queries on a shape, which are few: without that second term
   the tower sits at chance on circle / square / triangle for a long time.
2. The whole model on multi-turn chats about its pictures (every question the templates allow, in
   mixed languages), so one pass over the 256 image tokens supervises several answers; every third
   step has two pictures. The patch probe keeps training, and a second throw-away probe on layer 2's
   output asks each `</img>` what its picture holds and, on two-picture chats, each image token which
   picture it belongs to and each position that predicts a "Which picture has …?" answer which (colour,
   kind) pair was asked. That last one makes the two-picture question learnable here (without it: near a
   guess; with it: 100 % held out): the pair has to be one feature before it can be matched against the pictures.
3. Sharpening: the same chats, every second step with two pictures, at 0.3 × the learning rate on a schedule of
   its own.
The probes are not part of the model and are not saved.
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

from ..chat import SPAN_NAME
from ..checkpoint import save_checkpoint
from ..img_pos import locate_img_pos
from ..modeling import QWenLMHeadModel, QWenVLConfig
from ..prompt_table import prompt_tuning_embedding, single_table_batch
from ..tokenizing import ENDOFTEXT_ID, IM_END_ID, IMAGE_END_ID, IMAGE_START_ID, load_tokenizer, make_context
from ..vision import N_QUERIES, preprocess_images
from . import TOY_CONFIG, TOY_DIR
from .evaluate import evaluate
from .shapes import (
    COLORS,
    KINDS,
    LANGS,
    MAX_SHAPES,
    PICTURE_SIZE,
    Scene,
    Shape,
    color_of,
    count,
    describe,
    make_example,
    question,
    random_scene,
    which_picture,
)

STEPS, VISION_STEPS, SHARPEN_STEPS, EVAL_EVERY = 3400, 1500, 600, 800  # the shipped model's run


def pair_class(color: str, kind: str) -> int:
    """The (colour, kind) pair as one class of len(COLORS) · len(KINDS): colour · len(KINDS) + kind."""
    return COLORS.index(color) * len(KINDS) + KINDS.index(kind)


WHICH_ASKED = {
    question("which", lang, shape=k, color=c): pair_class(c, k) for lang in LANGS for c in COLORS for k in KINDS
}  # "Which picture has a <c> <k>?" → the pair asked


def encode_chat(tokenizer, n_images: int, text: str) -> list[int]:
    """Context ids of a chat turn asking `text` about `n_images` pictures (span paths are placeholders)."""
    ids, [(start, _)] = encode_conversation(tokenizer, n_images, [(text, "")])
    return ids[:start]


def encode_conversation(tokenizer, n_images: int, turns) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids of a multi-turn chat about the pictures, and where each answer (with its <|im_end|>) sits."""
    query = tokenizer.from_list_format(
        [{"image": SPAN_NAME.format(k=k + 1)} for k in range(n_images)] + [{"text": turns[0][0]}]
    )
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
    """Right-padded ids [B, L], attention mask, target mask (positions whose next token is an answer token), targets,
    pixels, and `asked` [B, L]: at the positions that predict a "Which picture has …?" answer, the (colour, kind)
    pair asked (colour · 3 + kind), elsewhere -100."""
    rows = [encode_conversation(tokenizer, len(scenes), turns) for scenes, turns in conversations]
    length = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), length), ENDOFTEXT_ID)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    target_mask = torch.zeros(len(rows), length, dtype=torch.bool)
    asked = torch.full((len(rows), length), -100)
    for b, ((seq, spans), (_, turns)) in enumerate(zip(rows, conversations)):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
        for (start, stop), (text, _) in zip(spans, turns):
            target_mask[b, start - 1 : stop - 1] = True  # these positions predict answer tokens
            asked[b, start - 1 : stop - 1] = WHICH_ASKED.get(text, -100)
    targets = torch.roll(ids, -1, dims=1)[target_mask]
    pixels = render_pixels([scene for scenes, _ in conversations for scene in scenes])
    return ids, mask, target_mask, targets, pixels, asked


def render_pixels(scenes) -> torch.Tensor:
    """Scenes drawn as the sample PNGs are (PICTURE_SIZE) and preprocessed as any picture is: [N, 3, S, S]."""
    return preprocess_images([scene.render(PICTURE_SIZE) for scene in scenes], TOY_CONFIG["visual"]["image_size"])


def patch_labels(scene: Scene) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image query, raster order [256]: the shape under its grid cell (0 background, else 1 + colour·3 + kind), its rank."""
    order = scene.left_to_right()
    codes = Scene(
        tuple(
            Shape(s.kind, s.color, s.box, (1 + pair_class(s.color, s.kind), 1 + order.index(s), 0))
            for s in scene.shapes
        ),
        background=(0, 0, 0),
    )
    grid = math.isqrt(N_QUERIES)
    step = PICTURE_SIZE // grid
    pixels = np.asarray(codes.render(PICTURE_SIZE))  # [S, S, 3]
    centres = pixels[step // 2 :: step, step // 2 :: step][:grid, :grid].astype(np.int64)  # [grid, grid, 3]
    return torch.from_numpy(centres[..., 0].reshape(-1)), torch.from_numpy(centres[..., 1].reshape(-1))


class PatchProbe(torch.nn.Module):
    """Auxiliary training head: from each `input_vit` row, the shape under that query's grid cell and its left-to-right rank."""

    def __init__(self, hidden: int):
        super().__init__()
        self.shape = torch.nn.Linear(hidden, 1 + len(COLORS) * len(KINDS))
        self.rank = torch.nn.Linear(hidden, 1 + MAX_SHAPES)

    def loss(self, input_vit, scenes) -> torch.Tensor:
        """Cross-entropy of both probes over every query, plus over the queries on a shape alone (most are background)."""
        labels = zip(*map(patch_labels, scenes))
        shape, rank = (torch.stack(t).reshape(-1).to(input_vit.device) for t in labels)  # [N*256] each
        rows = input_vit.reshape(-1, input_vit.shape[-1]).float()  # [N*256, H]
        on_shape = shape > 0
        total = rows.new_zeros(())
        for head, labels in ((self.shape, shape), (self.rank, rank)):
            logits = head(rows)
            total = total + F.cross_entropy(logits, labels) + F.cross_entropy(logits[on_shape], labels[on_shape])
        return total


class PictureProbe(torch.nn.Module):
    """Auxiliary training head on layer `layer`'s output: at each image token and `</img>`, which picture of the prompt
    it belongs to; at each `</img>`, which (colour, kind) pairs its picture holds and how many shapes; where a
    "Which picture has …?" answer is predicted, the pair asked (one class of 12: the question's colour and kind
    together, which the answer has to match against each picture's pairs)."""

    def __init__(self, model, layer: int):
        super().__init__()
        hidden = model.config.hidden_size
        self.tag = torch.nn.Linear(hidden, 2)
        self.inventory = torch.nn.Linear(hidden, len(COLORS) * len(KINDS))
        self.count = torch.nn.Linear(hidden, MAX_SHAPES)
        self.asked = torch.nn.Linear(hidden, len(COLORS) * len(KINDS))
        self.hidden = None
        self.hook = model.transformer.h[layer - 1].register_forward_hook(
            lambda m, args, out: setattr(self, "hidden", out)
        )

    def loss(self, fake_ids, vocab_size: int, scenes, asked) -> torch.Tensor:
        """Picture-index and asked-pair cross-entropies (prompts of two pictures) + inventory and count losses, from the
        last forward (asked [B, L] as make_batch gives it)."""
        ends = fake_ids == IMAGE_END_ID  # [B, L], one per picture, in the order of `scenes`
        summary = self.hidden[ends].float()  # [N, H]
        held = torch.zeros(len(scenes), len(COLORS) * len(KINDS), device=summary.device)
        for i, scene in enumerate(scenes):
            for s in scene.shapes:
                held[i, pair_class(s.color, s.kind)] = 1.0
        shapes = torch.tensor([len(scene.shapes) - 1 for scene in scenes], device=summary.device)
        total = F.binary_cross_entropy_with_logits(self.inventory(summary), held) + F.cross_entropy(
            self.count(summary), shapes
        )
        if len(scenes) > fake_ids.shape[0]:  # two pictures per prompt
            tagged = (fake_ids >= vocab_size) | ends  # [B, L]
            index = (fake_ids == IMAGE_START_ID).cumsum(dim=1) - 1  # [B, L]: the picture each token follows
            total = total + F.cross_entropy(self.tag(self.hidden[tagged].float()), index[tagged])
            before = asked >= 0  # [B, L]
            total = total + F.cross_entropy(self.asked(self.hidden[before].float()), asked[before])
        return total


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
        compact = torch.where(
            fake, ids - vocab_size + len(self.input_ids_used), self.remap[ids.clamp(max=vocab_size - 1)]
        )
        if (compact < 0).any():
            raise ValueError("a training sequence holds a token outside the compact vocabulary")
        return prompt_tuning_embedding(
            compact, self.wte, prompt_table, tasks, task_vocab_size, len(self.input_ids_used)
        )

    def loss(self, hidden, targets):
        """Full-vocabulary cross-entropy: trained rows + the zero rows as one column of logit log(count)."""
        logits = hidden.float() @ self.head.T  # [T, U]
        logits = torch.cat([logits, logits.new_full((logits.shape[0], 1), self.log_zero_rows)], dim=1)
        index = torch.tensor([self.head_index[int(t)] for t in targets], device=hidden.device)
        return F.cross_entropy(logits, index)

    def write_back(self, model):
        """Copy the trained rows into the full-size matrices, zeroing every other row."""
        with torch.no_grad():
            model.transformer.wte.weight.zero_()
            model.transformer.wte.weight[self.input_ids_used] = self.wte
            model.lm_head.weight.zero_()
            model.lm_head.weight[self.output_ids_used] = self.head


def optimizer(params, lr: float, steps: int, no_decay=()):
    """AdamW with a one-cycle schedule (5 % warm-up); `no_decay` parameters (embedding rows) are not decayed."""
    opt = torch.optim.AdamW(
        [{"params": params, "weight_decay": 0.01}, {"params": list(no_decay), "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)


def pretrain_vision(model, probe, rng, steps: int, batch_size: int, lr: float, device):
    """Stage 1: the vision tower and the probe alone, on single pictures (a few times cheaper than a full step)."""
    visual = model.transformer.visual
    params = [*visual.parameters(), *probe.parameters()]
    opt, sched = optimizer(params, lr, steps)
    for _ in tqdm(range(steps), desc="stage 1: the vision tower"):
        scenes = [random_scene(rng) for _ in range(batch_size)]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = probe.loss(visual(render_pixels(scenes).to(device)), scenes)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()


def train(
    steps=STEPS,
    batch_size=16,
    lr=1e-3,
    seed=0,
    output_dir=TOY_DIR,
    eval_every=EVAL_EVERY,
    vision_steps=VISION_STEPS,
    device="cpu",
    picture_probe=1.0,
    probe_layer=2,
    sharpen_steps=SHARPEN_STEPS,
):
    """Train the toy model and save it in Qwen-VL-Chat's layout; returns the model."""
    device = torch.device(device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = load_tokenizer()
    model = QWenLMHeadModel(QWenVLConfig(**TOY_CONFIG)).to(device)
    vocab = CompactVocab(model, *used_token_ids(tokenizer)).to(device)
    probe = PatchProbe(model.config.hidden_size).to(device)
    pictures_probe = PictureProbe(model, probe_layer).to(device)
    model.train()
    pretrain_vision(model, probe, rng, vision_steps, 2 * batch_size, 2 * lr, device)
    body = [p for n, p in model.named_parameters() if not n.endswith(("wte.weight", "lm_head.weight"))]
    body += [*probe.parameters(), *pictures_probe.parameters()]
    vocab_size = model.config.vocab_size

    def run(stage: str, n_steps: int, stage_lr: float, two_pictures_every: int):
        """n_steps of whole-model training, two-picture chats every `two_pictures_every`-th step."""
        opt, sched = optimizer(body, stage_lr, n_steps, no_decay=vocab.parameters())
        bar = tqdm(range(n_steps), desc=stage)
        for step in bar:
            pictures = 2 if step % two_pictures_every == two_pictures_every - 1 else 1  # batches of similar lengths
            conversations = [make_conversation(rng, pictures) for _ in range(batch_size)]
            ids, mask, target_mask, targets, pixels, asked = (
                t.to(device) for t in make_batch(tokenizer, conversations)
            )
            with torch.autocast(device.type, dtype=torch.bfloat16):
                input_vit = model.transformer.visual(pixels)  # [N, 256, H]
                fake_ids, prompt_table, tasks, task_vocab_size = single_table_batch(ids, input_vit.float(), vocab_size)
                embeds = vocab.embed(fake_ids, prompt_table, tasks, task_vocab_size, vocab_size)  # [B, L, H]
                hidden, _ = model.transformer(inputs_embeds=embeds, attention_mask=mask)
                loss = vocab.loss(hidden[target_mask], targets)
                drawn = [scene for scenes, _ in conversations for scene in scenes]  # in the order of the image spans
                aux = probe.loss(input_vit, drawn) + picture_probe * pictures_probe.loss(
                    fake_ids, vocab_size, drawn, asked
                )
            opt.zero_grad(set_to_none=True)
            (loss + aux).backward()
            torch.nn.utils.clip_grad_norm_([*body, *vocab.parameters()], 1.0)
            opt.step()
            sched.step()
            bar.set_postfix(loss=f"{loss.item():.4f}", probe=f"{aux.item():.3f}")
            if eval_every and ((step + 1) % eval_every == 0 or step + 1 == n_steps):
                vocab.write_back(model)
                model.eval()
                print(
                    f"{stage}, step {step + 1}: loss {loss.item():.4f}; held-out accuracy "
                    f"{evaluate(model, tokenizer, seed=10_000 + step, n=48)['overall']:.3f}"
                )
                model.train()

    run("stage 2: the whole model", steps, lr, 3)
    if sharpen_steps:
        run("stage 3: sharpening", sharpen_steps, 0.3 * lr, 2)
    pictures_probe.hook.remove()  # the probe is thrown away: the model keeps no hook
    vocab.write_back(model)
    model.eval()
    model.to("cpu", torch.bfloat16)
    save_checkpoint(model, output_dir, max_shard_size="100MB")
    return model.float()


def main(argv=None):
    """Command line: python -m qwenvl_lab.toy.train [--steps N] [--out DIR]."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=TOY_DIR)
    parser.add_argument(
        "--eval-every", type=int, default=EVAL_EVERY, help="print a small held-out accuracy every N steps (0: never)"
    )
    parser.add_argument("--vision-steps", type=int, default=VISION_STEPS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--picture-probe", type=float, default=1.0, help="weight of the layer-2 picture probe")
    parser.add_argument(
        "--sharpen-steps",
        type=int,
        default=SHARPEN_STEPS,
        help="stage 3: N more steps at 0.3 × the learning rate, every second one with two pictures",
    )
    args = parser.parse_args(argv)
    train(
        args.steps,
        args.batch_size,
        args.lr,
        args.seed,
        args.out,
        args.eval_every,
        args.vision_steps,
        args.device,
        args.picture_probe,
        sharpen_steps=args.sharpen_steps,
    )
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
