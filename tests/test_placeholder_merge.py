"""Today's merges (TensorRT-LLM's PyTorch backend, vLLM) and the prompt table for spans of any length agree."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.placeholder_merge import (
    filter_mm_token_from_input_ids,
    fuse_input_embeds,
    input_token_extra_ids,
    merge_multimodal_embeddings,
    span_mask,
    vllm_qwen_vl_ids,
    write_placeholders,
)
from qwenvl_lab.prompt_table import per_request_tables, prompt_tuning_embedding, single_table_batch
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE

V = 50  # a small vocabulary: ids 0 … 49


def embedding(seed=0, vocab=V, hidden=4) -> nn.Embedding:
    layer = nn.Embedding(vocab, hidden)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)))
    return layer.requires_grad_(False)


def test_the_out_of_vocabulary_rule_counts_vocab_size_itself():
    ids = torch.tensor([1, V - 1, V, V + 1, 7, V + 9])
    text, mm = filter_mm_token_from_input_ids(ids, V)
    assert text.tolist() == [0, 1, 4] and mm.tolist() == [2, 3, 5]
    text, mm = filter_mm_token_from_input_ids(ids, V, mm_token_ids=[7, V - 1])  # in-vocabulary ids instead
    assert mm.tolist() == [1, 4] and text.tolist() == [0, 2, 3, 5]


def test_fuse_writes_the_features_in_order_and_embeds_only_text():
    layer = embedding()
    ids = torch.tensor([3, V + 1, V + 1, 4, V + 1, 5])  # one sentinel at every image position
    first, second = torch.full((2, 4), 1.0), torch.full((1, 4), 2.0)
    kept, embeds = fuse_input_embeds(layer, ids, [first, second])
    assert kept is None and embeds.shape == (6, 4)
    assert torch.equal(embeds[[1, 2, 4]], torch.cat([first, second]))
    assert torch.equal(embeds[[0, 3, 5]], layer.weight[[3, 4, 5]])
    assert fuse_input_embeds(layer, ids[:1], []) == (ids[:1], None)  # no features: the ids go on


def test_vllm_merge_is_in_place_and_takes_a_list_of_placeholders():
    layer = embedding()
    ids = torch.tensor([[2, 9, 9, 3], [8, 4, 9, 2]])
    embeds = layer(ids).clone()
    rows = torch.arange(12.0).reshape(3, 4)
    out = merge_multimodal_embeddings(ids, embeds, [rows], 9)
    assert out is embeds and torch.equal(embeds[ids == 9], rows)
    four = torch.arange(16.0).reshape(4, 4)
    again = merge_multimodal_embeddings(ids, layer(ids).clone(), four, [8, 9])  # row-major: 9, 9, 8, 9
    assert torch.equal(again[torch.isin(ids, torch.tensor([8, 9]))], four)
    assert torch.equal(again[ids == 2], layer.weight[[2, 2]])


def span(path: bytes) -> list[int]:
    return [IMAGE_START_ID, *path, *[IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(path)), IMAGE_END_ID]


def test_vllm_drops_the_path_and_pads_every_span():
    ids = [151644, 872, *span(b"a.png"), 198, *span("图片.jpg".encode()), 151645]
    out = vllm_qwen_vl_ids(ids)
    assert len(out) == len(ids) and not set(b"a.png") & set(out)  # no path byte survives
    img_pos = locate_img_pos(torch.tensor(ids))
    assert out == write_placeholders(torch.tensor(ids), span_mask(ids, img_pos)[0], IMAGE_PAD_ID).tolist()
    assert vllm_qwen_vl_ids([5, IMAGE_START_ID, IMAGE_END_ID, 6], num_image_tokens=3) == [
        5,
        IMAGE_START_ID,
        *[IMAGE_PAD_ID] * 3,
        IMAGE_END_ID,
        6,
    ]


def test_a_list_of_blocks_is_run_pys_table_with_every_row_one_task():
    """The pictures' features as a list of [rows, H] blocks give run.py's ids and table; task_vocab_size is then the
    table's rows (ModelRunner's reading of a [rows, H] table) instead of run.py's 256 a picture."""
    ids = torch.tensor(
        [[7, *span(b"a.png"), 8, *span(b"b.png"), 9], [7, 7, 7, *span(b"c.png"), *[151643] * (IMG_TOKEN_SPAN + 2)]]
    )
    input_vit = torch.randn(3, IMG_TOKEN_SPAN, 4)
    expected = single_table_batch(ids, input_vit, MODEL_VOCAB_SIZE)
    got = single_table_batch(ids, list(input_vit), MODEL_VOCAB_SIZE)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])
    assert (expected[3], got[3]) == (IMG_TOKEN_SPAN, 3 * IMG_TOKEN_SPAN)


