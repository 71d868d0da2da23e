"""Decode back end "triton": the decode step as the engine's own Triton kernels (NVIDIA GPU; CPU via the interpreter).

A float32 residual stream that the two projections add into, gate · silu(fc) inside the MLP's first product, and
RoPE, the KV-cache write and attention split over the keys in one kernel: seven launches a layer.
"""

import torch
import triton

from . import triton_linear
from .triton_attention import decode_attention
from .triton_linear import fused_linear, rms_norm


class TritonDecode:
    """The decode step with the kernels of triton_linear and triton_attention."""

    name = "triton"

    def __init__(self, engine):
        self.engine = engine
        half = engine.head_dim // 2
        self.sin_signed = torch.cat([-engine.sin[:, :half], engine.sin[:, half:]], dim=-1).contiguous()  # [S, hd]
        self.cos = engine.cos.contiguous()
        self.tickets = torch.zeros(engine.rows * engine.heads, dtype=torch.int32, device=engine.device)  # attention's

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """ids [n] at positions pos [n], attending to their cached keys up to pos: logits [n, V]."""
        e = self.engine
        x = e.embed(ids).float()  # [n, H]: the residual stream
        for layer, cache in zip(e.layers, e.kv_cache):
            qkv = fused_linear(rms_norm(x, layer.ln_1, e.eps), layer.qkv_t.t(), layer.qkv_b)
            attn = decode_attention(qkv, self.cos, self.sin_signed, pos, cache, kv_len, self.tickets)  # [n, H]
            fused_linear(attn, layer.dense_t.t(), out=x)
            mlp = fused_linear(rms_norm(x, layer.ln_2, e.eps), layer.gate_fc_t.t(), swiglu=True)
            fused_linear(mlp, layer.proj_t.t(), out=x)  # [n, H]
        return fused_linear(rms_norm(x, e.ln_f, e.eps), e.lm_head_t.t()).float()  # [n, V]

    def tuning_key(self) -> str:
        """Which tuned choices fit here: the GPU's name and Triton's version."""
        return f"{torch.cuda.get_device_name(self.engine.device)} | triton {triton.__version__}"

    def choices(self) -> list[dict]:
        """The autotuner's choices so far (triton_linear.tuned_choices)."""
        return triton_linear.tuned_choices()

    def use_choices(self, choices: list[dict]) -> int:
        """Reuse choices made earlier (triton_linear.use_choices): how many were taken."""
        return triton_linear.use_choices(choices)
