"""Step 2 — locating `img_pos`: where each image span starts and ends in a batch of ids."""

import torch

from .tokenizing import IMAGE_START_ID, IMG_TOKEN_SPAN


def as_batch(input_ids) -> torch.Tensor:
    """Return `input_ids` as a 2-D int64 tensor [B, L] (a single sequence becomes a batch of one)."""
    ids = torch.as_tensor(input_ids)
    if ids.numel() == 0:
        ids = ids.long()  # torch.as_tensor([]) is float32
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be [L] or [B, L], got shape {tuple(ids.shape)}")
    return ids.long()


def locate_img_pos(input_ids, image_start_id: int = IMAGE_START_ID, span: int = IMG_TOKEN_SPAN) -> torch.Tensor:
    """Find every `<img>`…`</img>` pair: `img_pos` [N, 3] = (batch row, `<img>` index, `</img>` index)."""
    input_ids = as_batch(input_ids)  # [B, L]
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
