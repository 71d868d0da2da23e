"""Notebooks 01 and 02's exercise checks: right answers written in several ways pass, and the plausible wrong ones
(off by one, the wrong unit or convention, a weaker check) get a hint that does not give the answer away."""

import unicodedata

import pytest
import torch

from qwenvl_lab import load_tokenizer, locate_img_pos, make_context
from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import REGISTRY, check, nb01, nb02
from qwenvl_lab.tokenizing import (
    ENDOFTEXT_ID,
    IMAGE_END_ID,
    IMAGE_PAD_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    QWEN_VL_PATH_BYTES,
)


@pytest.fixture(autouse=True)
def only_these_notebooks(monkeypatch):
    """The checks of notebooks 01 and 02 only: the other notebooks' modules are not needed here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb01", "nb02"))


def test_every_exercise_is_registered_with_its_question():
    exercises._load()
    keys = {k for k in REGISTRY if k[:2] in ("01", "02")}
    assert keys == {"01.1", "01.2", "01.3", "02.1", "02.2", "02.3"}
    assert all(REGISTRY[k].question.strip() for k in keys)


# 01.1: answers


def span_of(path, limit=IMG_TOKEN_SPAN, unit=lambda p: p.encode("utf-8"), payload=None, pad=IMAGE_PAD_ID, size=None):
    """A learner's image span: refused past `limit` units (`unit` of the path), written from `payload` bytes (by
    default the NFC path's UTF-8 bytes, as Qwen-VL writes them)."""
    if len(unit(path)) > limit:
        raise ValueError("path too long")
    data = list(unicodedata.normalize("NFC", path).encode("utf-8")) if payload is None else payload(path)
    size = IMG_TOKEN_SPAN if size is None else size
    return [IMAGE_START_ID] + data + [pad] * (size - len(data)) + [IMAGE_END_ID]


def bytearray_span(path):
    """A right answer written otherwise: bytearray, a list comprehension, the padding counted from the end."""
    data = bytearray(unicodedata.normalize("NFC", path), "utf-8")
    if len(data) > IMG_TOKEN_SPAN:
        raise ValueError(f"{len(data)} bytes do not fit in a span")
    body = [b for b in data] + [IMAGE_PAD_ID for _ in range(IMG_TOKEN_SPAN - len(data))]
    return torch.tensor([IMAGE_START_ID, *body, IMAGE_END_ID])


def refuses_a_full_span(path):
    """Off by one: a path that exactly fills the span is refused."""
    if len(path.encode()) >= IMG_TOKEN_SPAN:
        raise ValueError("path too long")
    return span_of(path)


def index_error(path):
    return [IMAGE_START_ID] + list(path.encode())[300] + [IMAGE_END_ID]


# 02.1: answers


def pairs_in_order(input_ids):
    """The tags paired row by row, in order, in plain Python; no span's length checked (the old solution's rule)."""
    rows = []
    for i, row in enumerate(input_ids.tolist()):
        open_at = None
        for k, t in enumerate(row):
            if t == IMAGE_START_ID:
                if open_at is not None:
                    raise ValueError(f"row {i}: <img> at {k} opens inside the span from {open_at}")
                open_at = k
            elif t == IMAGE_END_ID:
                if open_at is None:
                    raise ValueError(f"row {i}: </img> at {k} closes no span")
                rows.append((i, open_at, k))
                open_at = None
        if open_at is not None:
            raise ValueError(f"row {i}: the span from {open_at} is not closed")
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 3)


def loop_locate(input_ids):
    """A right answer: the tags paired row by row in plain Python, each span's length checked."""
    img_pos = pairs_in_order(input_ids)
    if (img_pos[:, 2] - img_pos[:, 1] - 1 != IMG_TOKEN_SPAN).any():
        raise ValueError("a span does not hold 256 ids")
    return img_pos


def depth_locate(input_ids):
    """A right answer, vectorised: the number of open spans along each row must stay 0 or 1 and end at 0, and every
    span holds 256 ids."""
    starts, ends = input_ids == IMAGE_START_ID, input_ids == IMAGE_END_ID
    depth = starts.long().cumsum(1) - ends.long().cumsum(1)  # [B, L]
    if (depth < 0).any() or (depth > 1).any() or (depth[:, -1] != 0).any():
        raise ValueError("image tags do not pair up within a row")
    img_pos = torch.cat([torch.nonzero(starts), torch.nonzero(ends)[:, 1:]], dim=1).int()
    if (img_pos[:, 2] - img_pos[:, 1] != IMG_TOKEN_SPAN + 1).any():
        raise ValueError("a span does not hold 256 ids")
    return img_pos


