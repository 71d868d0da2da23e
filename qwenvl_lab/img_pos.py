"""Notebook 02 — locating `img_pos`: where each image span starts and ends in a batch of ids."""

import torch

from .checks.tensors import as_int_tensor, check_image_spans
from .tokenizing import IMAGE_START_ID, IMG_TOKEN_SPAN


def locate_img_pos(input_ids, image_start_id: int = IMAGE_START_ID, span: int | None = IMG_TOKEN_SPAN) -> torch.Tensor:
    """Find every `<img>`…`</img>` pair: `img_pos` [N, 3] = (batch row, `<img>` index, `</img>` index). Each span holds
    `span` ids (Qwen-VL's tokenizer: 256), or any number with span=None (a picture's own length)."""
    input_ids = check_image_spans(input_ids, image_start_id, span)  # [B, L]: each <img> closed before the next
    bos_pos = torch.where(input_ids == image_start_id)
    eos_pos = torch.where(input_ids == image_start_id + 1)
    return torch.stack((bos_pos[0], bos_pos[1], eos_pos[1]), dim=1)  # [N, 3]


def span_lengths(img_pos) -> list[int]:
    """The ids each image span holds, `b − a − 1` for every (row, a, b) of img_pos: one per row of its picture's
    features."""
    img_pos = as_int_tensor(img_pos, "img_pos").reshape(-1, 3)  # [N, 3]
    return (img_pos[:, 2] - img_pos[:, 1] - 1).tolist()
