"""Engine, layers — the decoder layer's weights as the engine reads them, and its two halves as PyTorch ops.

The prefill and the "torch" and "compiled" decode back ends run these functions; the Triton and numba back ends run
the same arithmetic as kernels and are tested against them. Norm and RoPE are the model's own (`modeling`).
"""

import torch
import torch.nn.functional as F

from ..modeling import apply_rope, rms_norm


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """A weight [out, in] as the engine multiplies it, `x @ w_t` with w_t [in, out].

    On a CPU a contiguous copy: MKL's matrix-vector product streams a row-major [in, out] matrix faster than
    [out, in] with short rows. On CUDA the transposed view, which is what F.linear hands to cuBLAS.
    """
    return weight.t() if weight.device.type == "cuda" else weight.t().contiguous()


class EngineLayer:
    """One decoder layer's weights: transposed (see `transposed`), gate and fc fused into one product."""

    def __init__(self, weights: dict, prefix: str):
        self.ln_1 = weights[prefix + "input_layernorm.weight"]
        self.qkv_t = transposed(weights[prefix + "attention.qkv.weight"])  # [H, 3·heads·hd]
        self.qkv_b = weights[prefix + "attention.qkv.bias"]
        self.dense_t = transposed(weights[prefix + "attention.dense.weight"])  # [heads·hd, H]
        self.ln_2 = weights[prefix + "post_layernorm.weight"]
        gate_fc = torch.cat([weights[prefix + "mlp.gate.weight"], weights[prefix + "mlp.fc.weight"]])  # [2·ffn, H]
        self.gate_fc_t = transposed(gate_fc)  # [H, 2·ffn]
        self.proj_t = transposed(weights[prefix + "mlp.proj.weight"])  # [ffn, H]


def attention_input(x, layer: EngineLayer, eps: float, cos, sin, heads: int):
    """ln_1, the fused qkv product and RoPE of x [T, H]: q, k, v [T, heads, hd] (cos, sin [T, 1, hd])."""
    qkv = torch.addmm(layer.qkv_b, rms_norm(x, layer.ln_1, eps), layer.qkv_t).view(x.shape[0], 3, heads, -1)
    q, k, v = qkv.unbind(1)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def mlp_output(x, attn, layer: EngineLayer, eps: float):
    """Attention projection and residual, ln_2, gated MLP `proj(gate(x) · silu(fc(x)))` and residual: the new x [T, H]."""
    x = torch.addmm(x, attn, layer.dense_t)  # [T, H]
    gate, fc = (rms_norm(x, layer.ln_2, eps) @ layer.gate_fc_t).unflatten(-1, (2, -1)).unbind(-2)  # [T, ffn] each
    return torch.addmm(x, gate * F.silu(fc), layer.proj_t)


def weight_bytes_per_token(weights: dict) -> int:
    """Bytes of LM weights one decode step reads: every tensor but the embedding, of which it reads one row."""
    embedding = weights["transformer.vocab_embedding.weight"]
    rest = sum(t.numel() * t.element_size() for t in weights.values() if t is not embedding)
    return rest + embedding.shape[1] * embedding.element_size()
