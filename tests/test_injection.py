"""Tests for the three ways of putting image features into the sequence: overwrite, masked scatter, prompt table."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.injection import masked_scatter_images, overwrite_image_spans
from qwenvl_lab.prompt_table import prompt_tuning_embedding, ptuning_setup
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE


def span(path: bytes, start: int = IMAGE_START_ID) -> list[int]:
    return [start, *path, *[start + 2] * (IMG_TOKEN_SPAN - len(path)), start + 1]


def batch(*rows: list[int], pad: int = 0) -> torch.Tensor:
    length = max(map(len, rows))
    return torch.tensor([r + [pad] * (length - len(r)) for r in rows], dtype=torch.long)


def as_placeholders(ids: torch.Tensor, img_pos: torch.Tensor, pad_id: int) -> torch.Tensor:
    """vLLM's prompt: the path bytes of each span become `<imgpad>` (tags kept)."""
    ids = ids.clone()
    for i, a, b in img_pos.tolist():
        ids[i, a + 1 : b] = pad_id
    return ids


def three_ways(ids, vocab, input_vit, vocab_size, image_start_id=IMAGE_START_ID):
    """Hidden states after injection: original overwrite, masked scatter on placeholders, prompt-table lookup."""
    img_pos = locate_img_pos(ids, image_start_id)
    original = overwrite_image_spans(vocab[ids], img_pos, input_vit)
    placeholders = as_placeholders(ids, img_pos, image_start_id + 2)
    scattered = masked_scatter_images(vocab[placeholders], placeholders, input_vit, image_pad_id=image_start_id + 2)
    fake_ids = replace_image_spans(ids, img_pos, make_fake_prompt_ids(vocab_size, len(img_pos)))
    prompt_table, tasks, task_vocab_size = ptuning_setup(input_vit, vocab.dtype, vocab.shape[1], input_ids=fake_ids)
    looked_up = prompt_tuning_embedding(fake_ids, vocab, prompt_table, tasks, task_vocab_size, vocab_size)
    return original, scattered, looked_up


def test_the_three_ways_agree_with_real_ids():
    ids = batch(
        [151644, 872, 198, *span(b"/tmp/a.png"), 198, *span(b"/tmp/b.png"), 151645],
        [151644, 8948, 151645],  # no image
        [151644, 872, *span(b"c.jpg"), 151645],
        pad=151643,
    )
    vocab = torch.randn(MODEL_VOCAB_SIZE, 3, generator=torch.Generator().manual_seed(0))
    input_vit = torch.randn(3, 256, 3, generator=torch.Generator().manual_seed(1))
    original, scattered, looked_up = three_ways(ids, vocab, input_vit, MODEL_VOCAB_SIZE)
    assert torch.equal(original, scattered) and torch.equal(original, looked_up)
    # what the agreed result is: images in their spans, everything else (tags included) from the vocabulary
    assert torch.equal(original[0, 4:260], input_vit[0])
    assert torch.equal(original[0, 263:519], input_vit[1])
    assert torch.equal(original[2, 3:259], input_vit[2])
    assert torch.equal(original[0, 3], vocab[IMAGE_START_ID]) and torch.equal(original[0, 260], vocab[IMAGE_END_ID])
    assert torch.equal(original[1], vocab[ids[1]])


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=4),
    st.integers(256, 400),
    st.integers(1, 5),
    st.integers(0, 2**16),
)
def test_the_three_ways_agree_on_random_batches(layout, image_start_id, hidden, seed):
    """Rows described by the counts of text ids around 0–2 spans, with a small vocabulary and its own tag ids."""
    rows = []
    for gaps in layout:
        ids = []
        for g in gaps[:-1]:
            ids += list(range(100, 100 + g)) + span(b"p.png", image_start_id)
        rows.append(ids + [7] * gaps[-1])
    ids = batch(*rows)
    vocab_size = image_start_id + 3
    n_images = int((ids == image_start_id).sum())
    vocab = torch.randn(vocab_size, hidden, generator=torch.Generator().manual_seed(seed))
    input_vit = torch.randn(n_images, 256, hidden, generator=torch.Generator().manual_seed(seed + 1))
    original, scattered, looked_up = three_ways(ids, vocab, input_vit, vocab_size, image_start_id)
    assert torch.equal(original, scattered) and torch.equal(original, looked_up)


def test_overwrite_casts_to_the_hidden_dtype_and_leaves_its_input_alone():
    hidden = torch.zeros(1, 260, 2, dtype=torch.float16)
    input_vit = torch.full((1, 256, 2), 1.5)
    out = overwrite_image_spans(hidden, torch.tensor([[0, 1, 258]]), input_vit)
    assert out.dtype == torch.float16
    assert (out[0, 2:258] == 1.5).all() and not out[0, [0, 1, 258, 259]].any()
    assert not hidden.any()


def test_overwrite_checks_the_image_count():
    with pytest.raises(ValueError, match=r"the ids hold 1 image spans but the features are for 2 pictures"):
        overwrite_image_spans(torch.zeros(1, 260, 2), torch.tensor([[0, 1, 258]]), torch.zeros(2, 256, 2))


def test_masked_scatter_fills_placeholders_in_order():
    ids = torch.tensor([[1, IMAGE_PAD_ID, IMAGE_PAD_ID, 2], [IMAGE_PAD_ID, 3, IMAGE_PAD_ID, 4]])
    input_vit = torch.arange(2 * 2 * 1, dtype=torch.float32).reshape(2, 2, 1) + 10  # [N=2, 2 rows, H=1]
    out = masked_scatter_images(torch.zeros(2, 4, 1), ids, input_vit)
    assert out[..., 0].tolist() == [[0, 10, 11, 0], [12, 0, 13, 0]]


def test_masked_scatter_count_mismatch():
    ids = torch.tensor([[1, *[IMAGE_PAD_ID] * 255, 2]])
    with pytest.raises(ValueError, match="255 <imgpad> placeholders but 256 image feature rows"):
        masked_scatter_images(torch.zeros(1, 257, 2), ids, torch.zeros(1, 256, 2))
