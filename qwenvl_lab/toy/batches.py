"""The toy model's training data: multi-turn chats about shape pictures, and the batches and probe labels made of them.

A batch of one training step is a pure function of (seed, stage, step), so a run that stops can resume at any step,
and worker processes can make the batches ahead of the GPU.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass

import numpy as np
import torch

from ..chat import SPAN_NAME
from ..grounding import to_list_format
from ..img_pos import locate_img_pos
from ..tokenizing import ENDOFTEXT_ID, IM_END_ID, load_tokenizer, make_context
from ..vision import N_QUERIES, preprocess_images
from .shapes import (
    COLORS,
    KINDS,
    LANGS,
    PICTURE_SIZE,
    Scene,
    Shape,
    color_of,
    count,
    describe,
    make_example,
    no_picture,
    question,
    random_scene,
    where_is,
    which_picture,
)

BOX_BINS = 50  # a box corner coordinate on the 0–1000 grid, in bins of 20 for the probes
IGNORE = -100  # cross-entropy's ignore_index: no label at this position
_ANY_SCENE = Scene((Shape("circle", "red", (0.1, 0.1, 0.3, 0.3)),))  # a picture whose content does not matter


@dataclass(frozen=True)
class Turn:
    """One turn of a chat: the pictures it adds (before its question, as from_list_format writes them), the
    question and the answer (a Query when it holds <ref>/<box> tags)."""

    pictures: tuple[Scene, ...]
    question: str
    answer: str


def pair_class(color: str, kind: str) -> int:
    """The (colour, kind) pair as one class of len(COLORS) · len(KINDS): colour · len(KINDS) + kind."""
    return COLORS.index(color) * len(KINDS) + KINDS.index(kind)


ASKED = {
    question(kind, lang, shape=k, color=c): pair_class(c, k)
    for kind in ("which", "where")
    for lang in LANGS
    for c in COLORS
    for k in KINDS
}  # "Which picture has a <c> <k>?" / "Where is the <c> <k>?" → the pair asked


def box_bins(grid_box) -> list[int]:
    """A box (x1, y1, x2, y2) on the 0–1000 grid as four bins of BOX_BINS."""
    return [min(v * BOX_BINS // 1000, BOX_BINS - 1) for v in grid_box]


def random_question(rng: random.Random, lang: str) -> str:
    """Any question the templates can ask, with a random shape and colour where it needs them."""
    kind = rng.choice(("what", "count", "color", "which", "where"))
    shape = rng.choice(KINDS) if kind in ("color", "which", "where") else None
    color = rng.choice(COLORS) if kind in ("which", "where") else None
    return question(kind, lang, shape=shape, color=color)


def make_conversation(rng: random.Random, pictures: int) -> list[Turn]:
    """A chat about `pictures` pictures (0, 1 or 2; the first turn adds them) asking the questions the templates
    allow, languages mixed: none → each question answered 'There is no picture.'; one → what, count, colour (a kind
    that appears once) and where (up to two shapes that appear once), in random order; two → two "which" questions."""
    if pictures == 0:
        turns = []
        for _ in range(rng.randint(1, 2)):
            lang = rng.choice(LANGS)
            turns.append(Turn((), random_question(rng, lang), no_picture(lang)))
        return turns
    if pictures == 2:
        scenes = tuple(make_example(rng, "which", "en").images)  # two pictures that differ
        first, second = ({(s.color, s.kind) for s in scene.shapes} for scene in scenes)
        options = sorted(first ^ second)
        rng.shuffle(options)
        turns = []
        for color, kind in options[:2]:
            lang = rng.choice(LANGS)
            turns.append(
                Turn((), question("which", lang, shape=kind, color=color), which_picture(scenes, color, kind, lang))
            )
        return [Turn(scenes, turns[0].question, turns[0].answer), *turns[1:]]
    scene = random_scene(rng)
    kinds_once = [k for k in KINDS if sum(s.kind == k for s in scene.shapes) == 1]
    pairs = [(s.color, s.kind) for s in scene.shapes]
    pairs_once = [p for p in pairs if pairs.count(p) == 1]
    rng.shuffle(pairs_once)
    turns = []
    lang = rng.choice(LANGS)
    turns.append((question("what", lang), describe(scene, lang)))
    lang = rng.choice(LANGS)
    turns.append((question("count", lang), count(scene, lang)))
    if kinds_once:
        lang, kind = rng.choice(LANGS), rng.choice(kinds_once)
        turns.append((question("color", lang, shape=kind), color_of(scene, kind, lang)))
    for color, kind in pairs_once[:2]:
        lang = rng.choice(LANGS)
        turns.append((question("where", lang, shape=kind, color=color), where_is(scene, color, kind, lang)))
    rng.shuffle(turns)
    return [Turn((scene,) if k == 0 else (), q, a) for k, (q, a) in enumerate(turns)]


def encode_conversation(tokenizer, turns) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids of a multi-turn chat in Qwen-VL's chat format (span paths are placeholders), and where each answer (with
    its <|im_end|>) sits."""
    ids, spans, history = [], [], []
    for turn in turns:
        query = tokenizer.from_list_format(
            [{"image": SPAN_NAME.format(k=k + 1)} for k in range(len(turn.pictures))] + [{"text": turn.question}]
        )
        context = make_context(tokenizer, query, history=history)[1]
        if context[: len(ids)] != ids:
            raise RuntimeError("make_context did not extend the previous turns: the chat format changed")
        answer_ids = tokenizer.encode(turn.answer) + [IM_END_ID]
        spans.append((len(context), len(context) + len(answer_ids)))
        ids = context + answer_ids
        history.append((query, turn.answer))
    return ids, spans


