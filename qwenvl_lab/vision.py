"""Notebook 04 — the vision tower: Qwen-VL's ViT + resampler turning pictures into `input_vit` [N, 256, H].

Pictures are read by `pictures.load_image`, as Qwen-VL reads them.
"""

import math
import os
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from .pictures import load_image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
N_QUERIES = 256


def preprocess_images(images, image_size: int, exif_transpose: bool = False) -> torch.Tensor:
    """Pictures → [N, 3, S, S]: RGB, bicubic resize to image_size (aspect not kept), CLIP mean/std."""
    if isinstance(images, (str, os.PathLike, Image.Image)):
        images = [images]  # one picture, not an iterable of characters or pixels
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1)
    out = []
    for image in images:
        img = load_image(image, exif_transpose).resize((image_size, image_size), Image.Resampling.BICUBIC)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)  # [3, S, S]
        out.append((x - mean) / std)
    if not out:
        raise ValueError("no images given")
    return torch.stack(out)  # [N, 3, S, S]


def sincos_pos_embed_2d(embed_dim: int, grid_size: int) -> torch.Tensor:
    """Fixed 2-D sin-cos positional embedding (MAE formula): [grid_size², embed_dim]."""

    def one_dim(dim, pos):
        omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)  # [M, dim/2]
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_w, grid_h = np.meshgrid(np.arange(grid_size, dtype=np.float64), np.arange(grid_size, dtype=np.float64))
    emb = np.concatenate([one_dim(embed_dim // 2, grid_w), one_dim(embed_dim // 2, grid_h)], axis=1)
    return torch.tensor(emb, dtype=torch.float32)  # on the current default device (meta, cuda) like the other weights


def interpolate_pos_embed(pos: torch.Tensor, target_len: int) -> torch.Tensor:
    """Resize a square grid of positional embeddings [L, D] to [target_len, D] (bicubic)."""
    src, tgt = int(math.isqrt(pos.shape[0])), int(math.isqrt(target_len))
    if src * src != pos.shape[0] or tgt * tgt != target_len:
        raise ValueError(
            f"positional embeddings form square grids; cannot resize {pos.shape[0]} positions to {target_len}"
        )
    if src == tgt:
        return pos
    grid = pos.float().reshape(1, src, src, -1).permute(0, 3, 1, 2)  # [1, D, src, src]
    grid = F.interpolate(grid, size=(tgt, tgt), mode="bicubic", align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(tgt * tgt, -1).to(pos.dtype)


class VisualAttention(nn.Module):
    """ViT self-attention whose `in_proj` output is q|k|v interleaved per head."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.in_proj = nn.Linear(width, 3 * width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Self-attention over the patches, sequence first: [S, B, W] → [S, B, W]."""
        seq, batch, width = x.shape  # [S, B, W]
        qkv = self.in_proj(x).view(seq, batch, self.heads, 3 * width // self.heads)  # [S, B, h, 3*hd]
        q, k, v = (t.permute(1, 2, 0, 3) for t in qkv.chunk(3, dim=-1))  # [B, h, S, hd]
        out = F.scaled_dot_product_attention(q, k, v)  # [B, h, S, hd]
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(seq, batch, width))


class VisualBlock(nn.Module):
    """Pre-LayerNorm residual block: attention then GELU MLP."""

    def __init__(self, width: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = VisualAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        mlp_width = int(width * mlp_ratio)
        self.mlp = nn.Sequential(
            OrderedDict(c_fc=nn.Linear(width, mlp_width), gelu=nn.GELU(), c_proj=nn.Linear(mlp_width, width))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The patches [S, B, W] after this block's attention and MLP."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class VisualStack(nn.Module):
    """The ViT's `resblocks`."""

    def __init__(self, width: int, layers: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.resblocks = nn.ModuleList(VisualBlock(width, heads, mlp_ratio) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The patches [S, B, W] through every block."""
        for block in self.resblocks:
            x = block(x)
        return x


class Resampler(nn.Module):
    """Cross-attention from 256 learned queries to the patches: any image → 256 tokens."""

    def __init__(self, embed_dim: int, kv_dim: int, n_queries: int = N_QUERIES):
        super().__init__()
        grid = int(math.isqrt(n_queries))
        self.query = nn.Parameter(torch.zeros(n_queries, embed_dim))
        self.pos_embed = nn.Parameter(sincos_pos_embed_2d(embed_dim, grid), requires_grad=False)
        self.kv_proj = nn.Linear(kv_dim, embed_dim, bias=False)
        self.attn = nn.MultiheadAttention(embed_dim, max(embed_dim // 128, 1))
        self.ln_q = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_kv = nn.LayerNorm(embed_dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Patches [B, P, W] → one row per learned query [B, 256, D]."""
        key_pos = interpolate_pos_embed(self.pos_embed, x.shape[1])  # [P, D]
        x = self.ln_kv(self.kv_proj(x)).permute(1, 0, 2)  # [P, B, D]
        q = self.ln_q(self.query)[:, None].expand(-1, x.shape[1], -1)  # [256, B, D]
        out = self.attn(q + self.pos_embed[:, None], x + key_pos[:, None], x, need_weights=False)[0]
        return out.permute(1, 0, 2)  # [B, 256, D]


class VisionTransformer(nn.Module):
    """Qwen-VL's `transformer.visual`: conv patches → ViT → resampler → `input_vit` [B, 256, output_dim]."""

    def __init__(
        self,
        image_size=448,
        patch_size=14,
        width=1664,
        layers=48,
        heads=16,
        mlp_ratio=4.9231,
        output_dim=4096,
        n_queries=N_QUERIES,
        **_,
    ):
        super().__init__()
        self.image_size, self.patch_size, self.output_dim = image_size, patch_size, output_dim
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size, bias=False)
        self.positional_embedding = nn.Parameter(torch.zeros(N_QUERIES, width))  # a 16×16 grid
        self.ln_pre = nn.LayerNorm(width, eps=1e-6)
        self.transformer = VisualStack(width, layers, heads, mlp_ratio)
        self.attn_pool = Resampler(output_dim, width, n_queries)
        self.ln_post = nn.LayerNorm(output_dim, eps=1e-6)
        self.proj = nn.Parameter(torch.zeros(output_dim, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, S, S] → `input_vit` [B, 256, D]."""
        if x.dim() != 4 or x.shape[1:] != (3, self.image_size, self.image_size):
            raise ValueError(
                f"expected pixels [B, 3, {self.image_size}, {self.image_size}], got {tuple(x.shape)}; use preprocess_images"
            )
        x = x.to(self.conv1.weight.dtype)
        x = self.conv1(x).flatten(2).transpose(1, 2)  # [B, P, W]
        x = x + interpolate_pos_embed(self.positional_embedding, x.shape[1])
        x = self.ln_pre(x).permute(1, 0, 2)  # [P, B, W]
        x = self.transformer(x).permute(1, 0, 2)  # [B, P, W]
        x = self.ln_post(self.attn_pool(x))  # [B, 256, D]
        return x @ self.proj  # [B, 256, D]

    def encode(self, images, exif_transpose: bool = False) -> torch.Tensor:
        """Paths or PIL images → `input_vit` [N, 256, output_dim] (EXIF orientation applied only when asked)."""
        pixels = preprocess_images(images, self.image_size, exif_transpose).to(self.conv1.weight.device)
        return self(pixels)
