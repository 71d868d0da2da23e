"""Notebook 03 — fake prompt ids: ids past the vocabulary that point into the prompt table."""

import torch

from .img_pos import INT64_MAX, as_batch, as_int_tensor, check_int, locate_img_pos
from .tokenizing import IMAGE_START_ID, IMG_TOKEN_SPAN


def make_fake_prompt_ids(vocab_size: int, num_images: int, tokens_per_image: int = IMG_TOKEN_SPAN) -> torch.Tensor:
    """`fake_prompt_id` [N, 256]: vocab_size, vocab_size + 1, … one row per image."""
    vocab_size, num_images = check_int("vocab_size", vocab_size), check_int("num_images", num_images)
    tokens_per_image = check_int("tokens_per_image", tokens_per_image)
    if vocab_size <= 0 or num_images < 0 or tokens_per_image <= 0:
        raise ValueError(
            f"need vocab_size > 0, num_images >= 0, tokens_per_image > 0; got {vocab_size}, {num_images}, {tokens_per_image}"
        )
    if vocab_size + num_images * tokens_per_image - 1 > INT64_MAX:
        raise ValueError(
            f"fake prompt ids from {vocab_size} for {num_images} images of {tokens_per_image} ids pass the "
            f"largest int64 id {INT64_MAX}"
        )
    return torch.arange(vocab_size, vocab_size + num_images * tokens_per_image).reshape(num_images, tokens_per_image)


def replace_image_spans(input_ids, img_pos, fake_prompt_id) -> torch.Tensor:
    """Copy of `input_ids` with image k's span `[a+1:b]` replaced by `fake_prompt_id[k]` (tags kept)."""
    input_ids = as_batch(input_ids).clone()  # [B, L]
    img_pos = as_int_tensor(img_pos, "img_pos")
    if img_pos.numel() == 0:
        img_pos = img_pos.reshape(0, 3)
    if img_pos.dim() == 1 and img_pos.shape[0] == 3:
        img_pos = img_pos[None]  # one image
    if img_pos.dim() != 2 or img_pos.shape[1] != 3:
        raise ValueError(
            f"img_pos must be [N, 3] (batch row, <img> index, </img> index), got shape "
            f"{tuple(img_pos.shape)}; make it with locate_img_pos"
        )
    fake_prompt_id = as_int_tensor(fake_prompt_id, "fake_prompt_id")
    if fake_prompt_id.dim() != 2:
        raise ValueError(
            f"fake_prompt_id must be [N, 256] (one row per image), got shape {tuple(fake_prompt_id.shape)}; "
            "make it with make_fake_prompt_ids"
        )
    if img_pos.shape[0] != fake_prompt_id.shape[0]:
        raise ValueError(
            f"{img_pos.shape[0]} image spans in img_pos but {fake_prompt_id.shape[0]} rows of fake_prompt_id; "
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
        if b - a - 1 != fake_prompt_id.shape[1]:
            raise ValueError(
                f"image {k}: span {a}…{b} holds {b - a - 1} ids but fake_prompt_id rows hold {fake_prompt_id.shape[1]}"
            )
        previous[i] = b
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