def all_answers() -> list[str]:
    """Every answer the templates can give, in both languages (boxes as the tags and digits they are made of)."""
    answers = set()
    shapes = [(c, k) for c in COLORS for k in KINDS]
    boxes = [(0.05, 0.05, 0.25, 0.25), (0.4, 0.05, 0.6, 0.25), (0.75, 0.05, 0.95, 0.25)]
    for lang in LANGS:
        for n in (1, 2, 3):
            for combo in itertools.product(shapes, repeat=n):
                scene = Scene(tuple(Shape(k, c, boxes[i]) for i, (c, k) in enumerate(combo)))
                answers.add(describe(scene, lang))
                answers.add(count(scene, lang))
        for c, k in shapes:
            scene = Scene((Shape(k, c, boxes[0]),))
            answers.add(color_of(scene, k, lang))
            answers.add(where_is(scene, c, k, lang))
        one = Scene((Shape("circle", "red", boxes[0]),))
        two = Scene((Shape("square", "blue", boxes[0]),))
        answers.add(which_picture([one, two], "red", "circle", lang))
        answers.add(which_picture([one, two], "blue", "square", lang))
        answers.add(no_picture(lang))
    return sorted(answers)


def all_prompts() -> list[str]:
    """Every question the templates can ask, in both languages."""
    out = []
    for lang in LANGS:
        out += [question("what", lang), question("count", lang)]
        out += [question("color", lang, shape=k) for k in KINDS]
        out += [question(kind, lang, shape=k, color=c) for kind in ("which", "where") for k in KINDS for c in COLORS]
    return out


def used_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """(input ids the data can contain, output ids the answers can contain), both sorted."""
    outputs = {IM_END_ID} | {tokenizer.encode(str(d))[0] for d in range(10)}  # every digit a box can hold
    for answer in all_answers():
        outputs.update(tokenizer.encode(answer))
    inputs = set(outputs) | {ENDOFTEXT_ID}
    for prompt in all_prompts():
        for n in (0, 1, 2):
            context = torch.tensor(encode_conversation(tokenizer, [Turn((_ANY_SCENE,) * n, prompt, "")])[0])
            for _, a, b in locate_img_pos(context).tolist():
                context[a + 1 : b] = ENDOFTEXT_ID  # path bytes become fake ids: they need no embedding row
            inputs.update(context.tolist())
        inputs.update(tokenizer.encode(prompt))  # the same question asked in a later turn
    return sorted(inputs), sorted(outputs)


