"""Fuzzing the package: any input gives a correct result or a deliberate error with a message.

Two hypothesis profiles (tests/conftest.py): "ci" (the default: derandomized, the same examples on every machine,
about 30 s for this file) and "fuzz" (at least 10,000 random examples per property), chosen with the environment
variable HYPOTHESIS_PROFILE. A property is a function decorated
with `@fuzz(ci_examples)` whose body runs the call through `outcome(...)` and then checks a success against an oracle.
"""

import io
import json
import math
import os
import re
import shutil
import unicodedata
from datetime import timedelta

import numpy as np
import pytest
import torch
from conftest import time_limit
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image

from qwenvl_lab import grounding
from qwenvl_lab.checkpoint import TINY_CONFIG, CheckpointError, save_checkpoint
from qwenvl_lab.checks.tensors import as_batch, to_torch_dtype
from qwenvl_lab.course.widgets import picture_from_upload
from qwenvl_lab.engine import ModelRunner, build_engine, load_engine_vision_tower
from qwenvl_lab.fake_ids import replace_image_spans
from qwenvl_lab.grounding import to_list_format
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.limits import BuildConfig
from qwenvl_lab.modeling import QWenLMHeadModel, QWenVLConfig
from qwenvl_lab.pictures import load_image
from qwenvl_lab.prompt_table import prompt_tuning_embedding, ptuning_setup
from qwenvl_lab.requests import check_request
from qwenvl_lab.tokenizing import (
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    IMAGE_END_ID,
    IMAGE_PAD_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    MODEL_VOCAB_SIZE,
    Query,
    make_context,
)

# the deliberate errors of the package (compared by exact type: a subclass such as JSONDecodeError is a bug)
ALLOWED_ERRORS = (
    ValueError,
    TypeError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
    CheckpointError,
)
EXAMPLE_SECONDS = 20  # one example running longer counts as a hang

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")  # the profiles: tests/conftest.py
# damaged input is large and mostly refused: those health checks would stop a property for drawing it
_LARGE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def fuzz(ci_examples: int):
    """Settings of one property: the chosen profile, with `ci_examples` examples under "ci"."""
    profile = settings(settings.get_profile(PROFILE), suppress_health_check=_LARGE)
    return settings(profile, max_examples=ci_examples) if PROFILE == "ci" else profile


class Refused:
    """The deliberate error a call raised."""

    def __init__(self, error: Exception):
        self.error = error

    def __repr__(self):
        return f"Refused({type(self.error).__name__}: {self.error})"


def outcome(call, *args, **kwargs):
    """The call's result, or Refused(error) for a deliberate error with a message; any other exception fails."""
    with time_limit(EXAMPLE_SECONDS):
        try:
            result = call(*args, **kwargs)
        except ALLOWED_ERRORS as error:
            assert type(error) in ALLOWED_ERRORS, f"{type(error).__name__} is not a deliberate error: {error}"
            assert str(error).strip(), f"{type(error).__name__} without a message"
            event(f"{call.__name__}: {type(error).__name__}")
            return Refused(error)
    event(f"{call.__name__}: result")
    return result


def refused(result) -> bool:
    return isinstance(result, Refused)