def test_extra_ids_tell_apart_requests_whose_fake_ids_coincide():
    ids = torch.tensor([V, V + 1, V + 2, 5, 6])  # in-flight batching: every request's fake ids start at V
    red, blue = input_token_extra_ids(ids, V, 1), input_token_extra_ids(ids, V, 2)
    assert red.tolist() == [1, 1, 1, 0, 0] and blue.tolist() == [2, 2, 2, 0, 0]
    keys = {tuple(zip(ids.tolist(), extra.tolist())) for extra in (red, blue, input_token_extra_ids(ids, V, 1))}
    assert len(keys) == 2  # the same table shares a key, another table does not


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=3), min_size=1, max_size=3), st.integers(0, 2**16))
def test_the_three_rules_agree_on_spans_of_any_length(layout, seed):
    """Rows of text with 0–3 images of 1–6 positions each between tags 11 and 12 (ids 13 in the span); padding to one
    length with text ids. The prompt table reads each span's length from img_pos."""
    rows, lengths = [], []
    for spans in layout:
        row = [1]
        for n in spans:
            row += [11, *[13] * n, 12, 2]
            lengths.append(n)
        rows.append(row)
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # [B, L], left padded
    is_image = ids == 13
    layer = embedding(seed % 7)
    gen = torch.Generator().manual_seed(seed)
    features = [torch.randn(n, 4, generator=gen) for n in lengths]
    looked_up = None
    if lengths:
        for convention in (single_table_batch, per_request_tables):
            fake, table, tasks, size = convention(ids, features, V, image_start_id=11)
            looked_up = prompt_tuning_embedding(fake, layer.weight, table, tasks, size, V)
            assert torch.equal(looked_up, merge_multimodal_embeddings(ids, layer(ids).clone(), features, 13))
    packed = write_placeholders(ids, is_image, V + 1).reshape(-1)  # TensorRT-LLM's sentinel, requests packed
    kept, fused = fuse_input_embeds(layer, packed, features)
    fused = layer(kept).reshape(*ids.shape, 4) if fused is None else fused.reshape(*ids.shape, 4)
    merged = merge_multimodal_embeddings(ids, layer(ids).clone(), features, 13) if lengths else layer(ids)
    assert torch.equal(fused, merged)
    assert torch.equal(merged[~is_image], layer.weight[ids[~is_image]])


BAD_INPUT = [
    (lambda: filter_mm_token_from_input_ids(torch.zeros(2, 3, dtype=torch.long), V), ValueError, "packed"),
    (lambda: fuse_input_embeds(torch.zeros(V, 4), torch.tensor([1]), [torch.ones(1, 4)]), TypeError, "nn.Embedding"),
    (lambda: fuse_input_embeds(embedding(), torch.tensor([1, V]), [torch.ones(2, 4)]), ValueError, "count mismatch"),
    (lambda: fuse_input_embeds(embedding(), torch.tensor([V]), [torch.ones(1, 3)]), ValueError, "hidden size is 4"),
    (lambda: fuse_input_embeds(embedding(), torch.tensor([-1, V]), [torch.ones(1, 4)]), ValueError, "non-negative"),
    (
        lambda: fuse_input_embeds(embedding(), torch.tensor([V]), [torch.ones(1, 4, dtype=torch.long)]),
        ValueError,
        "floating",
    ),
    (
        lambda: merge_multimodal_embeddings(torch.tensor([9, 9]), torch.zeros(2, 4), [torch.ones(3, 4)], 9),
        ValueError,
        "3 multimodal",
    ),
    (
        lambda: merge_multimodal_embeddings(torch.tensor([9, 9]), torch.zeros(3, 4), [torch.ones(2, 4)], 9),
        ValueError,
        "inputs_embeds must be",
    ),
    (lambda: merge_multimodal_embeddings(torch.tensor([9]), torch.zeros(1, 4), "rows", 9), TypeError, "got str"),
    (lambda: vllm_qwen_vl_ids([IMAGE_START_ID, 5]), ValueError, "never closed"),
    (lambda: vllm_qwen_vl_ids([5, IMAGE_END_ID]), ValueError, "without an <img>"),
    (lambda: vllm_qwen_vl_ids([IMAGE_START_ID, IMAGE_START_ID, IMAGE_END_ID]), ValueError, "inside another"),
    (
        lambda: single_table_batch(torch.tensor([[11, 13, 12]]), [torch.ones(2, 4)], V, image_start_id=11),
        ValueError,
        "image span 0 holds 1 ids but its picture's features have 2 rows",
    ),
    (
        lambda: per_request_tables(torch.tensor([[11, 12]]), [torch.ones(1, 4)], V, image_start_id=11),
        ValueError,
        "holds no ids",
    ),
    (lambda: write_placeholders(torch.tensor([1, 2]), torch.tensor([1, 0]), 9), ValueError, "bool mask"),
    (lambda: span_mask(torch.zeros(1, 4, dtype=torch.long), [[0, 2, 9]]), ValueError, "outside input_ids"),
    (lambda: input_token_extra_ids(torch.tensor([V]), V, 0), ValueError, "table_id must be an int >= 1"),
]


@pytest.mark.parametrize("call, error, message", BAD_INPUT)
def test_bad_input_is_refused_with_what_to_do(call, error, message):
    with pytest.raises(error, match=message):
        call()
