"""Tests for step 2: locating `img_pos` = (batch row, `<img>` index, `</img>` index) of every image span."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenvl_lab.img_pos import as_batch, locate_img_pos
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN

assert (IMAGE_START_ID, IMAGE_END_ID, IMG_TOKEN_SPAN) == (151857, 151858, 256)  # the reference's values


def span(fill: int = IMAGE_PAD_ID, length: int = IMG_TOKEN_SPAN, start: int = IMAGE_START_ID) -> list[int]:
    """`<img>` + `length` ids + `</img>`."""
    return [start, *[fill] * length, start + 1]


def trtllm_img_pos(input_ids: torch.Tensor, start: int = IMAGE_START_ID) -> torch.Tensor:
    """The construction of TensorRT-LLM's run.py (valid input only): stack(bos row, bos col, eos col)."""
    bos_pos = torch.where(input_ids == start)
    eos_pos = torch.where(input_ids == start + 1)
    assert torch.equal(bos_pos[0], eos_pos[0])
    return torch.stack((bos_pos[0], bos_pos[1], eos_pos[1]), dim=1)


def test_one_image():
    ids = [11, 22, *span(), 33]
    img_pos = locate_img_pos(torch.tensor(ids))
    assert img_pos.dtype == torch.int64
    assert img_pos.tolist() == [[0, 2, 2 + IMG_TOKEN_SPAN + 1]]


def test_several_images_in_one_sequence():
    ids = [1, *span(), 2, 3, *span(fill=65), *span()]
    second = 1 + 258 + 2
    assert locate_img_pos([ids]).tolist() == [[0, 1, 258], [0, second, second + 257], [0, second + 258, second + 515]]


def test_batch_with_rows_holding_zero_one_and_two_images():
    rows = [
        [*span(), *[7] * 259],  # one image first
        [5] * 517,  # no image
        [*span(), 9, *span()],  # two images
    ]
    img_pos = locate_img_pos(torch.tensor(rows))
    assert img_pos.tolist() == [[0, 0, 257], [2, 0, 257], [2, 259, 516]]
    assert torch.equal(img_pos, trtllm_img_pos(torch.tensor(rows)))


def test_no_image_gives_an_empty_n_by_3():
    img_pos = locate_img_pos(torch.arange(10).reshape(2, 5))
    assert img_pos.shape == (0, 3) and img_pos.dtype == torch.int64


def test_tags_of_each_span_are_at_the_reported_positions():
    ids = torch.tensor([[1, *span(), 2, *span()], [*span(), *span(), 3, 4]])
    for i, a, b in locate_img_pos(ids).tolist():
        assert ids[i, a] == IMAGE_START_ID and ids[i, b] == IMAGE_END_ID and b - a - 1 == IMG_TOKEN_SPAN


def test_accepts_lists_numpy_and_int32():
    ids = [3, *span(), 4]
    expected = [[0, 1, 258]]
    assert locate_img_pos(ids).tolist() == expected
    assert locate_img_pos(np.array([ids], dtype=np.int32)).tolist() == expected
    assert locate_img_pos(torch.tensor(ids, dtype=torch.int32)).tolist() == expected


def test_custom_image_start_id_and_span():
    ids = [0, 40, 1, 1, 1, 41, 2, 40, 5, 5, 5, 41]
    assert locate_img_pos(ids, image_start_id=40, span=3).tolist() == [[0, 1, 5], [0, 7, 11]]
    # the real tags mean nothing when another image_start_id is configured
    assert locate_img_pos([*span(), 1], image_start_id=40).shape == (0, 3)


@pytest.mark.parametrize(
    "ids, message",
    [
        ([1, IMAGE_START_ID, *[IMAGE_PAD_ID] * 256, 2], r"1 <img> .* but 0 </img>"),  # never closed
        ([1, *[IMAGE_PAD_ID] * 256, IMAGE_END_ID], r"0 <img> .* but 1 </img>"),  # never opened
        ([*span(), IMAGE_END_ID], r"1 <img> .* but 2 </img>"),  # one </img> too many
        ([IMAGE_END_ID, *[IMAGE_PAD_ID] * 256, IMAGE_START_ID], r"unbalanced or nested"),  # closed before opened
        ([IMAGE_START_ID, 1, IMAGE_START_ID, *[2] * 256, IMAGE_END_ID, 3, IMAGE_END_ID], r"unbalanced or nested"),
        (span(length=255), r"holds 255 ids.*exactly 256"),
        (span(length=257), r"holds 257 ids.*exactly 256"),
        ([*span(), *span(length=10)], r"holds 10 ids"),
    ],
    ids=["unclosed", "unopened", "extra-close", "close-before-open", "nested", "short", "long", "second-short"],
)
def test_malformed_spans_raise_clear_errors(ids, message):
    with pytest.raises(ValueError, match=message):
        locate_img_pos(torch.tensor([ids]))