def patch_labels(scene: Scene) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per image query, raster order over the 16 × 16 grid [256]: the shape under its grid cell (0 background, else
    1 + pair class), its left-to-right rank (0 background), and its box's four bins [256, 4] (IGNORE off shapes)."""
    order = scene.left_to_right()
    codes = Scene(
        tuple(Shape(s.kind, s.color, s.box, (1 + pair_class(s.color, s.kind), 1 + order.index(s), 0)) for s in order),
        background=(0, 0, 0),
    )
    grid = math.isqrt(N_QUERIES)
    step = PICTURE_SIZE // grid
    pixels = np.asarray(codes.render(PICTURE_SIZE))  # [S, S, 3]
    centres = pixels[step // 2 :: step, step // 2 :: step][:grid, :grid].astype(np.int64)  # [grid, grid, 3]
    shape, rank = centres[..., 0].reshape(-1), centres[..., 1].reshape(-1)  # [256] each
    bins = np.array([[IGNORE] * 4] + [box_bins(s.grid_box()) for s in order])  # [1 + shapes, 4]
    return shape, rank, bins[rank]


class Batch(dict):
    """One training step's tensors (see make_batch); `.to(device)` moves every tensor."""

    def to(self, device) -> Batch:
        """The same batch with every tensor on `device`."""
        return Batch({k: v.to(device, non_blocking=True) for k, v in self.items()})


def make_batch(tokenizer, conversations, image_size: int) -> Batch:
    """The tensors of a training step: right-padded `ids` [B, L], `mask`, `target_mask` (positions whose next token is
    an answer token) and `targets` [T]; `pixels` [N, 3, S, S] in the order of the image spans; at positions that
    predict an answer token, `asked` (the pair a which/where question named), `box` [B, L, 4] (the bins of the box a
    where answer gives) and `digit` (the coordinate digit predicted there), IGNORE elsewhere; per picture
    `patch_shape`, `patch_rank` [N, 256], `patch_box` [N, 256, 4], `held` [N, 12] (its pairs) and `shapes` [N]
    (its number of shapes, minus one); `pictures` [B], each row's number of pictures."""
    rows = [encode_conversation(tokenizer, turns) for turns in conversations]
    length = max(len(ids) for ids, _ in rows)
    batch = len(rows)
    ids = torch.full((batch, length), ENDOFTEXT_ID)
    mask = torch.zeros(batch, length, dtype=torch.long)
    target_mask = torch.zeros(batch, length, dtype=torch.bool)
    asked = torch.full((batch, length), IGNORE)
    box = torch.full((batch, length, 4), IGNORE)
    digit = torch.full((batch, length), IGNORE)
    digit_ids = {tokenizer.encode(str(d))[0]: d for d in range(10)}
    for b, ((seq, spans), turns) in enumerate(zip(rows, conversations)):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
        for (start, stop), turn in zip(spans, turns):
            target_mask[b, start - 1 : stop - 1] = True  # these positions predict answer tokens
            asked[b, start - 1 : stop - 1] = ASKED.get(turn.question, IGNORE)
            if "<box>" in turn.answer:
                [element] = to_list_format(turn.answer)
                box[b, start - 1 : stop - 1] = torch.tensor(box_bins(element["box"][0]))
                for p in range(start, stop):
                    digit[b, p - 1] = digit_ids.get(seq[p], IGNORE)
    targets = torch.roll(ids, -1, dims=1)[target_mask]
    scenes = [scene for turns in conversations for turn in turns for scene in turn.pictures]
    labels = [patch_labels(scene) for scene in scenes]
    held = torch.zeros(len(scenes), len(COLORS) * len(KINDS))
    for i, scene in enumerate(scenes):
        for s in scene.shapes:
            held[i, pair_class(s.color, s.kind)] = 1.0
    return Batch(
        ids=ids,
        mask=mask,
        target_mask=target_mask,
        targets=targets,
        pixels=preprocess_images([scene.render(PICTURE_SIZE) for scene in scenes], image_size),
        asked=asked,
        box=box,
        digit=digit,
        patch_shape=torch.from_numpy(np.stack([s for s, _, _ in labels])),
        patch_rank=torch.from_numpy(np.stack([r for _, r, _ in labels])),
        patch_box=torch.from_numpy(np.stack([b for _, _, b in labels])),
        held=held,
        shapes=torch.tensor([len(scene.shapes) - 1 for scene in scenes]),
        pictures=torch.tensor([sum(len(t.pictures) for t in turns) for turns in conversations]),
    )


@dataclass(frozen=True)
class StepBatches(torch.utils.data.Dataset):
    """The batches of one training stage, indexed by step: step k's batch depends only on (seed, stage, k).

    Stage "vision" gives single pictures (`patch_*` labels and pixels); the chat stages give chats, two pictures every
    `two_pictures_every`-th step, else one picture with every `no_picture_every`-th chat without one."""

    seed: int
    stage: str
    steps: int
    batch_size: int
    image_size: int
    two_pictures_every: int = 3
    no_picture_every: int = 8

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> Batch:
        rng = random.Random(f"{self.seed}/{self.stage}/{step}")
        if self.stage == "vision":
            scenes = [random_scene(rng) for _ in range(self.batch_size)]
            conversations = [[Turn((scene,), question("what", "en"), describe(scene))] for scene in scenes]
        else:
            two = step % self.two_pictures_every == self.two_pictures_every - 1  # batches of similar lengths
            conversations = [
                make_conversation(rng, 2 if two else 0 if k % self.no_picture_every == 1 else 1)
                for k in range(self.batch_size)
            ]
        return make_batch(_tokenizer(), conversations, self.image_size)


@functools.cache
def _tokenizer():
    """The shipped tokenizer, loaded once per process (worker processes load their own)."""
    return load_tokenizer()
