"""Notebook 04 — the prompt table: `ptuning_setup` and TensorRT-LLM's `PromptTuningEmbedding` lookup."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checks.tensors import (
    as_batch,
    check_features,
    check_lookup_inputs,
    check_rows_in_table,
    check_rows_per_request,
    check_rows_read,
    check_span_rows,
    check_table,
    feature_blocks,
    one_int,
    parse_tasks,
    to_torch_dtype,
)
from .checks.values import check_int
from .fake_ids import fake_ids_for_spans, replace_image_spans
from .img_pos import locate_img_pos, span_lengths
from .tokenizing import IMAGE_START_ID


def ptuning_setup(prompt_table, dtype, hidden_size: int, tasks=None, input_ids=None):
    """run.py's ptuning_setup: `input_vit` [N, 256, H] flattened into the engine's table; returns
    `(prompt_table, tasks, task_vocab_size)`. A list of [rows_k, H] blocks (pictures of any span length) is one table
    of all their rows, task_vocab_size its rows (as ModelRunner reads a [rows, H] table)."""
    hidden_size, dtype = check_int("hidden_size", hidden_size, 1), to_torch_dtype(dtype)
    batch_size = 1 if input_ids is None else as_batch(input_ids).shape[0]
    if prompt_table is not None:
        blocks = check_features(prompt_table, hidden_size, dtype)  # floating-point [rows, H] blocks, finite in dtype
        if isinstance(prompt_table, torch.Tensor):  # run.py's input_vit [N, 256, H]
            task_vocab_size = torch.tensor([prompt_table.shape[1]], dtype=torch.int32)  # 256
            prompt_table = prompt_table.reshape(-1, hidden_size).to(dtype)  # [N*256, H]
        else:
            prompt_table = torch.cat(blocks).to(dtype)  # [M, H]
            task_vocab_size = torch.tensor([prompt_table.shape[0]], dtype=torch.int32)
    else:
        prompt_table = torch.empty([1, hidden_size], dtype=dtype)
        task_vocab_size = torch.zeros([1], dtype=torch.int32)
    if tasks is not None:
        tasks = torch.tensor(parse_tasks(tasks, batch_size), dtype=torch.int32)  # "0,1,…"
    else:
        tasks = torch.zeros([batch_size], dtype=torch.int32)
    return prompt_table, tasks.to(prompt_table.device), task_vocab_size.to(prompt_table.device)


def runtime_prompt_table(prompt_table, hidden_size: int, dtype) -> torch.Tensor:
    """A table handed to an engine at run time (tensor or .npy path): [rows, H] or [tables, rows, H], engine dtype."""
    if isinstance(prompt_table, (str, Path)):
        prompt_table = torch.from_numpy(np.load(prompt_table))
    return check_table(prompt_table, hidden_size, dtype, per_task=True)


def rows_read(input_ids: torch.Tensor, tasks: torch.Tensor, task_vocab_size: int, vocab_size: int) -> torch.Tensor:
    """The prompt-table row each id of input_ids [B, L] reads: id − vocab_size + task · task_vocab_size (negative or
    meaningless for vocabulary ids)."""
    return input_ids - vocab_size + tasks[:, None] * task_vocab_size  # [B, L]


def lookup(input_ids, vocab_embedding, prompt_table, rows, vocab_size: int) -> torch.Tensor:
    """TensorRT-LLM's PromptTuningEmbedding: ids < vocab_size read the vocabulary, the others row `rows` of the table."""
    prompt = input_ids >= vocab_size  # [B, L]: the fake prompt ids
    embeddings = vocab_embedding[torch.where(prompt, vocab_size - 1, input_ids)]  # [B, L, H]: fake ids clipped
    embeddings[prompt] = prompt_table[rows[prompt]]  # each fake id's row of the table
    return embeddings


def prompt_tuning_embedding(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size: int):
    """Embed ids: `< vocab_size` from the vocabulary, the rest from `prompt_table[(id - V) + task * tvs]`."""
    input_ids, tasks, task_vocab_size = check_lookup_inputs(
        input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size
    )
    rows = rows_read(input_ids, tasks, task_vocab_size, vocab_size)  # [B, L]
    for b in range(input_ids.shape[0]):  # every row read lies in the table and is finite
        check_rows_read(b, input_ids[b], rows[b], vocab_size, prompt_table, len(prompt_table), table_size(prompt_table))
    return lookup(input_ids, vocab_embedding, prompt_table, rows, vocab_size)


