"""Notebook 02 — locating `img_pos`: where each image span starts and ends in a batch of ids."""

import torch

from .checks.tensors import check_image_spans
from .tokenizing import IMAGE_START_ID, IMG_TOKEN_SPAN


def locate_img_pos(input_ids, image_start_id: int = IMAGE_START_ID, span: int = IMG_TOKEN_SPAN) -> torch.Tensor:
    """Find every `<img>`…`</img>` pair: `img_pos` [N, 3] = (batch row, `<img>` index, `</img>` index)."""
    input_ids = check_image_spans(input_ids, image_start_id, span)  # [B, L]: each <img> closed `span` ids later
    bos_pos = torch.where(input_ids == image_start_id)
    eos_pos = torch.where(input_ids == image_start_id + 1)
    return torch.stack((bos_pos[0], bos_pos[1], eos_pos[1]), dim=1)  # [N, 3]
