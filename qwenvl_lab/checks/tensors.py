"""Checks of what is handed over as tensors: token ids, tasks, dtypes, prompt tables, image spans, finite values.

Each raises a TypeError for a value of the wrong kind and a ValueError for a value out of its range, with what was
wrong and what to do; each returns what it checked in the form the rule then uses.
"""

import numpy as np
import torch

from .values import check_int, is_int

INT32_MAX = torch.iinfo(torch.int32).max  # TensorRT-LLM keeps tasks and task_vocab_size as int32
INT64_MAX = torch.iinfo(torch.int64).max
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# weight-only precision → TensorRT-LLM's quant_algo (convert_checkpoint.py's args_to_quant_config: W8A16)
WEIGHT_ONLY = {"int8": "W8A16"}


# token ids


def as_int_tensor(values, name: str = "input_ids") -> torch.Tensor:
    """An int64 tensor from a tensor, numpy array or (nested) list of ints; `name` says what they are in errors."""
    if isinstance(values, torch.Tensor):
        if values.numel() == 0:
            return values.long()  # torch.tensor([]) is float32
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {values.dtype}")
        if values.dtype == torch.uint64 and int(values.max()) > INT64_MAX:
            raise ValueError(f"{name} hold {int(values.max())}, past the largest int64 {INT64_MAX}")
        return values.long()
    if not isinstance(values, (list, tuple, range, np.ndarray)):
        raise TypeError(
            f"{name} must be a torch tensor, a numpy array or a (nested) list of ints, got {type(values).__name__}"
        )
    try:
        array = np.asarray(values)
    except ValueError:
        raise ValueError(f"the rows of {name} have different lengths: pad them to one length") from None
    if array.size == 0 and array.dtype.kind == "f":
        array = array.astype(np.int64)  # [] and [[]] hold nothing, whatever numpy guesses
    if array.dtype.kind == "O" and all(is_int(i) for i in array.flat):
        outside = [int(i) for i in array.flat if not -INT64_MAX - 1 <= i <= INT64_MAX]
        if outside:
            raise ValueError(f"{name} hold {outside[0]}, outside int64 (token ids and positions are below 2**63)")
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        example = f" (e.g. {array.flat[0]!r})" if array.size else ""
        raise TypeError(f"{name} must hold integers, got numpy dtype {array.dtype}{example}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > INT64_MAX:
        raise ValueError(f"{name} hold {int(array.max())}, past the largest int64 {INT64_MAX}")
    return torch.from_numpy(array.astype(np.int64))


def as_batch(input_ids) -> torch.Tensor:
    """`input_ids` as a 2-D int64 tensor [B, L] (a single sequence becomes a batch of one)."""
    ids = as_int_tensor(input_ids, "input_ids")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be [L] or [B, L], got shape {tuple(ids.shape)}")
    return ids


def check_token_ids(ids: torch.Tensor, request: str) -> None:
    """Refuse a negative id in `ids` (one request [L], or a batch [B, L]), naming its position."""
    negative = torch.nonzero(ids < 0)
    if len(negative):
        where = tuple(int(i) for i in negative[0])
        raise ValueError(
            f"{request}: token ids must be non-negative, got {int(ids[where])} at position "
            f"{where[-1] if len(where) == 1 else where}"
        )


def as_id_list(batch_input_ids) -> list[torch.Tensor]:
    """TensorRT-LLM's batch_input_ids as a list of 1-D int64 tensors, one per request (a [B, L] tensor split by row),
    each non-empty with ids >= 0."""
    if isinstance(batch_input_ids, torch.Tensor):
        batch_input_ids = list(batch_input_ids) if batch_input_ids.dim() == 2 else [batch_input_ids]
    if not isinstance(batch_input_ids, (list, tuple)) or not batch_input_ids:
        raise ValueError("batch_input_ids must be a non-empty list of 1-D token-id tensors, one per request")
    ids = []
    for i, seq in enumerate(batch_input_ids):
        seq = as_int_tensor(seq, f"request {i}")
        if seq.dim() != 1 or seq.numel() == 0:
            raise ValueError(f"request {i}: expected a non-empty 1-D tensor of token ids, got shape {tuple(seq.shape)}")
        check_token_ids(seq, f"request {i}")
        ids.append(seq)
    return ids


def one_int(value, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """An int given as a Python/numpy int or a one-element integer tensor or array (run.py passes task_vocab_size as
    a tensor [1])."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        values = as_int_tensor(value, name).reshape(-1)
        if values.numel() != 1:
            raise ValueError(f"{name} must be one int, got {values.numel()} values")
        value = int(values[0])
    return check_int(name, value, minimum, maximum)


# dtypes


def to_torch_dtype(dtype) -> torch.dtype:
    """A torch.dtype from "float16"/"bfloat16"/"float32" or a torch.dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be one of {sorted(DTYPES)} or a torch.dtype, got {type(dtype).__name__} {dtype!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or a torch.dtype")
    return DTYPES[dtype]


def check_weight_only(weight_only):
    """`weight_only` if it is None (no quantization) or a weight-only precision this package builds, else a
    ValueError."""
    if weight_only is not None and not (isinstance(weight_only, str) and weight_only in WEIGHT_ONLY):
        raise ValueError(
            f"weight_only must be None or one of {sorted(WEIGHT_ONLY)} (TensorRT-LLM's --weight_only_precision), "
            f"got {weight_only!r}"
        )
    return weight_only


def dtype_name(dtype) -> str:
    """ "float16"/"bfloat16"/"float32" for a dtype given as that name or as one of those torch.dtypes."""
    names = {v: k for k, v in DTYPES.items()}
    if isinstance(dtype, torch.dtype) and dtype in names:
        return names[dtype]
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    raise ValueError(f"dtype must be one of {sorted(DTYPES)} (or the torch.dtype), got {dtype!r}")


# tasks


def parse_tasks(tasks, batch_size: int | None, name: str = "tasks", num_tables: int | None = None) -> list[int]:
    """Task ids from run.py's "0,1,…" or a sequence / tensor of ints: one per request (`batch_size` of them unless
    None), each >= 0 (and naming one of `num_tables` tables when given)."""
    if isinstance(tasks, str):
        try:
            values = [int(t) for t in tasks.split(",")]
        except ValueError:
            raise ValueError(f'{name} must be a comma-separated list of integers like "0,1", got {tasks!r}') from None
    else:
        values = as_int_tensor(tasks if isinstance(tasks, (torch.Tensor, np.ndarray, list, tuple)) else [tasks], name)
        values = values.reshape(-1).tolist()
    if batch_size is not None and len(values) != batch_size:
        raise ValueError(f"{len(values)} {name} for {batch_size} requests: give one task per request")
    if num_tables is not None and any(not 0 <= t < num_tables for t in values):
        raise ValueError(f"{name} {values} must each name one of the {num_tables} tables (0…{num_tables - 1})")
    if any(not 0 <= t <= INT32_MAX for t in values):
        raise ValueError(
            f"{name} must be in [0, {INT32_MAX}] (a task selects a block of table rows; TensorRT-LLM keeps them as "
            f"int32), got {values}"
        )
    return values


# finite values


def first_non_finite(values: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first NaN or ±inf in `values`, or None when all are finite."""
    if bool(torch.isfinite(values.sum())):  # a NaN or inf makes the sum non-finite; an overflow is checked below
        return None
    bad = ~torch.isfinite(values)
    return tuple(int(i) for i in bad.nonzero()[0]) if bool(bad.any()) else None


def check_finite(values: torch.Tensor, where, fix: str) -> None:
    """Refuse NaN or ±inf in `values`: `where(index)` names the first such value, `fix` says what to do."""
    bad = first_non_finite(values)
    if bad is not None:
        raise ValueError(f"{where(bad)} holds NaN or infinite values: {fix}")


def cast_finite(name: str, tensor: torch.Tensor, dtype) -> torch.Tensor:
    """`tensor` in `dtype`, refused (a ValueError naming the weight) when finite values overflow to ±inf in it: float16
    holds magnitudes up to 65504, bfloat16 float32's range."""
    dtype = to_torch_dtype(dtype)
    cast = tensor.to(dtype)
    if cast.is_floating_point() and first_non_finite(cast) is not None:
        overflowed = torch.isfinite(tensor) & ~torch.isfinite(cast)
        if bool(overflowed.any()):
            largest = float(tensor[overflowed].abs().max())
            raise ValueError(
                f"{name}: {int(overflowed.sum())} finite value(s) overflow to inf in {dtype_name(dtype)} (largest "
                f"magnitude {largest:.4g}, {dtype_name(dtype)} holds up to {torch.finfo(dtype).max:.4g}), so every "
                "answer would be garbage: build in bfloat16 (--dtype bfloat16), which keeps float32's range"
            )
    return cast


# image spans and fake ids


def check_image_spans(input_ids, image_start_id: int, span: int | None) -> torch.Tensor:
    """`input_ids` as a batch [B, L] in which every `<img>` (image_start_id) is closed by `</img>` (image_start_id + 1)
    before the next `<img>`, in the same row, `span` ids later (None: any number of ids, at least one)."""
    input_ids = as_batch(input_ids)
    image_start_id = check_int("image_start_id", image_start_id, 0, INT64_MAX - 1)
    span = None if span is None else check_int("span", span, 0)
    tags = (input_ids == image_start_id) | (input_ids == image_start_id + 1)
    for row, positions in enumerate(tags.tolist()):
        found = [(k, int(input_ids[row, k]) == image_start_id) for k, tag in enumerate(positions) if tag]
        starts, ends = sum(opens for _, opens in found), sum(not opens for _, opens in found)
        if starts != ends:
            raise ValueError(
                f"row {row}: {starts} <img> (id {image_start_id}) but {ends} </img> (id {image_start_id + 1}); every "
                "image span needs both tags — build prompts with tokenizer.from_list_format([{'image': path}, …]) "
                "instead of editing ids by hand"
            )
        for (a, a_opens), (b, b_opens) in zip(found[::2], found[1::2]):
            if not a_opens or b_opens:
                raise ValueError(
                    f"row {row}: image tags are unbalanced or nested near positions {a} and {b}; each <img> must be "
                    "closed by </img> before the next <img>"
                )
            if span is not None and b - a - 1 != span:
                raise ValueError(
                    f"row {row}: the image span <img>@{a} … </img>@{b} holds {b - a - 1} ids, but a span holds exactly "
                    f"{span} here, one per row of its picture's features (Qwen-VL's tokenizer pads the path bytes "
                    "with <imgpad> to that length)"
                )
            if span is None and b - a - 1 < 1:
                raise ValueError(
                    f"row {row}: the image span <img>@{a} … </img>@{b} holds no ids; a picture needs one position per "
                    "row of its features"
                )
    return input_ids


def check_fake_id_counts(vocab_size, num_images, tokens_per_image) -> None:
    """Refuse counts that make no fake ids: vocab_size > 0, num_images >= 0, tokens_per_image > 0, ids within int64."""
    vocab_size = check_int("vocab_size", vocab_size, 1)
    num_images = check_int("num_images", num_images, 0)
    tokens_per_image = check_int("tokens_per_image", tokens_per_image, 1)
    if vocab_size + num_images * tokens_per_image - 1 > INT64_MAX:
        raise ValueError(
            f"fake prompt ids from {vocab_size} for {num_images} images of {tokens_per_image} ids pass the "
            f"largest int64 id {INT64_MAX}"
        )


def check_span_replacement(input_ids, img_pos, fake_prompt_id) -> tuple[torch.Tensor, torch.Tensor, list]:
    """(input_ids [B, L], img_pos [N, 3], one 1-D tensor of fake ids per image) once each image k's span (i, a, b)
    lies inside the ids, overlaps no other and has as many positions as image k has fake ids (`fake_prompt_id`:
    [N, span] or a list of N 1-D tensors, one per span's length)."""
    input_ids = as_batch(input_ids)
    img_pos = as_int_tensor(img_pos, "img_pos")
    if img_pos.numel() == 0:
        img_pos = img_pos.reshape(0, 3)
    if img_pos.dim() == 1 and img_pos.shape[0] == 3:
        img_pos = img_pos[None]  # one image
    if img_pos.dim() != 2 or img_pos.shape[1] != 3:
        raise ValueError(
            f"img_pos must be [N, 3] (batch row, <img> index, </img> index), got shape {tuple(img_pos.shape)}; "
            "make it with locate_img_pos"
        )
    if isinstance(fake_prompt_id, (list, tuple)):
        rows = [as_int_tensor(ids, f"fake_prompt_id[{k}]").reshape(-1) for k, ids in enumerate(fake_prompt_id)]
    else:
        fake_prompt_id = as_int_tensor(fake_prompt_id, "fake_prompt_id")
        if fake_prompt_id.dim() != 2:
            raise ValueError(
                f"fake_prompt_id must be [N, span] (one row per image) or a list of one 1-D tensor per image, got "
                f"shape {tuple(fake_prompt_id.shape)}; make it with make_fake_prompt_ids or fake_ids_for_spans"
            )
        rows = list(fake_prompt_id)
    if img_pos.shape[0] != len(rows):
        raise ValueError(
            f"{img_pos.shape[0]} image spans in img_pos but {len(rows)} rows of fake_prompt_id; "
            "make one row of fake ids per image"
        )
    batch, length = input_ids.shape
    previous = {}  # batch row → end of its last span
    for k, (i, a, b) in sorted(enumerate(img_pos.tolist()), key=lambda item: item[1]):
        if not (0 <= i < batch and 0 <= a < b < length):
            raise ValueError(
                f"image {k}: img_pos ({i}, {a}, {b}) lies outside input_ids of shape {(batch, length)}; "
                "make img_pos with locate_img_pos from these ids"
            )
        if a <= previous.get(i, -1):
            raise ValueError(f"image {k}: span {a}…{b} in row {i} overlaps the span before it; spans must not overlap")
        if b - a - 1 != len(rows[k]):
            raise ValueError(f"image {k}: span {a}…{b} holds {b - a - 1} ids but its fake ids are {len(rows[k])}")
        previous[i] = b
    return input_ids, img_pos, rows


# image features and prompt tables


def feature_blocks(input_vit) -> list[torch.Tensor]:
    """One [rows, H] block per picture from `input_vit` [N, rows, H] (Qwen-VL's vision tower) or a list of [rows_k, H]
    blocks of one width and dtype (pictures of any span length)."""
    if isinstance(input_vit, (list, tuple)):
        blocks = list(input_vit)
        for k, block in enumerate(blocks):
            if not isinstance(block, torch.Tensor):
                raise TypeError(f"picture {k}'s features must be a torch.Tensor [rows, H], got {type(block).__name__}")
            if block.dim() != 2:
                raise ValueError(f"picture {k}'s features must be [rows, H], got shape {tuple(block.shape)}")
        if len({(b.shape[1], b.dtype) for b in blocks}) > 1:
            raise ValueError(
                "the pictures' features must share one width H and dtype, got "
                f"{[(tuple(b.shape), str(b.dtype)) for b in blocks]}"
            )
        return blocks
    if not isinstance(input_vit, torch.Tensor):
        raise TypeError(
            "input_vit must be a torch.Tensor [N, rows, H] (the vision tower's output) or a list of [rows, H] blocks, "
            f"got {type(input_vit).__name__}"
        )
    if input_vit.dim() != 3:
        raise ValueError(
            f"input_vit must be [N, rows, H], one block of feature rows per picture, got shape {tuple(input_vit.shape)}"
        )
    return list(input_vit)


def check_span_rows(lengths: list[int], blocks: list[torch.Tensor]) -> None:
    """Refuse features that do not fill the image spans: one block per span, as many rows as the span has ids."""
    if len(lengths) != len(blocks):
        raise ValueError(
            f"the ids hold {len(lengths)} image spans but the features are for {len(blocks)} pictures; "
            "give one feature block per image span, in order"
        )
    for k, (n, block) in enumerate(zip(lengths, blocks)):
        if block.shape[0] != n:
            raise ValueError(
                f"image span {k} holds {n} ids but its picture's features have {block.shape[0]} rows; a span holds "
                "one id per feature row"
            )


def check_features(input_vit, hidden_size: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """The pictures' feature blocks [rows, hidden_size] (`feature_blocks`) once floating-point, finite, and finite once
    cast to `dtype`."""
    blocks = feature_blocks(input_vit)
    for block in [input_vit] if isinstance(input_vit, torch.Tensor) else blocks:  # an empty [0, rows, H] too
        if not block.dtype.is_floating_point:
            raise TypeError(
                f"input_vit must hold floating-point features (the vision tower's output), got dtype {block.dtype}"
            )
    for k, block in enumerate(blocks):
        if block.shape[1] != hidden_size:
            raise ValueError(
                f"prompt table hidden size {block.shape[1]} != model hidden_size {hidden_size}; "
                "the vision tower's output_dim must equal the language model's hidden_size"
            )
        check_finite(
            block,
            lambda i, k=k: f"input_vit image {k} (its query {i[0]}, feature {i[1]})",
            "the vision tower gave them for that picture; check its weights and dtype",
        )
        bad = first_non_finite(block.to(dtype))
        if bad is not None:
            raise ValueError(
                f"input_vit image {k} holds {float(block[bad]):g} at query {bad[0]}, feature {bad[1]}, which "
                f"{dtype} cannot hold (it becomes inf); use a wider dtype (float32 or bfloat16) or check the vision tower"
            )
    return blocks


def check_rows_per_request(
    most_rows: int, rows_per_request, block: str = "max_prompt_embedding_table_size / max_batch_size"
) -> int:
    """The table rows each request gets: `rows_per_request` (the executor's block, `block` says how it was computed)
    when the fullest request's `most_rows` fit in it; left out (None), just those rows."""
    rows_per_request = most_rows if rows_per_request is None else check_int("rows_per_request", rows_per_request, 0)
    if most_rows > rows_per_request:
        raise ValueError(
            f"a request's pictures need {most_rows} table rows, but each request may hold only {block} = "
            f"{rows_per_request} rows; send fewer pictures per request, or rebuild with a larger table"
        )
    return rows_per_request


def check_table(prompt_table, hidden_size: int, dtype, per_task: bool = False) -> torch.Tensor:
    """A prompt table for the model: a floating-point tensor [rows, H] (or, with per_task, [tables, rows, H]), H the
    model's hidden size, in the model's dtype."""
    if not isinstance(prompt_table, torch.Tensor) or not prompt_table.dtype.is_floating_point:
        raise TypeError(
            "prompt_table must be a floating-point torch.Tensor (or a .npy path for a runner), got "
            f"{prompt_table.dtype if isinstance(prompt_table, torch.Tensor) else type(prompt_table).__name__}"
        )
    shapes = (2, 3) if per_task else (2,)
    if prompt_table.dim() not in shapes or prompt_table.shape[-1] != hidden_size:
        raise ValueError(
            f"prompt_table must be [rows, {hidden_size}] (with task_vocab_size)"
            + (f" or [tables, rows, {hidden_size}] (one table per task)" if per_task else "")
            + f", {hidden_size} being the model's hidden size; got {tuple(prompt_table.shape)}"
        )
    if prompt_table.dtype != to_torch_dtype(dtype):
        raise TypeError(
            f"prompt_table is {prompt_table.dtype} but the model runs in {to_torch_dtype(dtype)}: cast it "
            "(ptuning_setup(input_vit, dtype=…, …) does)"
        )
    return prompt_table


def check_lookup_inputs(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    """(input_ids [B, L], tasks [B] int64, task_vocab_size int) for the prompt-table lookup, once the embeddings and
    the table are floating-point of one width and dtype, the ids non-negative, one task per sequence."""
    input_ids = as_batch(input_ids)  # [B, L]
    if not isinstance(vocab_embedding, torch.Tensor) or not vocab_embedding.dtype.is_floating_point:
        raise TypeError(
            "vocab_embedding must be a floating-point torch.Tensor, got "
            f"{vocab_embedding.dtype if isinstance(vocab_embedding, torch.Tensor) else type(vocab_embedding).__name__}"
        )
    if vocab_embedding.dim() != 2:
        raise ValueError(f"vocab_embedding must be [vocab rows, H], got shape {tuple(vocab_embedding.shape)}")
    vocab_size = check_int("vocab_size", vocab_size, 1)
    if vocab_size > vocab_embedding.shape[0]:
        raise ValueError(f"vocab_size {vocab_size} exceeds the {vocab_embedding.shape[0]} rows of vocab_embedding")
    check_table(prompt_table, vocab_embedding.shape[1], vocab_embedding.dtype)
    for b, ids in enumerate(input_ids):
        check_token_ids(ids, f"request {b}")
    tasks = torch.tensor(parse_tasks(tasks, input_ids.shape[0]), device=input_ids.device)  # [B]
    task_vocab_size = one_int(task_vocab_size, "task_vocab_size", 0, INT32_MAX)
    return input_ids, tasks, task_vocab_size


def check_rows_in_table(request: int, ids, rows, vocab_size: int, end: int, where: str) -> torch.Tensor:
    """The positions of request `request`'s fake ids (ids [L] >= vocab_size) once the table row each reads (rows [L])
    lies before `end`, the rows its task may read (`where` says which they are; on a GPU engine a row past them is
    read out of bounds)."""
    fake = torch.nonzero(ids >= vocab_size)[:, 0]  # positions of the fake ids
    past = torch.nonzero((ids[fake] - vocab_size >= end) | (rows[fake] >= end))  # the first test: rows past int64
    if len(past):
        k = int(fake[past[0]])
        raise ValueError(
            f"request {request}: id {int(ids[k])} at position {k} reads prompt-table row {int(rows[k])}, but {where}; "
            "ids must lie in [0, vocab_size + table rows)"
        )
    return fake


def check_rows_read(request: int, ids, rows, vocab_size: int, table: torch.Tensor, end: int, where: str) -> None:
    """Refuse a fake id of request `request` whose table row lies at or past `end` (`check_rows_in_table`), or holds
    NaN or ±inf."""
    fake = check_rows_in_table(request, ids, rows, vocab_size, end, where)
    check_finite(
        table[rows[fake]],
        lambda n: (
            f"request {request}: prompt-table row {int(rows[fake[n[0]]])} (read by id {int(ids[fake[n[0]]])} "
            f"at position {int(fake[n[0]])})"
        ),
        "rebuild the table from finite image features (ptuning_setup refuses non-finite input_vit)",
    )
