"""Notebook 09 — how today's engines put image features into the sequence: a placeholder marks each image position
and the features are written there in order, no id value indexing a table.

Written from the upstream rules, which notebook 09 quotes line by line:

- TensorRT-LLM's PyTorch backend, `tensorrt_llm/_torch/models/modeling_multimodal_utils.py` (NVIDIA/TensorRT-LLM at
  8bc4e0967b9da1ff3b04993c70b71fb6838da818): `filter_mm_token_from_input_ids`, `fuse_input_embeds`;
- vLLM, `vllm/model_executor/models/utils.py` (vllm-project/vllm at d30d0c133c3f47a6436788f82398b21eb23df8c0):
  `merge_multimodal_embeddings`, and Qwen-VL's prompt in `vllm/model_executor/models/qwen_vl.py` (at
  fc4a42832215fcd219b0ab0d4b5b99e41baf8d45);
- TensorRT-LLM's `input_token_extra_ids` for KV-cache reuse (`docs/source/advanced/kv-cache-reuse.md`).

The course's own prompt table takes spans of any length too: `prompt_table.single_table_batch` and
`per_request_tables` read each picture's span length from `img_pos`.
"""

import torch
from torch import nn

from .checks.tensors import as_batch, as_int_tensor, feature_blocks
from .checks.values import check_int
from .tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN

TLLM_SENTINEL_OFFSET = 1  # TensorRT-LLM's input processors write vocab_size + 1 at every multimodal position


def as_features(features, hidden_size: int | None = None) -> torch.Tensor:
    """One [M, H] tensor of the pictures' feature rows in order, from [N, rows, H], [M, H] or [rows, H] blocks."""
    blocks = feature_blocks([features] if isinstance(features, torch.Tensor) and features.dim() == 2 else features)
    if not blocks:
        raise ValueError("no image features given: pass one [rows, H] tensor per picture")
    if not blocks[0].dtype.is_floating_point:
        raise ValueError(f"image features must be floating-point, got {blocks[0].dtype}")
    if hidden_size is not None and blocks[0].shape[1] != hidden_size:
        raise ValueError(f"image features are {blocks[0].shape[1]} wide but the model's hidden size is {hidden_size}")
    return torch.cat(blocks)  # [M, H]


def span_mask(input_ids, img_pos) -> torch.Tensor:
    """Bool mask [B, L] of the positions between each image's tags: `a+1 … b-1` for every `(row, a, b)` of img_pos."""
    input_ids = as_batch(input_ids)
    img_pos = as_int_tensor(img_pos, "img_pos").reshape(-1, 3)
    mask = torch.zeros(input_ids.shape, dtype=torch.bool)
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        if not (0 <= i < input_ids.shape[0] and 0 <= a < b < input_ids.shape[1]):
            raise ValueError(
                f"image {k}: img_pos ({i}, {a}, {b}) lies outside input_ids of shape {tuple(input_ids.shape)}"
            )
        mask[i, a + 1 : b] = True
    return mask.to(input_ids.device)


def write_placeholders(input_ids, is_image: torch.Tensor, token_id: int) -> torch.Tensor:
    """Copy of `input_ids` with every image position set to one placeholder id (a sentinel, `<imgpad>`, …)."""
    input_ids = as_int_tensor(input_ids)
    token_id = check_int("token_id", token_id, 0)
    if not isinstance(is_image, torch.Tensor) or is_image.dtype != torch.bool or is_image.shape != input_ids.shape:
        raise ValueError(
            f"is_image must be a bool mask of the ids' shape {tuple(input_ids.shape)} (span_mask makes one), got "
            f"{tuple(is_image.shape) if isinstance(is_image, torch.Tensor) else type(is_image).__name__}"
        )
    return input_ids.masked_fill(is_image, token_id)


def filter_mm_token_from_input_ids(input_ids, vocab_size: int, mm_token_ids=None):
    """TensorRT-LLM's rule: `(text_token_indices, mm_token_indices)` of packed ids [T] — the multimodal positions are
    `input_ids >= vocab_size` when no `mm_token_ids` are given, else `isin(input_ids, mm_token_ids)`."""
    input_ids = as_int_tensor(input_ids)
    if input_ids.dim() != 1:
        raise ValueError(
            f"input_ids must be packed, [T] (the batch's requests one after another, padding removed), got shape "
            f"{tuple(input_ids.shape)}; flatten them with .reshape(-1)"
        )
    vocab_size = check_int("vocab_size", vocab_size, 1)
    if mm_token_ids is None:
        mm_token_mask = input_ids >= vocab_size  # one out-of-vocabulary sentinel (or fake ids) marks them
    else:
        mm_token_ids = as_int_tensor(mm_token_ids, "mm_token_ids").reshape(-1).to(input_ids.device)
        mm_token_mask = torch.isin(input_ids, mm_token_ids)
    return torch.where(~mm_token_mask)[0], torch.where(mm_token_mask)[0]


def fuse_input_embeds(embedding_layer: nn.Embedding, input_ids, mm_embeds, mm_token_ids=None):
    """TensorRT-LLM PyTorch backend's merge of packed ids [T]: `(input_ids, None)` without features, else
    `(None, input_embeds [T, H])` — text positions from `embedding_layer`, multimodal positions the features in order."""
    if not isinstance(embedding_layer, nn.Embedding):
        raise TypeError(f"embedding_layer must be the model's nn.Embedding, got {type(embedding_layer).__name__}")
    input_ids = as_int_tensor(input_ids)
    if len(mm_embeds) == 0:
        return input_ids, None
    mm_embed = as_features(list(mm_embeds), embedding_layer.embedding_dim)  # [M, H]
    text_idx, mm_idx = filter_mm_token_from_input_ids(input_ids, embedding_layer.num_embeddings, mm_token_ids)
    if mm_idx.shape[0] != mm_embed.shape[0]:
        raise ValueError(
            f"multimodal token count mismatch: {mm_idx.shape[0]} multimodal positions in input_ids but "
            f"{mm_embed.shape[0]} feature rows; write one placeholder per feature row"
        )
    if bool((input_ids[text_idx] < 0).any()):
        raise ValueError("input_ids must be non-negative token ids")
    text_embed = embedding_layer(input_ids[text_idx].to(embedding_layer.weight.device))  # [T - M, H]
    input_embeds = torch.empty(input_ids.shape[0], mm_embed.shape[-1], dtype=text_embed.dtype, device=text_embed.device)
    input_embeds[text_idx] = text_embed
    input_embeds[mm_idx] = mm_embed.to(input_embeds.dtype)
    return None, input_embeds


def merge_multimodal_embeddings(input_ids, inputs_embeds: torch.Tensor, multimodal_embeddings, placeholder_token_id):
    """vLLM's merge: `is_multimodal = input_ids == placeholder_token_id` (or isin a list of ids), then the features are
    written at those positions in order. Updates `inputs_embeds` in place, as vLLM's does, and returns it."""
    input_ids = as_int_tensor(input_ids)
    if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.shape[:-1] != input_ids.shape:
        raise ValueError(
            f"inputs_embeds must be [*ids shape, H] = [{', '.join(map(str, input_ids.shape))}, H], got "
            f"{tuple(inputs_embeds.shape) if isinstance(inputs_embeds, torch.Tensor) else type(inputs_embeds).__name__}"
        )
    if isinstance(placeholder_token_id, (list, tuple)):
        is_multimodal = torch.isin(input_ids, torch.tensor(placeholder_token_id, device=input_ids.device))
    else:
        is_multimodal = input_ids == check_int("placeholder_token_id", placeholder_token_id, 0)
    flattened = as_features(multimodal_embeddings, inputs_embeds.shape[-1])  # [M, H]
    expected = int(is_multimodal.sum())
    if flattened.shape[0] != expected:
        raise ValueError(
            f"attempted to assign {flattened.shape[0]} multimodal feature rows to {expected} placeholders; "
            "the prompt must hold one placeholder per feature row"
        )
    inputs_embeds[is_multimodal] = flattened.to(inputs_embeds.dtype)
    return inputs_embeds


def vllm_qwen_vl_ids(input_ids, num_image_tokens: int = IMG_TOKEN_SPAN) -> list[int]:
    """vLLM's Qwen-VL prompt from the course's ids [L]: every `<img>…</img>` emptied (the path dropped), then
    `[<img>, </img>]` replaced by `<img>` + 256 × `<imgpad>` + `</img>`."""
    ids = as_int_tensor(input_ids).reshape(-1).tolist()
    out, inside = [], False
    for k, token in enumerate(ids):
        if token == IMAGE_START_ID:
            if inside:
                raise ValueError(f"<img> at position {k} inside another image span")
            out += [IMAGE_START_ID] + [IMAGE_PAD_ID] * check_int("num_image_tokens", num_image_tokens, 1)
            inside = True
        elif token == IMAGE_END_ID:
            if not inside:
                raise ValueError(f"</img> at position {k} without an <img> before it")
            out.append(IMAGE_END_ID)
            inside = False
        elif not inside:
            out.append(token)
    if inside:
        raise ValueError("an <img> is never closed by </img>")
    return out


def input_token_extra_ids(input_ids, vocab_size: int, table_id: int) -> torch.Tensor:
    """TensorRT-LLM's extra ids for KV-cache reuse with prompt tables: 0 for text ids, `table_id` (> 0, the same for
    requests that use the same prompt embeddings) for fake ids >= vocab_size."""
    input_ids = as_int_tensor(input_ids)
    vocab_size, table_id = check_int("vocab_size", vocab_size, 1), check_int("table_id", table_id, 1)
    return torch.where(input_ids >= vocab_size, table_id, 0)
