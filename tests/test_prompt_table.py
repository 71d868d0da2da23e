"""Tests for step 4: `ptuning_setup`, TensorRT-LLM's prompt-table lookup and the two batching conventions."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.injection import overwrite_image_spans
from qwenvl_lab.prompt_table import (
    images_per_row,
    per_request_tables,
    prompt_tuning_embedding,
    ptuning_setup,
    single_table_batch,
)
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE


def span(start: int = IMAGE_START_ID, fill: int = IMAGE_PAD_ID) -> list[int]:
    """`<img>` + 256 ids + `</img>` with the given tag id (path bytes are irrelevant here)."""
    return [start, *range(47, 57), *[fill] * (IMG_TOKEN_SPAN - 10), start + 1]


def batch(*rows: list[int], pad: int = 0) -> torch.Tensor:
    """Rows padded on the right to one length."""
    length = max(map(len, rows))
    return torch.tensor([r + [pad] * (length - len(r)) for r in rows], dtype=torch.long)


def reference_embedding(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    """TensorRT-LLM's lookup, one element at a time."""
    batch, length = input_ids.shape
    out = torch.empty(batch, length, vocab_embedding.shape[1], dtype=vocab_embedding.dtype)
    for b in range(batch):
        for pos in range(length):
            t = int(input_ids[b, pos])
            if t < vocab_size:
                out[b, pos] = vocab_embedding[t]
            else:
                out[b, pos] = prompt_table[t - vocab_size + int(tasks[b]) * int(task_vocab_size)]
    return out


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ptuning_setup (examples/qwenvl/run.py)


def test_ptuning_setup_flattens_and_casts_the_table():
    input_vit = torch.randn(3, IMG_TOKEN_SPAN, 8, generator=generator(0))  # [N, 256, H]
    ids = torch.zeros(2, 5, dtype=torch.long)
    prompt_table, tasks, task_vocab_size = ptuning_setup(input_vit, "float16", 8, input_ids=ids)
    assert prompt_table.shape == (3 * 256, 8) and prompt_table.dtype == torch.float16
    assert torch.equal(prompt_table[256 * 2 + 17], input_vit[2, 17].half())  # row k*256 + j is image k, query j
    assert torch.equal(prompt_table, input_vit.reshape(-1, 8).half())
    assert task_vocab_size.dtype == torch.int32 and task_vocab_size.tolist() == [256]
    assert tasks.dtype == torch.int32 and tasks.tolist() == [0, 0]  # zeros([batch]) without tasks


def test_ptuning_setup_task_vocab_size_is_the_rows_per_image():
    _, _, task_vocab_size = ptuning_setup(torch.zeros(2, 32, 4), torch.bfloat16, 4)
    assert task_vocab_size.tolist() == [32]


@pytest.mark.parametrize("text, expected", [("0,1", [0, 1]), ("1,0", [1, 0]), ("0, 1", [0, 1]), ("3,3", [3, 3])])
def test_ptuning_setup_tasks_string(text, expected):
    _, tasks, _ = ptuning_setup(torch.zeros(2, 256, 4), "float32", 4, tasks=text, input_ids=torch.zeros(2, 3).long())
    assert tasks.dtype == torch.int32 and tasks.tolist() == expected


def test_ptuning_setup_without_a_table():
    ids = torch.zeros(3, 4, dtype=torch.long)
    prompt_table, tasks, task_vocab_size = ptuning_setup(None, "float16", 16, input_ids=ids)
    assert prompt_table.shape == (1, 16) and prompt_table.dtype == torch.float16
    assert task_vocab_size.tolist() == [0]
    assert tasks.tolist() == [0, 0, 0]
    # the empty table works for text-only ids: plain vocabulary embeddings
    vocab = torch.randn(10, 16, generator=generator(1)).half()
    text = torch.tensor([[1, 2, 3, 9]] * 3)
    assert torch.equal(prompt_tuning_embedding(text, vocab, prompt_table, tasks, task_vocab_size, 10), vocab[text])


# prompt_tuning_embedding: TensorRT-LLM's PromptTuningEmbedding


def test_lookup_by_hand():
    vocab = torch.arange(5 * 2, dtype=torch.float32).reshape(5, 2)  # row r = (2r, 2r+1)
    table = -torch.arange(6 * 2, dtype=torch.float32).reshape(6, 2)  # row r = (-2r, -2r-1)
    ids = torch.tensor([[0, 5, 6, 4], [5, 7, 1, 3]])
    out = prompt_tuning_embedding(ids, vocab, table, torch.tensor([0, 1]), torch.tensor([3], dtype=torch.int32), 5)
    assert out[0].tolist() == [[0, 1], [-0.0, -1], [-2, -3], [8, 9]]  # task 0: rows 0, 1
    assert out[1].tolist() == [[-6, -7], [-10, -11], [2, 3], [6, 7]]  # task 1: rows 3 + 0, 3 + 2


