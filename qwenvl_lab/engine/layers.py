"""Engine, layers — the decoder layers' weights as the engine keeps them, and a layer's two halves as PyTorch ops.

The prefill and the "torch" decode back end run these functions; the numba and Triton back ends run the same
arithmetic as kernels and are tested against them. Norm and RoPE are the model's own (`modeling`).
"""

import torch
import torch.nn.functional as F

from ..modeling import apply_rope, rms_norm

# how a weight matrix [out, in] is kept; either way the engine multiplies it as `x @ w_t`, w_t [in, out]:
# "[in, out]" a contiguous transposed copy (what MKL's and cuBLAS's products stream fastest for one row),
# "[out, in]" the checkpoint's own rows, w_t a transposed view (what the Triton kernels stream)
LAYOUTS = ("[in, out]", "[out, in]")
# each weight the layers hold, stacked [layers, …]: the TensorRT-LLM names it holds side by side (gate then fc)
LAYER_WEIGHTS = {
    "ln_1": ("input_layernorm.weight",),
    "qkv_t": ("attention.qkv.weight",),  # [H, 3·heads·hd]
    "qkv_b": ("attention.qkv.bias",),
    "dense_t": ("attention.dense.weight",),  # [heads·hd, H]
    "ln_2": ("post_layernorm.weight",),
    "gate_fc_t": ("mlp.gate.weight", "mlp.fc.weight"),  # [H, 2·ffn]
    "proj_t": ("mlp.proj.weight",),  # [ffn, H]
}


def empty_matrix(n_in: int, n_out: int, layout: str, dtype, device, layers=()) -> torch.Tensor:
    """An uninitialised weight matrix [*layers, in, out] as the engine multiplies it, kept in `layout`."""
    if layout == "[in, out]":
        return torch.empty(*layers, n_in, n_out, dtype=dtype, device=device)
    return torch.empty(*layers, n_out, n_in, dtype=dtype, device=device).transpose(-1, -2)


def stack_layer_weights(weights: dict, layers: int, layout: str, dtype, device) -> dict[str, torch.Tensor]:
    """The layers' weights (TensorRT-LLM names) as LAYER_WEIGHTS' tensors [layers, …] in `dtype` on `device`, the
    matrices kept in `layout`; filled one weight at a time, so nothing is held twice on the device."""
    stacks = {}
    for name, parts in LAYER_WEIGHTS.items():
        first = [weights[f"transformer.layers.0.{part}"] for part in parts]
        if first[0].dim() == 1:
            stacks[name] = torch.empty(layers, first[0].shape[0], dtype=dtype, device=device)
        else:
            n_out = sum(w.shape[0] for w in first)
            stacks[name] = empty_matrix(first[0].shape[1], n_out, layout, dtype, device, (layers,))
        for i in range(layers):
            start = 0
            for part in parts:
                w = weights[f"transformer.layers.{i}.{part}"]
                if w.dim() == 1:
                    stacks[name][i].copy_(w)
                else:
                    stacks[name][i, :, start : start + w.shape[0]].copy_(w.t())
                    start += w.shape[0]
    return stacks


class EngineLayer:
    """One decoder layer's weights: views of layer i of the engine's stacks (LAYER_WEIGHTS)."""

    def __init__(self, stacks: dict, i: int):
        self.ln_1, self.qkv_t, self.qkv_b = stacks["ln_1"][i], stacks["qkv_t"][i], stacks["qkv_b"][i]
        self.dense_t, self.ln_2 = stacks["dense_t"][i], stacks["ln_2"][i]
        self.gate_fc_t, self.proj_t = stacks["gate_fc_t"][i], stacks["proj_t"][i]


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