def mostly(valid, other):
    """Draw from `valid` three times in four, else from `other` (so that both outcomes are common)."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda pick_valid: valid if pick_valid else other)


# tokenizing: plain text, element lists, the chatml context

TRICKY = st.sampled_from(
    [
        "<img>",
        "</img>",
        "<imgpad>",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<ref>",
        "<|extra_7|>",
        "\n",
        "\r\n",
        "e\u0301",
        "\ufb01",
        "\u212b",
        " " * 9,
        "\t",
        "\u3000",
        "'s",
        "\x00",
        "\U0001f600",
    ]
)
UTF8_TEXT = st.lists(st.one_of(st.text(max_size=10), TRICKY), max_size=8).map("".join)  # st.text holds no surrogates
TEXT = mostly(UTF8_TEXT, st.lists(st.one_of(UTF8_TEXT, st.just("\ud800")), max_size=3).map("".join))


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


@pytest.mark.filterwarnings("ignore:.*as plain text")  # typed <img>…</img> warns (test_chat.py)
@fuzz(350)
@given(text=TEXT)
def test_plain_text_never_gives_special_ids(tokenizer, text):
    ids = outcome(tokenizer.encode, text)
    if has_surrogate(text):  # UTF-8 cannot hold it
        assert refused(ids) and type(ids.error) is ValueError
        return
    assert all(0 <= i < ENDOFTEXT_ID for i in ids)
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
    assert tokenizer.encode_query(tokenizer.from_list_format([{"text": text}])) == ids
    raw_text, context = make_context(tokenizer, text)
    assert [i for i in context if i >= ENDOFTEXT_ID] == [IM_START_ID, IM_END_ID, IM_START_ID, IM_END_ID, IM_START_ID]
    assert tokenizer.decode(context) == raw_text


PATH = st.text(min_size=1, max_size=40).filter(lambda p: len(p.encode("utf-8")) <= 256)
VALID_ELEMENT = st.one_of(
    st.builds(lambda p: {"image": p}, PATH),
    st.builds(lambda t: {"text": t}, UTF8_TEXT),
    st.builds(
        lambda b, r: {"box": b, "ref": r},
        st.lists(st.tuples(*[st.integers(0, 1000)] * 4), max_size=2),
        st.text(max_size=6),
    ),
    st.builds(lambda b: {"box": b}, st.lists(st.lists(st.integers(0, 1000), min_size=4, max_size=4), max_size=2)),
)


@fuzz(180)
@given(elements=st.lists(VALID_ELEMENT, max_size=5), history_turns=st.integers(0, 2))
def test_valid_element_lists_encode(tokenizer, elements, history_turns):
    query = outcome(tokenizer.from_list_format, elements)
    assert isinstance(query, Query)
    ids = tokenizer.encode_query(query)
    assert tokenizer.decode(ids) == query
    paths = [unicodedata.normalize("NFC", e["image"]) for e in elements if "image" in e]  # as Qwen-VL writes them
    assert query.images == tuple(paths)
    assert ids.count(IMAGE_START_ID) == ids.count(IMAGE_END_ID) == len(paths)
    assert len(locate_img_pos(ids)) == len(paths)
    history = [(query, "ok")] * history_turns
    raw_text, context = make_context(tokenizer, query, history=history)
    assert tokenizer.decode(context) == raw_text
    assert context.count(IMAGE_START_ID) == len(paths) * (history_turns + 1)


QWEN_ANSWER_TAGS = {"<ref>", "</ref>", "<box>", "</box>", "<quad>", "</quad>"}  # Qwen-VL's IMAGE_ST but the image tags
ANSWER_TEXT = st.lists(
    st.one_of(st.text(max_size=6), TRICKY, st.sampled_from([*QWEN_ANSWER_TAGS, "(1,2),(3,4)", "\u0338", ">"])),
    max_size=10,
).map("".join)


@fuzz(300)
@given(answer=ANSWER_TEXT, question=UTF8_TEXT)
def test_history_answers_are_encoded_by_qwen_vls_rule(tokenizer, answer, question):
    # Qwen-VL's make_context: tokenizer.encode(NFC(answer), allowed_special=IMAGE_ST), other special tokens as text;
    # here its image tags stay text too (no text may create an image span)
    result = outcome(make_context, tokenizer, "next?", history=[(question, answer)])
    assert not refused(result), result
    empty = make_context(tokenizer, "next?", history=[(question, "")])[1]
    k = [i for i, t in enumerate(empty) if t == IM_END_ID][2]  # ends: the system's, the question's, the answer's
    qwen = tokenizer.encoding.encode(
        unicodedata.normalize("NFC", answer), allowed_special=QWEN_ANSWER_TAGS, disallowed_special=()
    )
    assert result[1] == empty[:k] + qwen + empty[k:]


ANY_VALUE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 1005),
        st.integers(),
        st.floats(),
        st.text(max_size=6),
        TRICKY,
        st.binary(max_size=4),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner, inner, inner),
        st.dictionaries(st.sampled_from(["image", "text", "box", "ref"]), inner, max_size=3),
    ),
    max_leaves=12,
)
HASHABLE = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4), st.binary(max_size=2))
ANY_ELEMENT = mostly(
    VALID_ELEMENT,
    st.one_of(
        st.dictionaries(st.sampled_from(["image", "text", "box", "ref", "Image", "x"]), ANY_VALUE, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(["image", "text", "box", "ref"]), HASHABLE), ANY_VALUE, max_size=2),
        ANY_VALUE,
    ),
)


@fuzz(350)
@given(list_format=mostly(st.lists(ANY_ELEMENT, max_size=4), ANY_VALUE))
def test_any_element_list_gives_a_query_or_a_clear_error(tokenizer, list_format):
    query = outcome(tokenizer.from_list_format, list_format)
    if refused(query):
        return
    assert isinstance(query, Query)
    ids = outcome(tokenizer.encode_query, query)
    if refused(ids):  # text that UTF-8 cannot hold
        assert type(ids.error) is ValueError and has_surrogate(query)
        return
    assert tokenizer.decode(ids) == query
    assert ids.count(IMAGE_START_ID) == len(query.images)


@fuzz(280)
@given(
    query=st.one_of(TEXT, st.lists(VALID_ELEMENT, max_size=3)),
    history=mostly(st.lists(st.tuples(TEXT, TEXT), max_size=2), ANY_VALUE),
    system=mostly(TEXT, ANY_VALUE),
    window=mostly(st.integers(1, 100), st.one_of(st.integers(), ANY_VALUE)),
)
def test_make_context_on_any_arguments(tokenizer, query, history, system, window):
    if isinstance(query, list):
        query = tokenizer.from_list_format(query)
    result = outcome(make_context, tokenizer, query, history=history, system=system, max_window_size=window)
    if refused(result):
        turns = isinstance(history, list) and all(isinstance(t, tuple) and len(t) == 2 for t in history)
        texts = [query, system, *(t for turn in history for t in turn)] if turns else []
        valid = (
            turns
            and isinstance(system, str)
            and type(window) is int
            and window > 0
            and all(isinstance(t, str) and not has_surrogate(t) for t in texts)
        )
        assert not valid, f"a valid context was refused: {result}"
        return
    raw_text, context = result
    assert isinstance(raw_text, Query) and tokenizer.decode(context) == raw_text
    assert context[-3:] == [IM_START_ID, *tokenizer.encode("assistant\n")]


# pictures: damaged files of every format Pillow reads, with and without EXIF orientation


def picture_bytes(fmt: str) -> bytes:
    """A small picture saved as `fmt` (a JPEG with an EXIF orientation tag, a 16-bit greyscale PNG)."""
    pixels = np.random.default_rng(0).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    picture, options = Image.fromarray(pixels), {}
    if fmt == "JPEG":
        exif = Image.Exif()
        exif[0x0112] = 6
        options["exif"] = exif
    if fmt == "PNG16":
        picture, fmt = Image.fromarray(pixels[..., 0].astype(np.uint16) * 257), "PNG"
    if fmt == "GIF":
        picture = picture.convert("P")
    out = io.BytesIO()
    picture.save(out, fmt, **options)
    return out.getvalue()


PICTURES = {fmt: picture_bytes(fmt) for fmt in ("PNG", "PNG16", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM")}


@pytest.fixture(scope="module")
def picture_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-pictures") / "picture"


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow's notes on the damaged EXIF and TIFF tags it skips
@fuzz(300)
@given(
    fmt=st.sampled_from(sorted(PICTURES)),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=4),
    cut=mostly(st.none(), st.floats(0, 1)),
    exif_transpose=st.booleans(),
)
def test_load_image_on_damaged_files(picture_file, fmt, edits, cut, exif_transpose):
    data = bytearray(PICTURES[fmt])
    for where, value in edits:
        data[int(where * len(data))] = value
    picture_file.write_bytes(bytes(data if cut is None else data[: int(cut * len(data))]))
    img = outcome(load_image, picture_file, exif_transpose=exif_transpose)
    if not refused(img):
        assert img.mode == "RGB" and np.asarray(img).dtype == np.uint8
    elif not edits and cut is None:
        raise AssertionError(f"an intact {fmt} picture was refused: {img}")


# img_pos and fake ids: any ids, any positions

SPECIAL_IDS = st.sampled_from(
    [IMAGE_START_ID, IMAGE_END_ID, IMAGE_PAD_ID, 0, 255, MODEL_VOCAB_SIZE, -1, 2**63 - 1, -(2**63), 2**31]
)


@st.composite
def id_rows(draw, max_rows=3, clean=False):
    """Rows of text ids and image spans; unless clean, with odd ids and a little damage (tags moved, dropped, added)."""
    text_ids = st.integers(0, 151_000) if clean else st.one_of(st.integers(0, 151_000), SPECIAL_IDS)
    rows = []
    for _ in range(draw(st.integers(0, max_rows))):
        row = []
        for _ in range(draw(st.integers(0, 3))):
            row += draw(st.lists(text_ids, max_size=3))
            if draw(st.booleans()):
                row += [IMAGE_START_ID, *[IMAGE_PAD_ID] * IMG_TOKEN_SPAN, IMAGE_END_ID]
        for _ in range(0 if clean else draw(mostly(st.just(0), st.integers(1, 2)))):  # damage
            if row and draw(st.booleans()):
                row[draw(st.integers(0, len(row) - 1))] = draw(SPECIAL_IDS)
            else:
                row.insert(draw(st.integers(0, len(row))), draw(SPECIAL_IDS))
        rows.append(row)
    return rows


@st.composite
def any_ids(draw):
    """Ids as a torch tensor of any dtype, a numpy array, (ragged) lists, or something else entirely."""
    rows = draw(id_rows())
    if not draw(mostly(st.just(True), st.booleans())):
        return draw(ANY_VALUE)
    if draw(mostly(st.just(True), st.just(False))):  # pad to a rectangle
        width = max(map(len, rows), default=0)
        rows = [r + [IMAGE_PAD_ID - 16] * (width - len(r)) for r in rows]
        if draw(st.booleans()) and len(rows) == 1:
            rows = rows[0]  # one sequence
    kind = draw(st.sampled_from(["list", "tensor", "tensor", "numpy"]))
    if kind == "list":
        return rows
    try:
        values = torch.tensor(rows, dtype=torch.long)  # rectangular rows within int64
    except (ValueError, RuntimeError, TypeError, OverflowError):
        return rows
    dtype = draw(
        mostly(
            st.sampled_from([torch.int64, torch.int32]),
            st.sampled_from([torch.int16, torch.uint8, torch.float32, torch.bool]),
        )
    )
    values = values.to(dtype)
    return values if kind == "tensor" else values.numpy()


def check_img_pos(ids: torch.Tensor, img_pos: torch.Tensor, start: int, span: int) -> None:
    """img_pos lists exactly the well-formed spans of ids, in order."""
    assert img_pos.dtype == torch.int64 and img_pos.dim() == 2 and img_pos.shape[1] == 3
    assert len(img_pos) == int((ids == start).sum()) == int((ids == start + 1).sum())
    assert img_pos.tolist() == sorted(img_pos.tolist())
    for i, a, b in img_pos.tolist():
        assert ids[i, a] == start and ids[i, b] == start + 1 and b - a - 1 == span


@fuzz(320)
@given(
    ids=any_ids(),
    custom=st.one_of(
        st.none(), st.tuples(st.one_of(st.integers(-1, 300), ANY_VALUE), st.one_of(st.integers(-1, 3), ANY_VALUE))
    ),
)
def test_locate_img_pos_on_any_ids(ids, custom):
    start, span = (IMAGE_START_ID, IMG_TOKEN_SPAN) if custom is None else custom
    img_pos = outcome(locate_img_pos, ids, start, span)
    if not refused(img_pos):
        check_img_pos(as_batch(ids), img_pos, start, span)


@fuzz(100)
@given(rows=id_rows(clean=True), dtype=st.sampled_from([torch.int64, torch.int32, np.int64, list]))
def test_locate_img_pos_finds_every_well_formed_span(rows, dtype):
    width = max(map(len, rows), default=0)
    rows = [r + [0] * (width - len(r)) for r in rows]
    ids = (
        rows
        if dtype is list
        else np.array(rows, dtype=np.int64)
        if dtype is np.int64
        else torch.tensor(rows, dtype=dtype).reshape(len(rows), width)
    )
    img_pos = outcome(locate_img_pos, ids)
    assert not refused(img_pos), img_pos
    check_img_pos(
        torch.tensor(rows, dtype=torch.long).reshape(len(rows), width), img_pos, IMAGE_START_ID, IMG_TOKEN_SPAN
    )


POSITION = st.one_of(st.integers(-3, 270), st.sampled_from([2**63 - 1, -(2**63)]))


@fuzz(280)
@given(rows=id_rows(max_rows=2), data=st.data())
def test_replace_image_spans_on_any_positions(rows, data):
    width = max(map(len, rows), default=0)
    ids = torch.tensor([r + [7] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)
    found = outcome(locate_img_pos, ids)
    if not refused(found) and data.draw(st.booleans()):
        img_pos = found
    else:
        img_pos = data.draw(
            st.one_of(
                st.lists(st.lists(POSITION, min_size=3, max_size=3), max_size=3),
                st.lists(st.lists(POSITION, max_size=4), max_size=2),
                ANY_VALUE,
            )
        )
    n, s = data.draw(st.integers(0, 3)), data.draw(st.sampled_from([IMG_TOKEN_SPAN, IMG_TOKEN_SPAN - 1, 0, 1]))
    fake = MODEL_VOCAB_SIZE + torch.arange(n * s).reshape(n, s)
    fake = data.draw(st.sampled_from([fake, fake.int(), fake.float(), fake.reshape(-1), fake.tolist()]))
    out = outcome(replace_image_spans, ids, img_pos, fake)
    if refused(out):
        return
    positions = torch.as_tensor(img_pos, dtype=torch.long).reshape(-1, 3).tolist()
    if not positions:
        assert torch.equal(out, ids)
        return
    fake = torch.as_tensor(fake).long().reshape(len(positions), -1)
    inside = torch.zeros_like(ids, dtype=torch.bool)
    for k, (i, a, b) in enumerate(positions):
        assert 0 <= i < ids.shape[0] and 0 <= a < b < ids.shape[1] and not inside[i, a : b + 1].any()
        assert torch.equal(out[i, a + 1 : b], fake[k]) and out[i, a] == ids[i, a] and out[i, b] == ids[i, b]
        inside[i, a + 1 : b] = True
    assert torch.equal(out[~inside], ids[~inside])


# the prompt table: ptuning_setup and the lookup, with NaN, inf, negative, huge and mistyped inputs

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
POISON = st.sampled_from([math.nan, math.inf, -math.inf, 1e5, -7e4, 1e39, 0.5])


@st.composite
def features(draw, dims, dtype=None):
    """A small float tensor of the given shape with a few values poisoned (NaN, inf, past float16's range)."""
    values = torch.randn(
        *dims, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16))), dtype=torch.float64
    )
    if values.numel() and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 2))):
            values.view(-1)[draw(st.integers(0, values.numel() - 1))] = draw(POISON)
    dtypes = st.sampled_from(FLOAT_DTYPES) if dtype is None else st.just(dtype)
    return values.to(draw(mostly(dtypes, st.sampled_from(FLOAT_DTYPES + [torch.int64]))))


