"""Notebook 04 — the prompt table: `ptuning_setup` and TensorRT-LLM's `PromptTuningEmbedding` lookup."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .fake_ids import make_fake_prompt_ids, replace_image_spans
from .img_pos import as_batch, as_int_tensor, check_int, locate_img_pos
from .tokenizing import IMAGE_START_ID

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INT32_MAX = torch.iinfo(torch.int32).max


def to_torch_dtype(dtype) -> torch.dtype:
    """Accept "float16"/"bfloat16"/"float32" or a torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be one of {sorted(DTYPES)} or a torch.dtype, got {type(dtype).__name__} {dtype!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or a torch.dtype")
    return DTYPES[dtype]


def runtime_prompt_table(prompt_table, hidden_size: int, dtype) -> torch.Tensor:
    """A table handed to an engine at run time (tensor or .npy path): [rows, H] or [tables, rows, H], engine dtype."""
    if isinstance(prompt_table, (str, Path)):
        prompt_table = torch.from_numpy(np.load(prompt_table))
    if not isinstance(prompt_table, torch.Tensor):
        raise TypeError(f"prompt_table must be a torch.Tensor (or a .npy path), got {type(prompt_table).__name__}")
    if prompt_table.dim() not in (2, 3) or prompt_table.shape[-1] != hidden_size:
        raise ValueError(
            f"prompt_table must be [rows, {hidden_size}] (with task_vocab_size) or [tables, rows, {hidden_size}] "
            f"(one table per task), {hidden_size} being the engine's hidden size; got {tuple(prompt_table.shape)}"
        )
    if prompt_table.dtype != to_torch_dtype(dtype):
        raise TypeError(
            f"prompt_table is {prompt_table.dtype} but the engine runs in {to_torch_dtype(dtype)}: cast it "
            "(ptuning_setup(input_vit, dtype=…, …) does)"
        )
    return prompt_table


def first_non_finite(values: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first NaN or ±inf in `values`, or None when all are finite."""
    if bool(torch.isfinite(values.sum())):  # a NaN or inf makes the sum non-finite; an overflow is checked below
        return None
    bad = ~torch.isfinite(values)
    return tuple(int(i) for i in bad.nonzero()[0]) if bool(bad.any()) else None


def ptuning_setup(prompt_table, dtype, hidden_size: int, tasks=None, input_ids=None):
    """Flatten `input_vit` into the engine's table: returns `(prompt_table, tasks, task_vocab_size)`.

    An `input_vit` holding NaN or ±inf, or values that `dtype` cannot hold, is refused with the image that holds them.
    """
    hidden_size = check_int("hidden_size", hidden_size, 1)
    dtype = to_torch_dtype(dtype)
    input_ids = None if input_ids is None else as_batch(input_ids)
    if prompt_table is not None and not isinstance(prompt_table, torch.Tensor):
        raise TypeError(
            f"prompt_table must be input_vit, a torch.Tensor [N, 256, H], or None; got {type(prompt_table).__name__}"
        )
    device = prompt_table.device if prompt_table is not None else (input_ids.device if input_ids is not None else "cpu")
    if prompt_table is not None:
        if prompt_table.dim() != 3:
            raise ValueError(f"prompt_table must be input_vit [N, 256, H], got shape {tuple(prompt_table.shape)}")
        if not prompt_table.dtype.is_floating_point:
            raise TypeError(
                f"input_vit must hold floating-point features (the vision tower's output), "
                f"got dtype {prompt_table.dtype}"
            )
        if prompt_table.shape[2] != hidden_size:
            raise ValueError(
                f"prompt table hidden size {prompt_table.shape[2]} != model hidden_size {hidden_size}; "
                "the vision tower's output_dim must equal the language model's hidden_size"
            )
        bad = first_non_finite(prompt_table)
        if bad is not None:
            raise ValueError(
                f"input_vit image {bad[0]} (row {bad[0]} of input_vit) holds NaN or infinite features (first at query "
                f"{bad[1]}, feature {bad[2]}); the vision tower gave them for that picture: check its weights and dtype"
            )
        cast = prompt_table.to(dtype)
        bad = first_non_finite(cast)
        if bad is not None:
            raise ValueError(
                f"input_vit image {bad[0]} (row {bad[0]} of input_vit) holds {float(prompt_table[bad]):g} at query "
                f"{bad[1]}, feature {bad[2]}, which {dtype} cannot hold (it becomes inf); use a wider dtype "
                "(float32 or bfloat16) or check the vision tower"
            )
        task_vocab_size = torch.tensor([prompt_table.shape[1]], dtype=torch.int32, device=device)  # 256
        prompt_table = cast.reshape(-1, hidden_size)  # [N*256, H]
    else:
        prompt_table = torch.empty([1, hidden_size], dtype=dtype, device=device)
        task_vocab_size = torch.zeros([1], dtype=torch.int32, device=device)
    batch_size = input_ids.shape[0] if input_ids is not None else 1
    if tasks is not None:
        try:
            values = [int(t) for t in str(tasks).split(",")]
        except ValueError:
            raise ValueError(f'tasks must be a comma-separated list of integers like "0,1", got {tasks!r}') from None
        if any(t < 0 for t in values):
            raise ValueError(f"tasks must be non-negative (a task selects a block of table rows), got {values}")
        if any(t > INT32_MAX for t in values):
            raise ValueError(f"tasks must be at most {INT32_MAX} (TensorRT-LLM keeps them as int32), got {values}")
        if len(values) != batch_size:
            raise ValueError(f"{len(values)} tasks given for a batch of {batch_size}: give one task per sequence")
        tasks = torch.tensor(values, dtype=torch.int32, device=device)
    else:
        tasks = torch.zeros([batch_size], dtype=torch.int32, device=device)
    return prompt_table, tasks, task_vocab_size


def _one_int(value, name: str) -> int:
    """An int given as a Python/numpy int or a one-element integer tensor or array (as ptuning_setup returns it)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        values = as_int_tensor(value, name).reshape(-1)
        if values.numel() != 1:
            raise ValueError(f"{name} must be one int, got {values.numel()} values")
        value = int(values[0])
    return check_int(name, value)


def prompt_tuning_embedding(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size: int):
    """Embed ids: `< vocab_size` from the vocabulary, the rest from `prompt_table[(id - V) + task * tvs]`.

    A fake id whose row lies past the table, or whose row holds NaN or ±inf, is refused with its position.
    """
    input_ids = as_batch(input_ids)  # [B, L]
    for name, value in (("vocab_embedding", vocab_embedding), ("prompt_table", prompt_table)):
        if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
            raise TypeError(
                f"{name} must be a floating-point torch.Tensor, got "
                f"{value.dtype if isinstance(value, torch.Tensor) else type(value).__name__}"
            )
    if vocab_embedding.dim() != 2:
        raise ValueError(f"vocab_embedding must be [vocab rows, H], got shape {tuple(vocab_embedding.shape)}")
    hidden = vocab_embedding.shape[1]
    vocab_size = check_int("vocab_size", vocab_size, 1)
    if vocab_size > vocab_embedding.shape[0]:
        raise ValueError(f"vocab_size {vocab_size} exceeds the {vocab_embedding.shape[0]} rows of vocab_embedding")
    if prompt_table.dim() != 2 or prompt_table.shape[1] != hidden:
        raise ValueError(
            f"prompt_table must be [rows, {hidden}] (the model's hidden size), got {tuple(prompt_table.shape)}"
        )
    if prompt_table.dtype != vocab_embedding.dtype:
        raise TypeError(
            f"prompt_table dtype {prompt_table.dtype} != model dtype {vocab_embedding.dtype}; cast it with ptuning_setup(…, dtype)"
        )
    if bool((input_ids < 0).any()):
        b, pos = (input_ids < 0).nonzero()[0].tolist()
        raise ValueError(
            f"input_ids must be non-negative token ids, got {int(input_ids[b, pos])} at row {b}, position {pos}"
        )
    tasks = as_int_tensor(tasks if isinstance(tasks, (torch.Tensor, np.ndarray, list, tuple)) else [tasks], "tasks")
    tasks = tasks.to(input_ids.device).reshape(-1)
    if tasks.shape[0] != input_ids.shape[0]:
        raise ValueError(f"{tasks.shape[0]} tasks for a batch of {input_ids.shape[0]}: give one task per sequence")
    if (tasks < 0).any():
        raise ValueError(f"tasks must be non-negative, got {tasks.tolist()}")
    task_vocab_size = _one_int(task_vocab_size, "task_vocab_size")
    if task_vocab_size < 0:
        raise ValueError(
            f"task_vocab_size must be >= 0 (table rows per task), got {task_vocab_size}; "
            "a negative one would read rows from the end of the table"
        )
    mask = input_ids >= vocab_size  # [B, L]
    embeddings = vocab_embedding[torch.where(mask, vocab_size - 1, input_ids)]  # [B, L, H]
    if not bool(mask.any()):
        return embeddings
    num_rows = prompt_table.shape[0]
    offsets = torch.where(mask, input_ids - vocab_size, 0)  # [B, L]
    starts = [int(t) * task_vocab_size for t in tasks.tolist()]  # first row of each sequence's task
    rows = offsets + torch.tensor([min(s, num_rows) for s in starts], device=input_ids.device)[:, None]  # [B, L]
    past = mask & ((offsets >= num_rows) | (rows >= num_rows))
    if bool(past.any()):
        b, pos = past.nonzero()[0].tolist()
        raise ValueError(
            f"fake prompt id {int(input_ids[b, pos])} at row {b}, position {pos} (task {int(tasks[b])}) reads row "
            f"{int(input_ids[b, pos]) - vocab_size + starts[b]} of a prompt table with {num_rows} rows; "
            "ids >= vocab_size must index rows of the table given for their sequence's task"
        )
    picked = prompt_table[rows[mask]]  # [M, H]
    bad = first_non_finite(picked)
    if bad is not None:
        b, pos = mask.nonzero()[bad[0]].tolist()
        raise ValueError(
            f"prompt_table row {int(rows[b, pos])} (read by fake prompt id {int(input_ids[b, pos])} at row {b}, "
            f"position {pos}) holds NaN or infinite values; rebuild the table from finite image features (ptuning_setup "
            "refuses non-finite input_vit)"
        )
    embeddings[mask] = picked  # the prompt rows replace the (clamped) vocab rows
    return embeddings


def images_per_row(img_pos: torch.Tensor, batch_size: int) -> list[int]:
    """Number of images in each sequence of the batch."""
    return torch.bincount(img_pos[:, 0], minlength=batch_size).tolist() if len(img_pos) else [0] * batch_size


def single_table_batch(input_ids, input_vit: torch.Tensor, vocab_size: int, image_start_id: int = IMAGE_START_ID):
    """Python-session convention: one table, ids increase over all images, tasks all 0."""
    input_ids = as_batch(input_ids)
    img_pos = locate_img_pos(input_ids, image_start_id)
    check_image_count(img_pos, input_vit)
    fake_prompt_id = make_fake_prompt_ids(vocab_size, input_vit.shape[0], input_vit.shape[1])  # [N, 256]
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
    (`BuildConfig.rows_per_request`), fixed when the engine is built. Left out, the block is the smallest that holds
    this batch's fullest request: a layout for runners that take one table of any block size (this package's engine,
    TensorRT-LLM's Python ModelRunner), not the one the C++ executor builds.
    """
    input_ids = as_batch(input_ids)
    img_pos = locate_img_pos(input_ids, image_start_id)
    check_image_count(img_pos, input_vit)
    span = input_vit.shape[1]
    counts = images_per_row(img_pos, input_ids.shape[0])
    needed = max(counts, default=0) * span
    rows_per_request = needed if rows_per_request is None else check_int("rows_per_request", rows_per_request, 0)
    if needed > rows_per_request:
        raise ValueError(
            f"a request has {needed // span} images = {needed} table rows, but each request may hold only "
            f"{rows_per_request} (max_prompt_embedding_table_size / max_batch_size); send fewer images per request"
        )
    fake_prompt_id = torch.cat([make_fake_prompt_ids(vocab_size, n, span) for n in counts])  # [N, 256]
    ids = replace_image_spans(input_ids, img_pos, fake_prompt_id)
    table = input_vit.new_zeros(input_ids.shape[0], max(rows_per_request, 1), input_vit.shape[-1])  # [B, rows, H]
    first = 0
    for position, n in enumerate(counts):
        table[position, : n * span] = input_vit[first : first + n].reshape(-1, input_vit.shape[-1])
        first += n
    tasks = torch.arange(input_ids.shape[0], dtype=torch.int32)
    return ids, table.reshape(-1, input_vit.shape[-1]), tasks, table.shape[1]


def check_image_count(img_pos: torch.Tensor, input_vit: torch.Tensor) -> None:
    """Raise when the ids hold a different number of image spans than `input_vit` has images."""
    if not isinstance(input_vit, torch.Tensor):
        raise TypeError(
            f"input_vit must be a torch.Tensor [N, 256, H] (the vision tower's output), got {type(input_vit).__name__}"
        )
    if input_vit.dim() != 3 or img_pos.shape[0] != input_vit.shape[0]:
        raise ValueError(
            f"the ids hold {img_pos.shape[0]} image spans but input_vit has shape {tuple(input_vit.shape)}; "
            "give one [256, H] feature block per image, in order"
        )


# Which rows each fake id reads: the lookup's rule, row by row, and the table's layout it gives


def lookup_rows(input_ids, tasks, task_vocab_size, vocab_size: int, table_rows: int | None = None) -> torch.Tensor:
    """(sequence, position, fake id, table row) of every id >= vocab_size: row = id - V + task × task_vocab_size."""
    input_ids = as_batch(input_ids)  # [B, L]
    tasks = torch.as_tensor(tasks).reshape(-1).long()
    if tasks.shape[0] != input_ids.shape[0]:
        raise ValueError(f"{tasks.shape[0]} tasks for a batch of {input_ids.shape[0]}: give one task per sequence")
    if (tasks < 0).any():
        raise ValueError(f"tasks must be non-negative, got {tasks.tolist()}")
    task_vocab_size = int(torch.as_tensor(task_vocab_size).reshape(-1)[0])
    seq, pos = torch.where(input_ids >= vocab_size)
    fake = input_ids[seq, pos]
    rows = fake - vocab_size + tasks[seq] * task_vocab_size
    if table_rows is not None and len(rows) and int(rows.max()) >= table_rows:
        raise ValueError(
            f"a fake id reads row {int(rows.max())} but the prompt table has {table_rows} rows "
            "(on a GPU engine this read would go out of bounds)"
        )
    return torch.stack([seq, pos, fake, rows], dim=1)  # [M, 4]


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
    tasks = torch.as_tensor(tasks).reshape(-1)
    if tasks.shape[0] != len(sequences):
        raise ValueError(f"{tasks.shape[0]} tasks for {len(sequences)} requests: give one task per request")
    table_rows = check_int("table_rows", table_rows, 1)
    used = []
    for request, (ids, task) in enumerate(zip(sequences, tasks.tolist())):
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