def three_lines(input_ids):
    """Article 2's three lines."""
    bos_pos = torch.where(input_ids == IMAGE_START_ID)
    eos_pos = torch.where(input_ids == IMAGE_START_ID + 1)
    return torch.stack((bos_pos[0], bos_pos[1], eos_pos[1]), dim=1)


def run_py_check(input_ids):
    """run.py's check: as many tags of each kind in the batch, in the same rows."""
    bos_pos = torch.where(input_ids == IMAGE_START_ID)
    eos_pos = torch.where(input_ids == IMAGE_START_ID + 1)
    if len(bos_pos[0]) != len(eos_pos[0]) or not bool((bos_pos[0] == eos_pos[0]).all()):
        raise ValueError("unbalanced image tags")
    return three_lines(input_ids)


def row_count_check(input_ids):
    """As many <img> as </img> in each row; nothing about their order."""
    for i, row in enumerate(input_ids):
        if (row == IMAGE_START_ID).sum() != (row == IMAGE_END_ID).sum():
            raise ValueError(f"row {i}: unbalanced image tags")
    return three_lines(input_ids)


def forward_pairs_check(input_ids):
    """Counts per row and every </img> after its <img>; a span nested in another goes through."""
    img_pos = row_count_check(input_ids)
    if (img_pos[:, 2] < img_pos[:, 1]).any():
        raise ValueError("a </img> before its <img>")
    return img_pos


def span_length_check(input_ids):
    """Counts per row, every </img> after its <img>, every span 256 ids: overlapping spans of 256 ids go through."""
    img_pos = forward_pairs_check(input_ids)
    if (img_pos[:, 2] - img_pos[:, 1] != IMG_TOKEN_SPAN + 1).any():
        raise ValueError("a span that does not hold 256 ids")
    return img_pos


def at_least_256(input_ids):
    """The tags paired in order, a span refused only when it lost ids: a span with ids too many goes through."""
    img_pos = pairs_in_order(input_ids)
    if (img_pos[:, 2] - img_pos[:, 1] - 1 < IMG_TOKEN_SPAN).any():
        raise ValueError("a span lost ids")
    return img_pos


def sorted_by_position(input_ids):
    found = loop_locate(input_ids)
    return found[torch.argsort(found[:, 1], stable=True)]


TOKENIZER = load_tokenizer()
PAIR_IDS = make_context(TOKENIZER, TOKENIZER.from_list_format([{"image": p} for p in nb01.PAIR] + [{"text": "哪张?"}]))[
    1
]
PAIR_CONTEXT = nb01._pair_context()[2]  # the context 01.3 is checked on
PAIR_STARTS = [k for k, i in enumerate(PAIR_CONTEXT) if i == IMAGE_START_ID]
PAIR_ENDS = [k for k, i in enumerate(PAIR_CONTEXT) if i == IMAGE_END_ID]
RIGHT_PADDED = locate_img_pos(nb02.padded(nb02.THREE_CHATS, "right"))
LEFT_PADDED = locate_img_pos(nb02.padded(nb02.THREE_CHATS, "left"))
FEATURE_ROWS = sum(len(p) for p, _ in nb02.THREE_CHATS) * IMG_TOKEN_SPAN
CHINESE_MAX = QWEN_VL_PATH_BYTES // 3
SECRETS = {  # what a hint to a wrong answer must not show
    "01.1": [str(TOKENIZER.encode_image_span(p)[1:-1]) for p in nb01.SPAN_PATHS],
    "01.2": [str(CHINESE_MAX)],
    "01.3": [str(IMG_TOKEN_SPAN + 1)],
    "02.1": [str(LEFT_PADDED.tolist())],
    "02.2": [str(RIGHT_PADDED.tolist())],
    "02.3": [str(FEATURE_ROWS)],
}

