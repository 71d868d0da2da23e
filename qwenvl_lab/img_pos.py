"""Notebook 02 — locating `img_pos`: where each image span starts and ends in a batch of ids."""

import numbers

import numpy as np
import torch

from .tokenizing import IMAGE_START_ID, IMG_TOKEN_SPAN

INT64_MAX = torch.iinfo(torch.int64).max


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int: a TypeError for a non-integer (bool, float, str …), a ValueError outside [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = (
            f">= {minimum}" if maximum is None else f"<= {maximum}" if minimum is None else f"in [{minimum}, {maximum}]"
        )
        raise ValueError(f"{name} must be an int {bounds}, got {value}")
    return int(value)


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
    if array.dtype.kind == "O" and all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in array.flat):
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
    """Return `input_ids` as a 2-D int64 tensor [B, L] (a single sequence becomes a batch of one)."""
    ids = as_int_tensor(input_ids, "input_ids")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be [L] or [B, L], got shape {tuple(ids.shape)}")
    return ids


def locate_img_pos(input_ids, image_start_id: int = IMAGE_START_ID, span: int = IMG_TOKEN_SPAN) -> torch.Tensor:
    """Find every `<img>`…`</img>` pair: `img_pos` [N, 3] = (batch row, `<img>` index, `</img>` index)."""
    input_ids = as_batch(input_ids)  # [B, L]
    image_start_id = check_int("image_start_id", image_start_id, 0, INT64_MAX - 1)
    span = check_int("span", span, 0)
    bos_pos = torch.where(input_ids == image_start_id)
    eos_pos = torch.where(input_ids == image_start_id + 1)
    rows = []
    for row in range(input_ids.shape[0]):
        starts = bos_pos[1][bos_pos[0] == row].tolist()
        ends = eos_pos[1][eos_pos[0] == row].tolist()
        if len(starts) != len(ends):
            raise ValueError(
                f"row {row}: {len(starts)} <img> (id {image_start_id}) but {len(ends)} </img> "
                f"(id {image_start_id + 1}); every image span needs both tags — build prompts with "
                "tokenizer.from_list_format([{'image': path}, …]) instead of editing ids by hand"
            )
        for k, (a, b) in enumerate(zip(starts, ends)):
            if b < a or (k + 1 < len(starts) and starts[k + 1] < b):
                raise ValueError(
                    f"row {row}: image tags are unbalanced or nested near positions {a} and {b}; "
                    "each <img> must be closed by </img> before the next <img>"
                )
            if b - a - 1 != span:
                raise ValueError(
                    f"row {row}: the image span <img>@{a} … </img>@{b} holds {b - a - 1} ids, "
                    f"but Qwen-VL spans hold exactly {span} (path bytes padded with <imgpad>)"
                )
            rows.append((row, a, b))
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 3)  # [N, 3]