@fuzz(320)
@given(data=st.data())
def test_ptuning_setup_on_any_features(data):
    n, s, h = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 4)), data.draw(st.integers(1, 4))
    input_vit = data.draw(mostly(features((n, s, h)), st.one_of(features((s, h)), st.none(), ANY_VALUE)))
    hidden = data.draw(mostly(st.just(h), st.one_of(st.integers(-1, 5), st.just(str(h)), st.just(float(h)), ANY_VALUE)))
    dtype = data.draw(
        mostly(
            st.sampled_from(["float32", "float16", "bfloat16", torch.float16]), st.one_of(st.just("fp16"), ANY_VALUE)
        )
    )
    batch = data.draw(st.integers(1, 3))
    ids = data.draw(mostly(st.one_of(st.none(), st.just(torch.zeros(batch, 2, dtype=torch.long))), any_ids()))
    tasks = data.draw(
        mostly(
            st.one_of(
                st.none(),
                st.lists(st.integers(0, 3), min_size=batch, max_size=batch).map(lambda t: ",".join(map(str, t))),
            ),
            st.one_of(
                st.lists(st.integers(-1, 2**40), min_size=1, max_size=3).map(lambda t: ",".join(map(str, t))),
                TEXT,
                ANY_VALUE,
            ),
        )
    )
    result = outcome(ptuning_setup, input_vit, dtype, hidden, tasks, ids)
    if refused(result):
        valid = (
            isinstance(input_vit, torch.Tensor)
            and input_vit.is_floating_point()
            and input_vit.dim() == 3
            and type(hidden) is int
            and input_vit.shape[2] == hidden
            and tasks is None
            and str(dtype) in ("float32", "float16", "bfloat16", "torch.float16")
            and (ids is None or isinstance(ids, torch.Tensor) and ids.dtype == torch.long and ids.dim() == 2)
            and bool(torch.isfinite(input_vit).all())
            and bool(torch.isfinite(input_vit.to(to_torch_dtype(dtype))).all())
        )
        assert not valid, f"valid features were refused: {result}"
        return
    table, task_ids, task_vocab_size = result
    assert table.dtype == to_torch_dtype(dtype) and table.shape[1] == hidden and task_ids.dtype == torch.int32
    if input_vit is not None:
        assert input_vit.is_floating_point() and torch.isfinite(input_vit).all() and torch.isfinite(table).all()
        assert torch.equal(table, input_vit.reshape(-1, hidden).to(table.dtype))
        assert task_vocab_size.tolist() == [input_vit.shape[1]]
    if tasks is None:
        expected_tasks = [0] * (1 if ids is None else as_batch(ids).shape[0])
    elif isinstance(tasks, str):
        expected_tasks = [int(t) for t in tasks.split(",")]
    else:
        expected_tasks = torch.as_tensor(tasks).reshape(-1).tolist()
    assert task_ids.tolist() == expected_tasks and min(expected_tasks, default=0) >= 0