def table_size(prompt_table, task: int | None = None, task_vocab_size: int = 0) -> str:
    """What a request may read of a flat table (a tensor, or its number of rows): "the table has N rows (task t starts
    at row s)"."""
    rows = prompt_table if isinstance(prompt_table, int) else len(prompt_table)
    start = "" if task is None else f" (task {task} starts at row {task * task_vocab_size})"
    return f"the table has {rows} rows{start}"


def images_per_row(img_pos: torch.Tensor, batch_size: int) -> list[int]:
    """Number of images in each sequence of the batch."""
    return torch.bincount(img_pos[:, 0], minlength=batch_size).tolist() if len(img_pos) else [0] * batch_size


def image_spans(input_ids, input_vit, image_start_id: int = IMAGE_START_ID):
    """(ids [B, L], img_pos [N, 3], each span's length, each picture's features [rows, H]) once every image span of
    the ids has one picture whose features have a row per id of the span (spans of any length, read from img_pos)."""
    input_ids = as_batch(input_ids)
    blocks = feature_blocks(input_vit)  # [rows_k, H] each
    img_pos = locate_img_pos(input_ids, image_start_id, span=None)  # [N, 3]
    lengths = span_lengths(img_pos)  # b − a − 1: one id per feature row
    check_span_rows(lengths, blocks)
    return input_ids, img_pos, lengths, blocks


def single_table_batch(input_ids, input_vit, vocab_size: int, image_start_id: int = IMAGE_START_ID, dtype=None):
    """Python-session convention (run.py): fake ids increase over all images of the batch from vocab_size, one table
    (`ptuning_setup`), tasks all 0. Returns `(ids, prompt_table, tasks, task_vocab_size)`."""
    input_ids, img_pos, lengths, blocks = image_spans(input_ids, input_vit, image_start_id)
    ids = replace_image_spans(input_ids, img_pos, fake_ids_for_spans(vocab_size, lengths))
    hidden, dtype = feature_kind(input_vit, dtype)
    features = (input_vit if isinstance(input_vit, torch.Tensor) else blocks) if blocks else None  # as run.py's
    table, tasks, task_vocab_size = ptuning_setup(features, dtype, hidden, None, ids)
    return ids, table, tasks, int(task_vocab_size)


def per_request_tables(
    input_ids,
    input_vit,
    vocab_size: int,
    rows_per_request: int | None = None,
    image_start_id: int = IMAGE_START_ID,
    dtype=None,
):
    """In-flight-batching convention: each request's ids restart at vocab_size, and request b's table is placed at
    row b × rows_per_request, with tasks = b (its position in this batch): `ptuning_setup` of the requests' tables
    [B, rows_per_request, H]. Returns `(ids, prompt_table, tasks, task_vocab_size)`.

    rows_per_request is the C++ executor's block, max_prompt_embedding_table_size / max_batch_size
    (`BuildConfig.rows_per_request`, with the engine's max_batch_size, the runtime's default). Left out, the block is
    the smallest that holds this batch's fullest request: a layout for runners that take one table of any block size
    (this package's engine, TensorRT-LLM's Python ModelRunner), not the one the C++ executor builds.
    """
    input_ids, img_pos, lengths, blocks = image_spans(input_ids, input_vit, image_start_id)
    hidden, dtype = feature_kind(input_vit, dtype)
    batch = input_ids.shape[0]
    mine = [[k for k, row in enumerate(img_pos[:, 0].tolist()) if row == r] for r in range(batch)]  # each request's
    rows = [sum(lengths[k] for k in pictures) for pictures in mine]
    rows_per_request = check_rows_per_request(max(rows, default=0), rows_per_request)
    fake_prompt_id = [None] * len(blocks)
    for pictures in mine:  # each request's fake ids from vocab_size
        for k, ids in zip(pictures, fake_ids_for_spans(vocab_size, [lengths[k] for k in pictures])):
            fake_prompt_id[k] = ids
    ids = replace_image_spans(input_ids, img_pos, fake_prompt_id)
    tables = torch.zeros(batch, max(rows_per_request, 1), hidden, dtype=dtype)  # [B, rows, H]: unused rows 0
    for r, pictures in enumerate(mine):
        if pictures:
            tables[r, : rows[r]] = torch.cat([blocks[k] for k in pictures])
    tasks = ",".join(map(str, range(batch)))  # request b reads block b
    table, tasks, task_vocab_size = ptuning_setup(tables, dtype, hidden, tasks, ids)
    return ids, table, tasks, int(task_vocab_size)