CASES = [  # (exercise, answer, right?, words the hint must hold)
    ("01.1", span_of, True, ()),
    ("01.1", TOKENIZER.encode_image_span, True, ()),
    ("01.1", bytearray_span, True, ()),
    ("01.1", lambda p: span_of(p, limit=300), False, ["cannot be written into a span", "raise ValueError"]),
    ("01.1", lambda p: span_of(p, unit=str), False, ["only 86 characters", "UTF-8 bytes"]),
    ("01.1", refuses_a_full_span, False, ["raised ValueError, but the tokenizer writes it"]),
    ("01.1", lambda p: span_of(p, limit=QWEN_VL_PATH_BYTES), False, ["the tokenizer writes it", "stricter"]),
    ("01.1", lambda p: span_of(p, payload=lambda q: [ord(c) for c in q]), False, ["one id per character"]),
    ("01.1", lambda p: span_of(p, payload=lambda q: list(q.encode())), False, ["combining accent", "NFC"]),
    (
        "01.1",
        lambda p: span_of(p, payload=lambda q: list(unicodedata.normalize("NFKC", q).encode())),
        False,
        ["NFKC", "normalises to NFC"],
    ),
    ("01.1", lambda p: [IMAGE_START_ID] + TOKENIZER.encode(p) + [IMAGE_END_ID], False, ["does not run BPE"]),
    ("01.1", lambda p: span_of(p, size=len(p.encode())), False, ["same length whatever the path"]),
    ("01.1", lambda p: span_of(p, size=IMG_TOKEN_SPAN - 2), False, ["same length whatever the path"]),
    ("01.1", lambda p: span_of(p, pad=ENDOFTEXT_ID), False, ["padding", "its own special token"]),
    ("01.1", lambda p: span_of(p)[1:-1], False, ["tags belong to the span"]),
    ("01.1", lambda p: span_of(p) if len(p.encode()) < 100 else None, False, ["returned None"]),
    ("01.1", lambda p: " ".join(map(str, span_of(p))), False, ["list of ints"]),
    ("01.1", lambda p: None, False, ["not attempted yet"]),
    ("01.1", index_error, False, ["raised IndexError"]),
    (
        "01.1",
        lambda p: span_of(p) if len(p.encode()) <= IMG_TOKEN_SPAN else {}["x"],
        False,
        ["raise ValueError", "raised KeyError"],
    ),
    ("01.1", span_of("a"), False, ["the function itself"]),
    ("01.2", CHINESE_MAX, True, ()),
    ("01.2", IMG_TOKEN_SPAN // 3, False, ["reads the span without its last id"]),
    ("01.2", IMG_TOKEN_SPAN // 3 + 1, False, ["too many"]),
    ("01.2", CHINESE_MAX - 1, False, ["too few"]),
    ("01.2", QWEN_VL_PATH_BYTES, False, ["number of bytes"]),
    ("01.2", IMG_TOKEN_SPAN, False, ["number of bytes"]),
    ("01.2", 0, False, ["at least one"]),
    ("01.2", float(CHINESE_MAX), False, ["an int"]),
    ("01.3", lambda a: a + IMG_TOKEN_SPAN + 1, True, ()),
    ("01.3", lambda a: torch.tensor(a) + torch.tensor(IMG_TOKEN_SPAN + 1), True, ()),
    ("01.3", lambda a: a + IMG_TOKEN_SPAN, False, ["too early"]),
    ("01.3", lambda a: a + IMG_TOKEN_SPAN + 2, False, ["too far"]),
    ("01.3", lambda a: 276, False, ["count the ids between the tags"]),
    ("01.3", 276, False, ["check('01.3', my_end_position)"]),
    ("01.3", lambda a: dict(zip(PAIR_STARTS, PAIR_ENDS))[a], False, ["write it from a alone", "fixed length"]),
    ("01.3", lambda a: PAIR_CONTEXT.index(IMAGE_END_ID, a), False, ["write it from a alone", "fixed length"]),
    ("01.3", lambda a: a + IMG_TOKEN_SPAN + 1 if a < 500 else None, False, ["a = 1000", "from a alone"]),
    ("01.3", lambda a: None, False, ["not attempted yet"]),
    ("01.3", lambda a: float(a + IMG_TOKEN_SPAN + 1), False, ["an int"]),
    ("01.3", 276, False, ["the function itself"]),
    ("02.1", locate_img_pos, True, ()),
    ("02.1", loop_locate, True, ()),
    ("02.1", depth_locate, True, ()),
    ("02.1", three_lines, False, ["second </img> is missing", "raised RuntimeError", "raise a ValueError"]),
    ("02.1", run_py_check, False, ["comes before its <img>", "equal counts are not enough"]),
    ("02.1", row_count_check, False, ["comes before its <img>", "check the order too"]),
    ("02.1", forward_pairs_check, False, ["nested in another", "before the next <img> opens"]),
    ("02.1", span_length_check, False, ["two overlapping spans", "before the next <img> opens"]),
    ("02.1", pairs_in_order, False, ["lost 10 of its 256 ids", "check each span's length"]),
    ("02.1", at_least_256, False, ["10 ids more than 256", "exactly 256 ids"]),
    ("02.1", lambda ids: loop_locate(ids) + torch.tensor([0, 1, -1]), False, ["off by one", "</img> themselves"]),
    ("02.1", lambda ids: loop_locate(ids) + torch.tensor([0, 1, 0]), False, ["off by one"]),
    ("02.1", sorted_by_position, False, ["another order"]),
    ("02.1", lambda ids: loop_locate(ids).flip(1), False, ["row 0 of yours", "batch index"]),
    (
        "02.1",
        lambda ids: torch.tensor([tuple(r) for r in loop_locate(ids).tolist()]),
        False,
        ["without any picture", "two dimensions"],
    ),
    ("02.1", lambda ids: loop_locate(ids).float(), False, ["integer tensor"]),
    ("02.1", lambda ids: loop_locate(ids)[:, 1:], False, ["shape", "three numbers each"]),
    ("02.1", lambda ids: loop_locate(ids)[:1], False, ["row(s)"]),
    ("02.1", lambda ids: {}["row"], False, ["raised KeyError"]),
    ("02.1", lambda ids: loop_locate(ids) if ids.shape[0] == 1 else None, False, ["two pictures", "returned None"]),
    ("02.1", lambda ids: None, False, ["not attempted yet"]),
    ("02.2", RIGHT_PADDED, True, ()),
    ("02.2", RIGHT_PADDED.tolist(), True, ()),
    ("02.2", LEFT_PADDED, False, ["left-padded"]),
    ("02.2", RIGHT_PADDED[:3], False, ["one row per picture"]),
    ("02.2", RIGHT_PADDED + 1, False, ["where does each prompt start"]),
    ("02.2", RIGHT_PADDED.float(), False, ["integer tensor"]),
    ("02.2", "img_pos", False, ["tensor"]),
    ("02.3", FEATURE_ROWS, True, ()),
    ("02.3", FEATURE_ROWS // IMG_TOKEN_SPAN, False, ["counts the pictures"]),
    ("02.3", len(nb02.THREE_CHATS) * IMG_TOKEN_SPAN, False, ["every picture"]),
    ("02.3", FEATURE_ROWS // IMG_TOKEN_SPAN * (IMG_TOKEN_SPAN + 2), False, ["tags keep their own ids"]),
    ("02.3", FEATURE_ROWS + 1, False, ["as many rows as its span"]),
    ("02.3", float(FEATURE_ROWS), False, ["an int"]),
]


@pytest.mark.parametrize("key, answer, ok, words", CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(key, answer, ok, words, assert_verdict):
    assert_verdict(check(key, answer), ok, words, SECRETS[key])


def test_01_1_is_checked_at_the_span_boundary_in_bytes_and_characters():
    lengths = [len(p.encode()) for p in nb01.SPAN_PATHS]
    assert IMG_TOKEN_SPAN in lengths and IMG_TOKEN_SPAN - 1 in lengths  # the last bytes a span holds
    assert any(unicodedata.normalize("NFC", p) != p for p in nb01.SPAN_PATHS)  # a path Qwen-VL writes otherwise
    too_long = [(len(p), len(p.encode())) for p in nb01.TOO_LONG]
    assert (IMG_TOKEN_SPAN + 1, IMG_TOKEN_SPAN + 1) in too_long  # one byte past
    assert any(chars <= IMG_TOKEN_SPAN < size for chars, size in too_long)  # few characters, too many bytes
    for path in nb01.TOO_LONG:
        with pytest.raises(ValueError):
            TOKENIZER.encode_image_span(path)


def test_the_real_models_limit_is_where_its_slicing_still_finds_imgpad():
    """modeling_qwen.py: `input_ids[i][a + 1 : b - 1]`, then `.index(image_start_id + 2)`."""
    for size, readable in ((QWEN_VL_PATH_BYTES, True), (QWEN_VL_PATH_BYTES + 1, False), (IMG_TOKEN_SPAN, False)):
        ids = TOKENIZER.encode_image_span("x" * size)
        a, b = 0, len(ids) - 1
        assert (IMAGE_PAD_ID in ids[a + 1 : b - 1]) is readable


def test_02_1_is_checked_on_batches_that_fool_weaker_checks():
    batches = dict(nb02._batches())
    counts = {name: torch.bincount(locate_img_pos(b)[:, 0], minlength=len(b)).tolist() for name, b in batches.items()}
    assert [2] in [c[1:2] for c in counts.values()] and [0, 0] in counts.values() and [1, 0] in counts.values()
    for name, batch in nb02._broken_batches():
        with pytest.raises(ValueError):
            locate_img_pos(batch)
    fooled = {name for name, batch in nb02._broken_batches() if not raises(run_py_check, batch)}
    assert fooled == {
        "a row whose </img> comes before its <img>",
        "a row with one image span nested in another",
        "a row with two overlapping spans of 256 ids each",
        nb02.SHORT_SPAN,
        nb02.LONG_SPAN,
    }
    assert {name for name, batch in nb02._broken_batches() if not raises(pairs_in_order, batch)} == {
        nb02.SHORT_SPAN,
        nb02.LONG_SPAN,
    }
    assert not raises(
        span_length_check, dict(nb02._broken_batches())["a row with two overlapping spans of 256 ids each"]
    )


def raises(function, batch) -> bool:
    try:
        function(batch)
    except ValueError:
        return True
    return False