def reference_rows(ids, tasks, tvs, vocab_size, table):
    """Per id: ("vocab", id) or ("table", row) in exact integers; None when the lookup must be refused."""
    plan = []
    for b, row in enumerate(ids):
        for t in row:
            if t < 0:
                return None
            if t < vocab_size:
                plan.append(("vocab", t))
                continue
            r = (t - vocab_size) + tasks[b] * tvs
            if not 0 <= r < table.shape[0] or not torch.isfinite(table[r]).all():
                return None
            plan.append(("table", r))
    return plan


@fuzz(350)
@given(data=st.data())
def test_prompt_tuning_embedding_on_any_lookup(data):
    vocab_size, hidden, rows = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 3)), data.draw(st.integers(0, 8))
    batch, length = data.draw(st.integers(1, 3)), data.draw(st.integers(0, 4))
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES))
    vocab = torch.randn(vocab_size + data.draw(st.integers(0, 2)), hidden, dtype=torch.float64).to(dtype)
    table = data.draw(features((rows, hidden), dtype))
    ids = data.draw(
        st.lists(
            st.lists(
                mostly(
                    st.integers(0, vocab_size + rows - 1),
                    st.one_of(st.integers(-1, vocab_size + rows + 4), st.sampled_from([2**63 - 1, 2**62])),
                ),
                min_size=length,
                max_size=length,
            ),
            min_size=batch,
            max_size=batch,
        )
    )
    tasks = data.draw(
        st.lists(
            mostly(st.integers(0, 1), st.one_of(st.integers(-1, 4), st.just(2**62))), min_size=batch, max_size=batch
        )
    )
    tvs = data.draw(mostly(st.integers(0, 2), st.one_of(st.integers(-2, 5), st.just(2**62))))
    size = data.draw(mostly(st.just(vocab_size), st.integers(-1, vocab_size + 3)))
    tasks_kind = data.draw(mostly(st.sampled_from(["list", "tensor"]), st.just("float tensor")))
    tvs_kind = data.draw(mostly(st.sampled_from(["int", "tensor"]), st.sampled_from(["float", "two values"])))
    ids_kind = data.draw(mostly(st.sampled_from(["tensor", "list", "numpy int32"]), st.just("float tensor")))
    shape_kind = data.draw(mostly(st.just("right"), st.sampled_from(["table too wide", "table 3-D", "vocab 1-D"])))
    tasks_arg = {"list": tasks, "tensor": torch.tensor(tasks), "float tensor": torch.tensor(tasks, dtype=torch.float32)}
    tvs_arg = {"int": tvs, "tensor": torch.tensor([tvs]), "float": float(tvs), "two values": torch.tensor([tvs, tvs])}
    ids_tensor = torch.tensor(ids, dtype=torch.long).reshape(batch, length)
    ids_arg = {
        "tensor": ids_tensor,
        "list": ids,
        "float tensor": ids_tensor.double(),
        "numpy int32": ids_tensor.numpy().astype(np.int32) if all(abs(i) < 2**31 for row in ids for i in row) else ids,
    }
    table_arg = {"table too wide": table.repeat(1, 2), "table 3-D": table[None]}.get(shape_kind, table)
    vocab_arg = vocab.reshape(-1) if shape_kind == "vocab 1-D" else vocab
    out = outcome(
        prompt_tuning_embedding, ids_arg[ids_kind], vocab_arg, table_arg, tasks_arg[tasks_kind], tvs_arg[tvs_kind], size
    )
    well_typed = (
        table.dtype == dtype
        and tasks_kind != "float tensor"
        and tvs_kind in ("int", "tensor")
        and (ids_kind != "float tensor" or length == 0)
        and shape_kind == "right"
    )  # no ids: any dtype
    in_range = 1 <= size <= len(vocab) and 0 <= min(tasks) and max(tasks) < 2**31 and 0 <= tvs < 2**31  # int32
    plan = reference_rows(ids, tasks, tvs, size, table) if in_range else None
    if refused(out):
        assert not well_typed or plan is None, f"a valid lookup was refused: {out}"
        return
    assert well_typed and plan is not None, "an invalid lookup was accepted"
    flat = out.reshape(-1, hidden)
    assert out.shape == (batch, length, hidden) and out.dtype == dtype
    for k, (source, r) in enumerate(plan):
        assert torch.equal(flat[k], vocab[r] if source == "vocab" else table[r])


