"""Notebook 04 — the prompt table: `ptuning_setup` and TensorRT-LLM's `PromptTuningEmbedding` lookup."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checks.tensors import (
    as_batch,
    check_features,
    check_features_shape,
    check_image_count,
    check_lookup_inputs,
    check_rows_per_request,
    check_rows_read,
    check_runtime_table,
    one_int,
    parse_tasks,
    to_torch_dtype,
)
from .checks.values import check_int
from .fake_ids import make_fake_prompt_ids, replace_image_spans
from .img_pos import locate_img_pos
from .tokenizing import IMAGE_START_ID


def ptuning_setup(prompt_table, dtype, hidden_size: int, tasks=None, input_ids=None):
    """run.py's ptuning_setup: `input_vit` [N, 256, H] flattened into the engine's table; returns
    `(prompt_table, tasks, task_vocab_size)`."""
    hidden_size, dtype = check_int("hidden_size", hidden_size, 1), to_torch_dtype(dtype)
    batch_size = 1 if input_ids is None else as_batch(input_ids).shape[0]
    if prompt_table is not None:
        check_features(prompt_table, hidden_size, dtype)  # floating-point, [N, 256, hidden_size], finite in dtype
        task_vocab_size = torch.tensor([prompt_table.shape[1]], dtype=torch.int32)  # 256
        prompt_table = prompt_table.reshape(-1, hidden_size).to(dtype)  # [N*256, H]
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
    return check_runtime_table(prompt_table, hidden_size, dtype)


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


def table_size(prompt_table: torch.Tensor, task: int | None = None, task_vocab_size: int = 0) -> str:
    """What a request may read of a flat table: "the table has N rows (task t starts at row s)"."""
    start = "" if task is None else f" (task {task} starts at row {task * task_vocab_size})"
    return f"the table has {len(prompt_table)} rows{start}"


def images_per_row(img_pos: torch.Tensor, batch_size: int) -> list[int]:
    """Number of images in each sequence of the batch."""
    return torch.bincount(img_pos[:, 0], minlength=batch_size).tolist() if len(img_pos) else [0] * batch_size


def single_table_batch(input_ids, input_vit: torch.Tensor, vocab_size: int, image_start_id: int = IMAGE_START_ID):
    """Python-session convention: one table, ids increase over all images, tasks all 0."""
    input_ids = as_batch(input_ids)
    check_features_shape(input_vit)  # [N, rows, H]
    img_pos = locate_img_pos(input_ids, image_start_id, input_vit.shape[1])  # [N, 3]: one id a row in each span
    check_image_count(img_pos, input_vit)
    fake_prompt_id = make_fake_prompt_ids(vocab_size, input_vit.shape[0], input_vit.shape[1])  # [N, rows]
    ids = replace_image_spans(input_ids, img_pos, fake_prompt_id)
    prompt_table = input_vit.reshape(-1, input_vit.shape[-1])  # [N*256, H]
    tasks = torch.zeros(input_ids.shape[0], dtype=torch.int32)
    return ids, prompt_table, tasks, input_vit.shape[1]


def per_request_tables(
    input_ids,
    input_vit: torch.Tensor,
    vocab_size: int,
    rows_per_request: int | None = None,
    image_start_id: int = IMAGE_START_ID,
):
    """In-flight-batching convention: each request's ids restart at vocab_size, and request b's table is placed at
    row b × rows_per_request, with tasks = b (its position in this batch).

    rows_per_request is the C++ executor's block, max_prompt_embedding_table_size / max_batch_size
    (`BuildConfig.rows_per_request`, with the engine's max_batch_size, the runtime's default). Left out, the block is the smallest that holds
    this batch's fullest request: a layout for runners that take one table of any block size (this package's engine,
    TensorRT-LLM's Python ModelRunner), not the one the C++ executor builds.
    """
    input_ids = as_batch(input_ids)
    check_features_shape(input_vit)  # [N, rows, H]
    img_pos = locate_img_pos(input_ids, image_start_id, input_vit.shape[1])  # [N, 3]: one id a row in each span
    check_image_count(img_pos, input_vit)
    span = input_vit.shape[1]
    counts = images_per_row(img_pos, input_ids.shape[0])
    rows_per_request = check_rows_per_request(max(counts, default=0), span, rows_per_request)
    fake_prompt_id = torch.cat([make_fake_prompt_ids(vocab_size, n, span) for n in counts])  # [N, 256]
    ids = replace_image_spans(input_ids, img_pos, fake_prompt_id)
    table = input_vit.new_zeros(input_ids.shape[0], max(rows_per_request, 1), input_vit.shape[-1])  # [B, rows, H]
    first = 0
    for position, n in enumerate(counts):
        table[position, : n * span] = input_vit[first : first + n].reshape(-1, input_vit.shape[-1])
        first += n
    tasks = torch.arange(input_ids.shape[0], dtype=torch.int32)
    return ids, table.reshape(-1, input_vit.shape[-1]), tasks, table.shape[1]


# Which rows each fake id reads: the lookup's rule, row by row, and the table's layout it gives


def lookup_rows(input_ids, tasks, task_vocab_size, vocab_size: int, table_rows: int | None = None) -> torch.Tensor:
    """(sequence, position, fake id, table row) of every id >= vocab_size: row = id - V + task × task_vocab_size."""
    input_ids = as_batch(input_ids)  # [B, L]
    tasks = torch.tensor(parse_tasks(tasks, input_ids.shape[0]))  # [B]
    task_vocab_size = one_int(task_vocab_size, "task_vocab_size", 0)
    seq, pos = torch.where(input_ids >= vocab_size)
    rows = rows_read(input_ids, tasks, task_vocab_size, vocab_size)[seq, pos]  # [M]
    if table_rows is not None and len(rows) and int(rows.max()) >= table_rows:
        raise ValueError(
            f"a fake id reads row {int(rows.max())} but the prompt table has {table_rows} rows "
            "(on a GPU engine this read would go out of bounds)"
        )
    return torch.stack([seq, pos, input_ids[seq, pos], rows], dim=1)  # [M, 4]


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
        spans = locate_img_pos(ids)  # [N, 3]: the tags stay around the fake ids
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
