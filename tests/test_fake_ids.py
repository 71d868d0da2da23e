"""Tests for step 3: fake prompt ids and replacing each image span by them."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE


def span(path: bytes = b"/tmp/a.png") -> list[int]:
    return [IMAGE_START_ID, *path, *[IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(path)), IMAGE_END_ID]


def test_fake_ids_start_at_the_model_vocab_size():
    fake_prompt_id = make_fake_prompt_ids(MODEL_VOCAB_SIZE, 3)
    assert fake_prompt_id.shape == (3, 256) and fake_prompt_id.dtype == torch.int64
    assert fake_prompt_id[0, 0] == 151936  # not 151643 (article 1) nor 151860 (the tokenizer length)
    assert fake_prompt_id.flatten().tolist() == list(range(151936, 151936 + 3 * 256))
    assert fake_prompt_id[2, 0] == 151936 + 512  # image k starts at V + 256 k


def test_fake_ids_other_sizes():
    assert make_fake_prompt_ids(10, 2, tokens_per_image=3).tolist() == [[10, 11, 12], [13, 14, 15]]
    assert make_fake_prompt_ids(10, 0).shape == (0, 256)


def test_replace_keeps_tags_and_replaces_exactly_the_256_span_positions():
    ids = torch.tensor([[1, 2, *span(b"a.png"), 3, *span(b"b.jpg"), 4]])
    img_pos = locate_img_pos(ids)
    fake_prompt_id = make_fake_prompt_ids(MODEL_VOCAB_SIZE, 2)
    out = replace_image_spans(ids, img_pos, fake_prompt_id)
    changed = (out != ids)[0]
    assert changed.sum() == 2 * 256
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        assert out[i, a] == IMAGE_START_ID and out[i, b] == IMAGE_END_ID  # tags kept
        assert torch.equal(out[i, a + 1 : b], fake_prompt_id[k])
        assert changed[a + 1 : b].all()
    assert out[0, :2].tolist() == [1, 2] and out[0, -1] == 4
    assert ids[0, 3] == ord("a")  # the input is not modified
    assert torch.equal(locate_img_pos(out), img_pos)  # the tags still mark the same spans


def test_replace_across_a_batch_follows_img_pos_order():
    ids = torch.tensor([[*span(), 5, *span()], [6] * 259 + span()[:-1] + [IMAGE_END_ID]])
    img_pos = locate_img_pos(ids)
    out = replace_image_spans(ids, img_pos, make_fake_prompt_ids(100, 3))
    assert out[0, 1:257].tolist() == list(range(100, 356))
    assert out[0, 260:516].tolist() == list(range(356, 612))
    assert out[1, 260:516].tolist() == list(range(612, 868))
    assert out[1, :259].tolist() == [6] * 259


def test_replace_accepts_one_sequence():
    out = replace_image_spans([9, *span()], [[0, 1, 258]], make_fake_prompt_ids(MODEL_VOCAB_SIZE, 1))
    assert out.shape == (1, 259) and out[0, 2] == MODEL_VOCAB_SIZE and out[0, 257] == MODEL_VOCAB_SIZE + 255


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=3), st.integers(1, 200_000))
def test_replace_changes_only_span_interiors(layout, vocab_size):
    """Rows described by counts of text ids between spans; only the 256 interior ids of each span change."""
    rows = []
    for gaps in layout:
        ids = []
        for g in gaps[:-1]:
            ids += [7] * g + span()
        rows.append(ids + [7] * gaps[-1])
    length = max(map(len, rows))
    ids = torch.tensor([r + [8] * (length - len(r)) for r in rows])
    img_pos = locate_img_pos(ids)
    fake_prompt_id = make_fake_prompt_ids(vocab_size, len(img_pos))
    out = replace_image_spans(ids, img_pos, fake_prompt_id)
    interior = torch.zeros_like(ids, dtype=torch.bool)
    for i, a, b in img_pos.tolist():
        interior[i, a + 1 : b] = True
    assert torch.equal(out[~interior], ids[~interior])
    assert out[interior].tolist() == fake_prompt_id.flatten().tolist()
    assert int(interior.sum()) == 256 * len(img_pos)
