"""Step 4 — the prompt table: `ptuning_setup` and TensorRT-LLM's `PromptTuningEmbedding` lookup."""

from pathlib import Path

import numpy as np
import torch

from .fake_ids import make_fake_prompt_ids, replace_image_spans
from .img_pos import as_batch, locate_img_pos
from .tokenizing import IMAGE_START_ID

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_torch_dtype(dtype) -> torch.dtype:
    """Accept "float16"/"bfloat16"/"float32" or a torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
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


def ptuning_setup(prompt_table, dtype, hidden_size: int, tasks=None, input_ids=None):
    """Flatten `input_vit` into the engine's table: returns `(prompt_table, tasks, task_vocab_size)`."""
    input_ids = None if input_ids is None else as_batch(input_ids)
    device = prompt_table.device if prompt_table is not None else (input_ids.device if input_ids is not None else "cpu")
    if prompt_table is not None:
        if prompt_table.dim() != 3:
            raise ValueError(f"prompt_table must be input_vit [N, 256, H], got shape {tuple(prompt_table.shape)}")
        task_vocab_size = torch.tensor([prompt_table.shape[1]], dtype=torch.int32, device=device)  # 256
        prompt_table = prompt_table.reshape(-1, prompt_table.shape[2])  # [N*256, H]
        if prompt_table.shape[1] != hidden_size:
            raise ValueError(
                f"prompt table hidden size {prompt_table.shape[1]} != model hidden_size {hidden_size}; "
                "the vision tower's output_dim must equal the language model's hidden_size"
            )
        prompt_table = prompt_table.to(to_torch_dtype(dtype))
    else:
        prompt_table = torch.empty([1, hidden_size], dtype=to_torch_dtype(dtype), device=device)
        task_vocab_size = torch.zeros([1], dtype=torch.int32, device=device)
    batch_size = input_ids.shape[0] if input_ids is not None else 1
    if tasks is not None:
        try:
            tasks = torch.tensor([int(t) for t in str(tasks).split(",")], dtype=torch.int32, device=device)
        except ValueError:
            raise ValueError(f'tasks must be a comma-separated list of integers like "0,1", got {tasks!r}') from None
        if (tasks < 0).any():
            raise ValueError(f"tasks must be non-negative (a task selects a block of table rows), got {tasks.tolist()}")
        if tasks.shape[0] != batch_size:
            raise ValueError(f"{tasks.shape[0]} tasks given for a batch of {batch_size}: give one task per sequence")
    else:
        tasks = torch.zeros([batch_size], dtype=torch.int32, device=device)
    return prompt_table, tasks, task_vocab_size


def prompt_tuning_embedding(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size: int):
    """Embed ids: `< vocab_size` from the vocabulary, the rest from `prompt_table[(id - V) + task * tvs]`."""
    input_ids = as_batch(input_ids)  # [B, L]
    hidden = vocab_embedding.shape[1]
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
    if (input_ids < 0).any():
        raise ValueError("input_ids must be non-negative token ids")
    tasks = torch.as_tensor(tasks, device=input_ids.device).reshape(-1).long()
    if tasks.shape[0] != input_ids.shape[0]:
        raise ValueError(f"{tasks.shape[0]} tasks for a batch of {input_ids.shape[0]}: give one task per sequence")
    if (tasks < 0).any():
        raise ValueError(f"tasks must be non-negative, got {tasks.tolist()}")
    task_vocab_size = int(torch.as_tensor(task_vocab_size).reshape(-1)[0])
    mask = input_ids > vocab_size - 1  # [B, L]
    embeddings = vocab_embedding[torch.where(mask, vocab_size - 1, input_ids)]  # [B, L, H]
    rows = torch.where(mask, input_ids - vocab_size, 0) + tasks[:, None] * task_vocab_size  # [B, L]
    if mask.any():
        bad = rows[mask].max()
        if bad >= prompt_table.shape[0]:
            raise ValueError(
                f"fake prompt id reads row {int(bad)} of a prompt table with {prompt_table.shape[0]} rows; "
                "ids >= vocab_size must index rows of the table given for their sequence's task"
            )
        embeddings[mask] = prompt_table[rows[mask]]  # the prompt rows replace the (clamped) vocab rows
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


def per_request_tables(input_ids, input_vit: torch.Tensor, vocab_size: int, rows_per_request: int | None = None,
                       image_start_id: int = IMAGE_START_ID):
    """In-flight-batching convention: each request's ids restart at vocab_size; its table sits at slot × rows."""
    input_ids = as_batch(input_ids)
    img_pos = locate_img_pos(input_ids, image_start_id)
    check_image_count(img_pos, input_vit)
    span = input_vit.shape[1]
    counts = images_per_row(img_pos, input_ids.shape[0])
    needed = max(counts, default=0) * span
    rows_per_request = needed if rows_per_request is None else rows_per_request
    if needed > rows_per_request:
        raise ValueError(
            f"a request has {needed // span} images = {needed} table rows, but each request may hold only "
            f"{rows_per_request} (max_prompt_embedding_table_size / max_batch_size); send fewer images per request"
        )
    fake_prompt_id = torch.cat([make_fake_prompt_ids(vocab_size, n, span) for n in counts])  # [N, 256]
    ids = replace_image_spans(input_ids, img_pos, fake_prompt_id)
    table = input_vit.new_zeros(input_ids.shape[0], max(rows_per_request, 1), input_vit.shape[-1])  # [B, rows, H]
    first = 0
    for slot, n in enumerate(counts):
        table[slot, : n * span] = input_vit[first : first + n].reshape(-1, input_vit.shape[-1])
        first += n
    tasks = torch.arange(input_ids.shape[0], dtype=torch.int32)
    return ids, table.reshape(-1, input_vit.shape[-1]), tasks, table.shape[1]


def check_image_count(img_pos: torch.Tensor, input_vit: torch.Tensor) -> None:
    """Raise when the ids hold a different number of image spans than `input_vit` has images."""
    if input_vit.dim() != 3 or img_pos.shape[0] != input_vit.shape[0]:
        raise ValueError(
            f"the ids hold {img_pos.shape[0]} image spans but input_vit has shape {tuple(input_vit.shape)}; "
            "give one [256, H] feature block per image, in order"
        )