def test_lookup_of_a_single_sequence_and_int_task_vocab_size():
    vocab, table = torch.randn(4, 3, generator=generator(2)), torch.randn(2, 3, generator=generator(3))
    out = prompt_tuning_embedding([0, 4, 5], vocab, table, [0], 2, 4)
    assert out.shape == (1, 3, 3)
    assert torch.equal(out[0], torch.stack([vocab[0], table[0], table[1]]))


def test_vocab_size_smaller_than_the_embedding_rows():
    # ids from vocab_size on go to the table even when the embedding has more rows (padded vocabularies)
    vocab, table = torch.randn(8, 2, generator=generator(4)), torch.randn(3, 2, generator=generator(5))
    out = prompt_tuning_embedding([[5, 6, 7]], vocab, table, [0], 3, 6)
    assert torch.equal(out[0], torch.stack([vocab[5], table[0], table[1]]))


def test_lookup_with_an_empty_table_and_no_fake_ids():
    vocab = torch.randn(6, 2, generator=generator(6))
    out = prompt_tuning_embedding([[1, 5]], vocab, torch.zeros(0, 2), [0], 256, 6)
    assert torch.equal(out[0], vocab[[1, 5]])


def test_lookup_refuses_a_non_finite_row_it_reads():
    vocab, table = torch.randn(10, 4, generator=generator(12)), torch.randn(6, 4, generator=generator(13))
    table[4, 1] = float("nan")
    out = prompt_tuning_embedding([[1, 10, 13]], vocab, table, [0], 6, 10)  # rows 0 and 3: finite
    assert torch.equal(out[0], torch.stack([vocab[1], table[0], table[3]]))
    with pytest.raises(ValueError, match="prompt-table row 4 .* holds NaN"):
        prompt_tuning_embedding([[1, 10, 14]], vocab, table, [0], 6, 10)


@st.composite
def lookups(draw):
    """A random valid lookup: small vocab/table/hidden, ids that stay inside their task's reach of the table."""
    vocab_size, hidden = draw(st.integers(1, 12)), draw(st.integers(1, 4))
    rows, task_vocab_size = draw(st.integers(1, 20)), draw(st.integers(0, 6))
    batch, length = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    max_task = (rows - 1) // task_vocab_size if task_vocab_size else 3
    tasks = draw(st.lists(st.integers(0, max_task), min_size=batch, max_size=batch))
    ids = [
        draw(st.lists(st.integers(0, vocab_size + rows - 1 - t * task_vocab_size), min_size=length, max_size=length))
        for t in tasks
    ]
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    seed = draw(st.integers(0, 2**16))
    extra_rows = draw(st.integers(0, 3))  # embeddings may be padded past vocab_size
    return vocab_size, hidden, rows, task_vocab_size, tasks, ids, dtype, seed, extra_rows


@settings(max_examples=50, deadline=None)
@given(lookups())
def test_lookup_matches_the_elementwise_reference(case):
    vocab_size, hidden, rows, task_vocab_size, tasks, ids, dtype, seed, extra_rows = case
    vocab = torch.randn(vocab_size + extra_rows, hidden, generator=generator(seed)).to(dtype)
    table = torch.randn(rows, hidden, generator=generator(seed + 1)).to(dtype)
    ids, tasks = torch.tensor(ids), torch.tensor(tasks, dtype=torch.int32)
    tvs = torch.tensor([task_vocab_size], dtype=torch.int32)
    out = prompt_tuning_embedding(ids, vocab, table, tasks, tvs, vocab_size)
    assert out.dtype == dtype and out.shape == (*ids.shape, hidden)
    assert torch.equal(out, reference_embedding(ids, vocab, table, tasks, task_vocab_size, vocab_size))


@settings(max_examples=50, deadline=None)
@given(lookups(), st.data())
def test_lookup_rejects_any_id_past_the_table(case, data):
    vocab_size, hidden, rows, task_vocab_size, tasks, ids, _, _, _ = case
    b = data.draw(st.integers(0, len(ids) - 1))
    first_bad = vocab_size + rows - tasks[b] * task_vocab_size  # its task's row index reaches `rows`
    ids[b][data.draw(st.integers(0, len(ids[b]) - 1))] = first_bad + data.draw(st.integers(0, 5))
    with pytest.raises(ValueError, match=f"but the table has {rows} rows"):
        prompt_tuning_embedding(
            torch.tensor(ids),
            torch.zeros(vocab_size, hidden),
            torch.zeros(rows, hidden),
            tasks,
            task_vocab_size,
            vocab_size,
        )


# the two batching conventions


def test_single_table_batch_layout():
    ids = batch([1, *span(), 2, *span()], [*span(), 3, 4, 5])
    input_vit = torch.randn(3, 256, 4, generator=generator(7))
    out_ids, table, tasks, task_vocab_size = single_table_batch(ids, input_vit, MODEL_VOCAB_SIZE)
    assert out_ids[0, 2:258].tolist() == list(range(MODEL_VOCAB_SIZE, MODEL_VOCAB_SIZE + 256))
    assert out_ids[0, 261:517].tolist() == list(range(MODEL_VOCAB_SIZE + 256, MODEL_VOCAB_SIZE + 512))
    assert out_ids[1, 1:257].tolist() == list(range(MODEL_VOCAB_SIZE + 512, MODEL_VOCAB_SIZE + 768))  # ids keep growing
    assert torch.equal(table, input_vit.reshape(768, 4))
    assert tasks.tolist() == [0, 0] and task_vocab_size == 256