# the runners' one request check (the engine's ModelRunner and TRTLLMRunner share it)

SMALL_V, SMALL_H = 50, 4  # a vocabulary and hidden size small enough to reason about every id
LIMITS = BuildConfig(
    max_batch_size=3, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=768, max_beam_width=2
)


def expected_rows(ids, table, tasks, tvs, per_task):
    """The table row of every fake id (request, position) if the request is valid, else None."""
    reads = []
    for seq, task in zip(ids, tasks):
        for i in seq:
            if i >= SMALL_V:
                row = i - SMALL_V
                if per_task and row >= tvs:
                    return None
                if row + task * tvs >= len(table):
                    return None
                reads.append(row + task * tvs)
    return reads


@fuzz(300)
@given(data=st.data())
def test_check_request_on_any_request(data):
    batch = data.draw(st.integers(1, 4))
    rows = data.draw(st.sampled_from([0, 1, 2, 256, 300]))
    per_task = data.draw(st.booleans())
    tables = data.draw(st.integers(1, 3))
    tvs = data.draw(mostly(st.integers(1, max(rows, 1)), st.integers(-1, 400)))
    in_flight = data.draw(st.booleans())
    ids = data.draw(
        st.lists(
            st.lists(
                mostly(st.integers(0, SMALL_V + rows + 2), st.sampled_from([-1, 2**31, 2**32 + SMALL_V + 3, 2**62])),
                min_size=1,
                max_size=6,
            ),
            min_size=batch,
            max_size=batch,
        )
    )
    tasks = data.draw(st.lists(st.integers(-1, 3), min_size=batch, max_size=batch))
    task_form = data.draw(mostly(st.sampled_from(["string", "list", "default"]), st.just("garbage")))
    max_new = data.draw(mostly(st.integers(1, 20), st.sampled_from([0, -3, 2.5, None, True, 10**6])))
    beams = data.draw(mostly(st.integers(1, 2), st.sampled_from([0, 3, "2"])))
    end_id = data.draw(mostly(st.integers(-1, SMALL_V - 1), st.sampled_from([SMALL_V, -2, 1.0])))
    value = data.draw(mostly(st.just(0.5), st.sampled_from([float("nan"), float("inf")])))
    dtype = data.draw(mostly(st.just(torch.float32), st.just(torch.float16)))
    shape = (tables, rows, SMALL_H) if per_task else (tables * max(rows, 1), SMALL_H)
    table = None if rows == 0 else torch.full(shape, value, dtype=dtype)
    prompt_tasks = {"string": ",".join(map(str, tasks)), "list": tasks, "default": None, "garbage": "a,b"}[task_form]
    out = outcome(
        check_request,
        LIMITS,
        SMALL_V,
        SMALL_H,
        [torch.tensor(s) for s in ids],
        table,
        prompt_tasks,
        None if per_task else tvs,
        max_new,
        beams,
        end_id,
        0,
        in_flight,
    )
    if refused(out):
        return
    # accepted: every limit held, every id lies below vocab_size + the rows it may read
    assert len(ids) <= LIMITS.max_batch_size and isinstance(max_new, int) and not isinstance(max_new, bool)
    assert 1 <= max_new and all(len(s) + max_new <= LIMITS.max_seq_len for s in ids)
    assert beams in (1, 2) and -1 <= end_id < SMALL_V and isinstance(end_id, int)
    assert all(0 <= i for s in ids for i in s) and all(o.dtype == torch.int64 for o in out.ids)
    assert [o.tolist() for o in out.ids] == ids  # no id was cast or wrapped
    if table is None:
        assert all(i < SMALL_V for s in ids for i in s)
        return
    assert math.isfinite(value) and dtype == torch.float32 and task_form != "garbage"
    flat_tvs = rows if per_task else tvs
    reads = expected_rows(ids, out.table, out.tasks, flat_tvs, per_task)
    assert reads is not None, "a fake id past its table was accepted"
    assert all(0 <= t for t in out.tasks) and out.task_vocab_size == flat_tvs
    if in_flight:
        assert out.own_tables().shape[1] <= LIMITS.rows_per_request
    else:
        assert out.table.shape[0] <= LIMITS.max_prompt_embedding_table_size