def test_tags_split_across_rows_are_unbalanced():
    # each row alone is unbalanced even though the batch has one <img> and one </img>
    rows = torch.tensor([[1, IMAGE_START_ID, *[2] * 257], [*[2] * 257, IMAGE_END_ID, 3]])
    with pytest.raises(ValueError, match=r"row 0: 1 <img>"):
        locate_img_pos(rows)


def test_error_names_the_row():
    rows = torch.tensor([[*span(), 1, 1], [*span(length=258)]])
    with pytest.raises(ValueError, match=r"row 1: .*holds 258 ids"):
        locate_img_pos(rows)


def test_as_batch():
    assert as_batch([1, 2, 3]).shape == (1, 3)
    assert as_batch(torch.ones(2, 4, dtype=torch.int32)).dtype == torch.int64
    with pytest.raises(TypeError, match="input_ids must hold integers"):
        as_batch(torch.ones(3))
    with pytest.raises(TypeError, match="input_ids must hold integers"):
        as_batch(torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[L\] or \[B, L\]"):
        as_batch(torch.ones(1, 2, 3, dtype=torch.long))


@st.composite
def batches(draw):
    """A padded batch of 1–4 rows, each text ids interleaved with 0–3 well-formed image spans."""
    rows, expected = [], []
    for row in range(draw(st.integers(1, 4))):
        ids = []
        for _ in range(draw(st.integers(0, 3))):
            ids += draw(st.lists(st.integers(0, 151_000), max_size=4))
            expected.append((row, len(ids), len(ids) + IMG_TOKEN_SPAN + 1))
            ids += span(fill=draw(st.sampled_from([0, 255, IMAGE_PAD_ID, 151_936 + 7])))
        rows.append(ids + draw(st.lists(st.integers(0, 151_000), max_size=4)))
    length = max(map(len, rows))
    padded = [ids + [IMAGE_PAD_ID - 16] * (length - len(ids)) for ids in rows]
    return torch.tensor(padded).reshape(len(rows), length), expected


@settings(max_examples=50, deadline=None)
@given(batches())
def test_matches_the_span_layout_and_trtllm_construction(batch):
    ids, expected = batch
    img_pos = locate_img_pos(ids)
    assert img_pos.tolist() == [list(e) for e in expected]
    assert torch.equal(img_pos.reshape(-1, 3), trtllm_img_pos(ids).reshape(-1, 3))


def test_empty_ids():
    assert as_batch([]).shape == (1, 0) and as_batch([]).dtype == torch.int64
    assert locate_img_pos([]).shape == (0, 3)


@pytest.mark.parametrize("ids", ["abc", None, 3.5, {"ids": [1]}, b"\x01\x02"])
def test_input_of_a_wrong_type_says_what_it_takes(ids):
    with pytest.raises(
        TypeError,
        match=r"input_ids must be a torch tensor, a numpy array or a \(nested\) list of ints, "
        r"got (str|NoneType|float|dict|bytes)",
    ):
        locate_img_pos(ids)


@pytest.mark.parametrize(
    "ids, error, match",
    [
        ([[1, 2], [3]], ValueError, "rows of input_ids have different lengths: pad them"),
        ([1, 2**64], ValueError, "input_ids hold 18446744073709551616, outside int64"),
        (np.array([2**63], dtype=np.uint64), ValueError, "past the largest int64"),
        (["a", "b"], TypeError, "input_ids must hold integers, got numpy dtype <U1"),
        ([1, None], TypeError, "input_ids must hold integers, got numpy dtype object"),
        ([[1.0, 2.0]], TypeError, "input_ids must hold integers, got numpy dtype float64"),
        (torch.zeros(2, dtype=torch.complex64), TypeError, "input_ids must hold integers"),
    ],
)
def test_ids_that_are_not_int64_token_ids(ids, error, match):
    with pytest.raises(error, match=match):
        locate_img_pos(ids)


def test_tag_ids_and_span_must_be_ints():
    with pytest.raises(TypeError, match="image_start_id must be an int, got str"):
        locate_img_pos([1, 2], image_start_id="151857")
    with pytest.raises(ValueError, match="image_start_id must be an int in"):
        locate_img_pos([1, 2], image_start_id=2**63 - 1)  # its </img> id would not be an int64
    with pytest.raises(TypeError, match="span must be an int, got float"):
        locate_img_pos([1, 2], span=256.0)
    assert locate_img_pos(np.array([[1, 5, 2, 6]], dtype=np.uint8), image_start_id=5, span=1).tolist() == [[0, 1, 3]]
