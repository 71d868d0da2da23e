"""Tests for step 2: locating `img_pos` = (batch row, `<img>` index, `</img>` index) of every image span."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN

assert (IMAGE_START_ID, IMAGE_END_ID, IMG_TOKEN_SPAN) == (151857, 151858, 256)  # the reference's values


def span(fill: int = IMAGE_PAD_ID, length: int = IMG_TOKEN_SPAN, start: int = IMAGE_START_ID) -> list[int]:
    """`<img>` + `length` ids + `</img>`."""
    return [start, *[fill] * length, start + 1]


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
def test_matches_the_span_layout(batch):
    ids, expected = batch
    img_pos = locate_img_pos(ids)
    assert img_pos.tolist() == [list(e) for e in expected]


def test_empty_ids():
    assert locate_img_pos([]).shape == (0, 3)


def test_a_start_id_of_another_model():
    assert locate_img_pos(np.array([[1, 5, 2, 6]], dtype=np.uint8), image_start_id=5, span=1).tolist() == [[0, 1, 3]]
