"""Engine, layers — the decoder layers' weights as the engine keeps them, and a layer's two halves as PyTorch ops.

The prefill and the "torch" decode back end run these functions; the numba and Triton back ends run the same
arithmetic as kernels and are tested against them. Norm and RoPE are the model's own (`modeling`). A weight-only
engine keeps its layer matrices in int8 with one scale per output channel; these PyTorch ops dequantise a matrix to
the activations' dtype where they use it (the Triton kernels read the int8 and scale the sums instead).
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
# a weight-only engine's scales, one per output column of each matrix above: [layers, out]
LAYER_SCALES = {
    "qkv_s": ("attention.qkv.per_channel_scale",),
    "dense_s": ("attention.dense.per_channel_scale",),
    "gate_fc_s": ("mlp.gate.per_channel_scale", "mlp.fc.per_channel_scale"),
    "proj_s": ("mlp.proj.per_channel_scale",),
}


def empty_matrix(n_in: int, n_out: int, layout: str, dtype, device, layers=()) -> torch.Tensor:
    """An uninitialised weight matrix [*layers, in, out] as the engine multiplies it, kept in `layout`."""
    if layout == "[in, out]":
        return torch.empty(*layers, n_in, n_out, dtype=dtype, device=device)
    return torch.empty(*layers, n_out, n_in, dtype=dtype, device=device).transpose(-1, -2)


def stack_layer_weights(weights: dict, layers: int, layout: str, dtype, device) -> dict[str, torch.Tensor]:
    """The layers' weights (TensorRT-LLM names) as LAYER_WEIGHTS' tensors [layers, …] in `dtype` on `device`, the
    matrices kept in `layout` (int8 matrices stay int8, with LAYER_SCALES' stacks beside them); filled one weight at
    a time, so nothing is held twice on the device."""
    stacks = {}
    for name, parts in {**LAYER_WEIGHTS, **LAYER_SCALES}.items():
        first = [weights.get(f"transformer.layers.0.{part}") for part in parts]
        if first[0] is None:  # the scales of an engine without weight-only quantization
            continue
        n_out = sum(w.shape[0] for w in first)
        if first[0].dim() == 1:
            stacks[name] = torch.empty(layers, n_out, dtype=dtype, device=device)
        else:
            kept = torch.int8 if first[0].dtype == torch.int8 else dtype
            stacks[name] = empty_matrix(first[0].shape[1], n_out, layout, kept, device, (layers,))
        for i in range(layers):
            start = 0
            for part in parts:
                w = weights[f"transformer.layers.{i}.{part}"]
                if w.dim() == 1:
                    stacks[name][i, start : start + w.shape[0]].copy_(w)
                else:
                    stacks[name][i, :, start : start + w.shape[0]].copy_(w.t())
                start += w.shape[0]
    return stacks


class EngineLayer:
    """One decoder layer's weights: views of layer i of the engine's stacks (LAYER_WEIGHTS; the LAYER_SCALES of a
    weight-only engine, else None)."""

    def __init__(self, stacks: dict, i: int):
        self.ln_1, self.qkv_t, self.qkv_b = stacks["ln_1"][i], stacks["qkv_t"][i], stacks["qkv_b"][i]
        self.dense_t, self.ln_2 = stacks["dense_t"][i], stacks["ln_2"][i]
        self.gate_fc_t, self.proj_t = stacks["gate_fc_t"][i], stacks["proj_t"][i]
        self.qkv_s, self.dense_s, self.gate_fc_s, self.proj_s = (
            stacks[name][i] if name in stacks else None for name in LAYER_SCALES
        )


def matrix(w_t: torch.Tensor, scale, dtype) -> torch.Tensor:
    """A layer matrix w_t [in, out] as a product reads it: itself, or (int8, with scales [out]) dequantised to dtype."""
    return w_t if scale is None else w_t.to(dtype) * scale


def attention_input(x, layer: EngineLayer, eps: float, cos, sin, heads: int):
    """ln_1, the fused qkv product and RoPE of x [T, H]: q, k, v [T, heads, hd] (cos, sin [T, 1, hd])."""
    qkv_t = matrix(layer.qkv_t, layer.qkv_s, x.dtype)
    qkv = torch.addmm(layer.qkv_b, rms_norm(x, layer.ln_1, eps), qkv_t).view(x.shape[0], 3, heads, -1)
    q, k, v = qkv.unbind(1)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def mlp_output(x, attn, layer: EngineLayer, eps: float):
    """Attention projection and residual, ln_2, gated MLP `proj(gate(x) · silu(fc(x)))` and residual: the new x [T, H]."""
    x = torch.addmm(x, attn, matrix(layer.dense_t, layer.dense_s, x.dtype))  # [T, H]
    h = rms_norm(x, layer.ln_2, eps) @ matrix(layer.gate_fc_t, layer.gate_fc_s, x.dtype)
    gate, fc = h.unflatten(-1, (2, -1)).unbind(-2)  # [T, ffn] each
    return torch.addmm(x, gate * F.silu(fc), matrix(layer.proj_t, layer.proj_s, x.dtype))


def weight_bytes_per_token(weights: dict) -> int:
    """Bytes of LM weights one decode step reads (as their dtypes hold them: int8 matrices one byte a number): every
    tensor but the embedding, of which it reads one row."""
    embedding = weights["transformer.vocab_embedding.weight"]
    rest = sum(t.numel() * t.element_size() for t in weights.values() if t is not embedding)
    return rest + embedding.shape[1] * embedding.element_size()