def feature_kind(input_vit, dtype=None) -> tuple[int, torch.dtype]:
    """(H, dtype) of the table made from input_vit [N, rows, H] or [rows, H] blocks: `dtype` if given, else theirs."""
    blocks = feature_blocks(input_vit)
    if not blocks and not isinstance(input_vit, torch.Tensor):
        raise ValueError(
            "no pictures' features: give input_vit [0, rows, H] (its H and dtype) for a batch without pictures"
        )
    sample = blocks[0] if blocks else input_vit
    return sample.shape[-1], to_torch_dtype(sample.dtype if dtype is None else dtype)


# Which rows each fake id reads: the lookup's rule, row by row, and the table's layout it gives


def lookup_rows(input_ids, tasks, task_vocab_size, vocab_size: int, table_rows: int | None = None) -> torch.Tensor:
    """(sequence, position, fake id, table row) of every id >= vocab_size: row = id - V + task × task_vocab_size."""
    input_ids = as_batch(input_ids)  # [B, L]
    tasks = torch.tensor(parse_tasks(tasks, input_ids.shape[0]))  # [B]
    task_vocab_size = one_int(task_vocab_size, "task_vocab_size", 0)
    every = rows_read(input_ids, tasks, task_vocab_size, vocab_size)  # [B, L]
    if table_rows is not None:
        for b, ids in enumerate(input_ids):
            check_rows_in_table(b, ids, every[b], vocab_size, table_rows, table_size(table_rows))
    seq, pos = torch.where(input_ids >= vocab_size)
    return torch.stack([seq, pos, input_ids[seq, pos], every[seq, pos]], dim=1)  # [M, 4]


@dataclass(frozen=True)
class TableBlock:
    """Rows start…stop-1 of a prompt table: read by picture `picture` (from 0) of request `request`, or by nobody
    (request and picture None: unused rows)."""

    start: int
    stop: int
    request: int | None
    picture: int | None


def table_layout(requests, tasks, task_vocab_size, vocab_size: int, table_rows: int) -> list[TableBlock]:
    """The blocks of a prompt table of `table_rows` rows that the fake ids of `requests` (a [B, L] batch or a list of
    1-D id sequences, image spans holding fake ids) read, in row order, with the unused rows between them: each
    request's k-th image span is its picture k, its rows found by `lookup_rows` (id - V + task × task_vocab_size)."""
    sequences = list(as_batch(requests)) if isinstance(requests, torch.Tensor) else [as_batch(r)[0] for r in requests]
    tasks = parse_tasks(tasks, len(sequences))
    table_rows = check_int("table_rows", table_rows, 1)
    used = []
    for request, (ids, task) in enumerate(zip(sequences, tasks)):
        entries = lookup_rows(ids, [task], task_vocab_size, vocab_size, table_rows)  # [M, 4]
        spans = locate_img_pos(ids, span=None)  # [N, 3]: the tags stay around the fake ids, spans of any length
        for picture, (_, a, b) in enumerate(spans.tolist()):
            rows = entries[(entries[:, 1] > a) & (entries[:, 1] < b), 3].tolist()
            for first, last in _runs(sorted(set(rows))):
                used.append(TableBlock(first, last + 1, request, picture))
    used.sort(key=lambda block: (block.start, block.request))
    blocks, row = [], 0
    for block in used:
        if block.start > row:
            blocks.append(TableBlock(row, block.start, None, None))
        blocks.append(block)
        row = max(row, block.stop)
    if row < table_rows:
        blocks.append(TableBlock(row, table_rows, None, None))
    return blocks


def _runs(values: list[int]) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive ints in sorted `values`."""
    runs = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs
