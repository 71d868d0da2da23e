"""Other ways to put image features into the sequence, for comparison with the prompt table."""

import torch

from .checks.tensors import check_span_rows, feature_blocks
from .img_pos import span_lengths
from .tokenizing import IMAGE_PAD_ID


def overwrite_image_spans(hidden: torch.Tensor, img_pos: torch.Tensor, input_vit: torch.Tensor) -> torch.Tensor:
    """Original Qwen-VL forward: `hidden[i][a+1:b] = input_vit[k]`, the tags keep their embeddings."""
    check_span_rows(span_lengths(img_pos), feature_blocks(input_vit))
    hidden = hidden.clone()  # [B, L, H]
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        hidden[i, a + 1 : b] = input_vit[k].to(hidden.dtype)  # [b − a − 1, H]: one row per id of the span
    return hidden


def masked_scatter_images(
    hidden: torch.Tensor, input_ids: torch.Tensor, input_vit: torch.Tensor, image_pad_id: int = IMAGE_PAD_ID
) -> torch.Tensor:
    """HF/vLLM style: ids are `<imgpad>` placeholders; scatter the features into those positions in order."""
    mask = input_ids == image_pad_id  # [B, L]
    if int(mask.sum()) != input_vit.shape[0] * input_vit.shape[1]:
        raise ValueError(
            f"{int(mask.sum())} <imgpad> placeholders but {input_vit.shape[0] * input_vit.shape[1]} image feature rows; "
            "each image needs exactly one placeholder per feature row"
        )
    flat = input_vit.reshape(-1, hidden.shape[-1]).to(hidden.dtype)  # [N*256, H]
    return hidden.masked_scatter(mask[..., None].expand_as(hidden), flat)