def test_per_request_tables_layout():
    ids = batch([1, *span(), 2, *span()], [*span(), 3, 4, 5], [6] * 518)
    input_vit = torch.randn(3, 256, 4, generator=generator(8))
    out_ids, table, tasks, rows = per_request_tables(ids, input_vit, MODEL_VOCAB_SIZE)
    assert rows == 512  # the largest request: two images
    assert out_ids[0, 261:517].tolist() == list(range(MODEL_VOCAB_SIZE + 256, MODEL_VOCAB_SIZE + 512))
    assert out_ids[1, 1:257].tolist() == list(range(MODEL_VOCAB_SIZE, MODEL_VOCAB_SIZE + 256))  # restarts per request
    assert table.shape == (3 * 512, 4)
    assert torch.equal(table[:512], input_vit[:2].reshape(512, 4))
    assert torch.equal(table[512:768], input_vit[2])  # the block of batch position 1 starts at row 1 * rows
    assert not table[768:].any()
    assert tasks.tolist() == [0, 1, 2]


def test_per_request_tables_with_the_readme_build_allows_one_image_per_request():
    rows_per_request = 2048 // 8  # max_prompt_embedding_table_size / max_batch_size
    one = torch.tensor([[1, *span()], [*span(), 2]])
    _, table, tasks, rows = per_request_tables(one, torch.zeros(2, 256, 4), MODEL_VOCAB_SIZE, rows_per_request)
    assert rows == 256 and table.shape == (512, 4) and tasks.tolist() == [0, 1]
    two = torch.tensor([[*span(), *span()]])
    assert per_request_tables(two, torch.zeros(2, 256, 4), MODEL_VOCAB_SIZE)[3] == 512  # no block: what it needs


def test_images_per_row():
    assert images_per_row(torch.tensor([[0, 1, 258], [2, 0, 257], [2, 259, 516]]), 4) == [1, 0, 2, 0]
    assert images_per_row(torch.zeros(0, 3, dtype=torch.long), 2) == [0, 0]


def embed_three_ways(ids, vocab, input_vit, vocab_size, image_start_id):
    """(single table, per-request tables, original overwrite) embeddings of the same batch."""
    results = []
    for convention in (single_table_batch, per_request_tables):
        fake_ids, table, tasks, task_vocab_size = convention(ids, input_vit, vocab_size, image_start_id=image_start_id)
        results.append(prompt_tuning_embedding(fake_ids, vocab, table, tasks, task_vocab_size, vocab_size))
    img_pos = locate_img_pos(ids, image_start_id)
    results.append(overwrite_image_spans(vocab[ids], img_pos, input_vit))
    return results


@st.composite
def image_batches(draw):
    """1–4 sequences of text ids with 0–2 image spans each (real span layout), padded on the right."""
    image_start_id = draw(st.integers(256, 300))  # path bytes 0–255 stay below the tags
    vocab_size = image_start_id + 3 + draw(st.integers(0, 4))  # <img>, </img>, <imgpad> inside the vocab
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        ids = []
        for _ in range(draw(st.integers(0, 2))):
            ids += draw(st.lists(st.integers(0, image_start_id - 1), max_size=3))
            ids += span(image_start_id, fill=image_start_id + 2)
        rows.append(ids + draw(st.lists(st.integers(0, image_start_id - 1), min_size=1, max_size=3)))
    return batch(*rows), vocab_size, image_start_id, draw(st.integers(1, 6)), draw(st.integers(0, 2**16))


@settings(max_examples=50, deadline=None)
@given(image_batches())
def test_both_batching_conventions_give_the_original_embeddings(case):
    ids, vocab_size, image_start_id, hidden, seed = case
    n_images = int((ids == image_start_id).sum())
    vocab = torch.randn(vocab_size, hidden, generator=generator(seed))
    input_vit = torch.randn(n_images, 256, hidden, generator=generator(seed + 1))  # [N, 256, H]
    single, per_request, original = embed_three_ways(ids, vocab, input_vit, vocab_size, image_start_id)
    assert torch.equal(single, per_request)
    assert torch.equal(single, original)


def test_both_conventions_with_the_real_ids_and_vocab_size():
    ids = batch([151644, *span(), 198, *span(), 151645], [151644, 8948, *span(), 198, 872, 151645, 198], pad=151643)
    vocab = torch.randn(MODEL_VOCAB_SIZE, 2, generator=generator(9))
    input_vit = torch.randn(3, 256, 2, generator=generator(10))
    single, per_request, original = embed_three_ways(ids, vocab, input_vit, MODEL_VOCAB_SIZE, IMAGE_START_ID)
    assert torch.equal(single, per_request) and torch.equal(single, original)
    assert torch.equal(single[1, 3:259], input_vit[2])
    assert torch.equal(single[1, 2], vocab[IMAGE_START_ID]) and torch.equal(single[1, 259], vocab[IMAGE_END_ID])