# engine directories: a deleted, truncated or edited file is refused, never loaded


@pytest.fixture(scope="module")
def small_engine(tmp_path_factory):
    """A small engine directory (a 1000-id vocabulary) to damage copies of."""

    torch.manual_seed(0)
    checkpoint = save_checkpoint(
        QWenLMHeadModel(QWenVLConfig(**{**TINY_CONFIG, "vocab_size": 1000})), tmp_path_factory.mktemp("small-ckpt")
    )
    assert json.loads((checkpoint / "config.json").read_text())["vocab_size"] == 1000
    return build_engine(
        checkpoint,
        tmp_path_factory.mktemp("small") / "engine",
        BuildConfig(max_batch_size=1, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=256),
    )


DAMAGES = ("delete", "truncate", "drop key", "mistype key", "empty", "change in place")


@fuzz(25)
@given(data=st.data())
def test_a_damaged_engine_directory_is_refused(small_engine, tmp_path_factory, data):

    engine = tmp_path_factory.mktemp("damaged") / "engine"
    shutil.copytree(small_engine, engine)
    files = sorted(  # the files a load reads (the package's marks say what it wrote, for replacing and deleting)
        p.relative_to(engine).as_posix() for p in engine.rglob("*") if p.is_file() and p.name != ".qwenvl-lab-made"
    )
    name = data.draw(st.sampled_from(files))
    kinds = DAMAGES if name.endswith(".json") else DAMAGES[:2] + DAMAGES[4:]
    if name == "manifest.json":  # the record of the files, not one of them: a tab for a space there changes nothing
        kinds = kinds[:-1]
    damage = data.draw(st.sampled_from(kinds))
    path = engine / name
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        kept = path.stat().st_size - (2 if name.endswith(".json") else 1)  # a JSON file's last newline is not data
        path.write_bytes(path.read_bytes()[: data.draw(st.integers(0, max(kept, 0)))])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "change in place":  # the same size: only the checksums can tell
        content = bytearray(path.read_bytes())
        if not content:
            return
        where = data.draw(st.integers(0, len(content) - 1))
        content[where] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(content))
    else:
        config = json.loads(path.read_text())
        keys = sorted(config) if isinstance(config, dict) else []
        if not keys:
            return
        key = data.draw(st.sampled_from(keys))
        if damage == "drop key":
            del config[key]
        else:
            config[key] = data.draw(st.sampled_from(["2", None, [], -1, 1e9, {"x": 1}]))
            if config[key] == json.loads(path.read_text())[key]:
                return
        path.write_text(json.dumps(config))
    event(f"{damage} {name}")

    def load(directory):
        return ModelRunner.from_dir(directory), load_engine_vision_tower(directory)

    out = outcome(load, engine)
    assert refused(out), f"an engine with {name} damaged ({damage}) was loaded"
    shutil.rmtree(engine.parent)


