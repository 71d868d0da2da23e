"""Step 3 — fake prompt ids: ids past the vocabulary that point into the prompt table."""

import torch

from .img_pos import as_batch, locate_img_pos
from .tokenizing import IMAGE_START_ID, IMG_TOKEN_SPAN


def make_fake_prompt_ids(vocab_size: int, num_images: int, tokens_per_image: int = IMG_TOKEN_SPAN) -> torch.Tensor:
    """`fake_prompt_id` [N, 256]: vocab_size, vocab_size + 1, … one row per image."""
    if vocab_size <= 0 or num_images < 0 or tokens_per_image <= 0:
        raise ValueError(
            f"need vocab_size > 0, num_images >= 0, tokens_per_image > 0; got {vocab_size}, {num_images}, {tokens_per_image}"
        )
    return torch.arange(vocab_size, vocab_size + num_images * tokens_per_image).reshape(num_images, tokens_per_image)


def replace_image_spans(input_ids, img_pos: torch.Tensor, fake_prompt_id: torch.Tensor) -> torch.Tensor:
    """Copy of `input_ids` with image k's span `[a+1:b]` replaced by `fake_prompt_id[k]` (tags kept)."""
    input_ids = as_batch(input_ids).clone()  # [B, L]
    img_pos = torch.as_tensor(img_pos).reshape(-1, 3)
    if img_pos.shape[0] != fake_prompt_id.shape[0]:
        raise ValueError(
            f"{img_pos.shape[0]} image spans in img_pos but {fake_prompt_id.shape[0]} rows of fake_prompt_id; "
            "make one row of fake ids per image"
        )
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        if b - a - 1 != fake_prompt_id.shape[1]:
            raise ValueError(
                f"image {k}: span {a}…{b} holds {b - a - 1} ids but fake_prompt_id rows hold {fake_prompt_id.shape[1]}"
            )
        input_ids[i, a + 1 : b] = fake_prompt_id[k]
    return input_ids


def check_spans_hold_fake_ids(requests, vocab_size: int) -> None:
    """Refuse image spans that still hold a picture's path: an engine sees pictures only through a prompt table."""
    for i, ids in enumerate(requests):
        if not bool((ids == IMAGE_START_ID).any()):
            continue
        if any(bool((ids[a + 1 : b] < vocab_size).any()) for _, a, b in locate_img_pos(ids).tolist()):
            raise ValueError(
                f"request {i} holds an image span with the picture's path, which only the original model reads (an "
                "engine would embed the path bytes as text): encode the picture with the vision tower, replace the span "
                "with fake ids and pass a prompt_table (single_table_batch / per_request_tables, or QWenInfer.qwen_infer)"
            )