# grounding: plain text read in linear time, as the one-regex reading reads it

QWEN_TEXT_TAGS = re.compile(r"<img>(.*?)</img>|(<img>|</?ref>|</?box>)", re.DOTALL)  # nearest </img> closes an <img>
TAG_FRAGMENTS = ["<img>", "</img>", "<ref>", "</ref>", "<box>", "</box>", "(1,2),(3,4)", "a", "\n", "Picture 1: ", "<"]


def regex_pieces(text: str) -> list[tuple[str, str]]:
    """The pieces of text as one regex reads them (an unclosed <img> searches the rest of the text: quadratic)."""
    pieces, end = [], 0
    for m in QWEN_TEXT_TAGS.finditer(text):
        pieces += [("text", text[end : m.start()]), ("tag", m[2]) if m[2] else ("image", m[1])]
        end = m.end()
    return pieces + [("text", text[end:])]


@fuzz(300)
@given(text=st.lists(st.one_of(st.sampled_from(TAG_FRAGMENTS), st.text(max_size=4)), max_size=30).map("".join))
def test_text_is_read_as_the_regex_reads_it(text):
    assert grounding._text_pieces(text) == regex_pieces(text)


@pytest.mark.filterwarnings("ignore::UserWarning")  # strict=False warns about every malformed tag
@settings(fuzz(30), deadline=timedelta(seconds=3))  # linear: < 0.3 s for 100,000 characters; quadratic: > 9 s
@given(
    unit=st.lists(st.sampled_from(TAG_FRAGMENTS), min_size=1, max_size=6).map("".join),
    length=st.one_of(st.integers(1, 1000), st.integers(50_000, 100_000)),  # half the texts long
    strict=st.booleans(),
)
def test_reading_grounding_text_takes_linear_time(unit, length, strict):
    text = (unit * (length // len(unit) + 1))[:length]
    out = outcome(to_list_format, text, strict=strict)
    if refused(out):
        assert strict and type(out.error) is ValueError
    else:
        assert all(e.keys() in ({"text"}, {"image"}, {"ref"}, {"box"}, {"ref", "box"}) for e in out)


# pictures: an upload gives the pixels of the same file read from its path, in every mode Pillow reads

PICTURE_MODES = ("1", "L", "P", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "I", "F", "LA", "PA", "I;16", "I;16B")
PICTURE_FORMATS = ("PNG", "TIFF", "JPEG", "WEBP", "BMP", "GIF", "PPM", "TGA", "ICO", "JPEG2000", "PCX", "SGI")


def random_picture(mode: str, pixels: np.ndarray) -> Image.Image:
    """A picture in `mode` from random 16-bit samples [H, W, 3]."""
    if mode == "F":
        return Image.fromarray(pixels[..., 0].astype(np.float32) / 50000.0, mode="F")  # a few pixels past 1.0
    if mode == "I":
        return Image.fromarray(pixels[..., 0].astype(np.int32) * 2 - 20000, mode="I")  # negatives and past 65535
    if mode.startswith("I;16"):
        picture = Image.new(mode, pixels.shape[1::-1])
        picture.putdata(pixels[..., 0].reshape(-1).tolist())
        return picture
    return Image.fromarray((pixels >> 8).astype(np.uint8)).convert(mode)


def saves_and_reopens(mode: str, fmt: str) -> bool:
    out = io.BytesIO()
    try:
        random_picture(mode, np.zeros((2, 2, 3), dtype=np.uint16)).save(out, fmt)
        Image.open(io.BytesIO(out.getvalue())).load()
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


MODE_FORMATS = [(m, f) for m in PICTURE_MODES for f in PICTURE_FORMATS if saves_and_reopens(m, f)]


@fuzz(200)
@given(
    mode_format=st.sampled_from(MODE_FORMATS),
    size=st.tuples(st.integers(1, 24), st.integers(1, 24)),
    seed=st.integers(0, 2**32 - 1),
    exif_transpose=st.booleans(),
)
def test_an_upload_reads_as_the_file_from_its_path(picture_file, mode_format, size, seed, exif_transpose):

    mode, fmt = mode_format
    pixels = np.random.default_rng(seed).integers(0, 65536, (size[1], size[0], 3), dtype=np.uint16)
    out = io.BytesIO()
    random_picture(mode, pixels).save(out, fmt)
    data = out.getvalue()
    picture_file.write_bytes(data)
    from_path = outcome(load_image, picture_file, exif_transpose=exif_transpose)
    assert not refused(from_path), f"{mode} saved as {fmt}: {from_path}"
    event(f"{Image.open(io.BytesIO(data)).mode} read from {fmt}")
    expected = np.asarray(from_path)
    assert np.array_equal(np.asarray(load_image(data, exif_transpose=exif_transpose)), expected)
    assert np.array_equal(np.asarray(load_image(Image.open(io.BytesIO(data)), exif_transpose)), expected)
    if not exif_transpose:
        assert np.array_equal(np.asarray(picture_from_upload(({"content": memoryview(data)},))), expected)
