"""Decode back end "numba": a CPU's one-row decode step, every layer in one compiled call.

On a CPU a batch-1 decode step of a small model spends more time dispatching ~80 small PyTorch ops than reading the
layers' weights. `decode_row` runs all the layers for one row as one compiled loop nest: RMSNorm, the fused qkv
product, RoPE, the KV-cache write, attention over the row's keys, the attention projection and the gated MLP, the
residual adds, and the final norm; the output layer stays a PyTorch product. Float32 only (numba has no bfloat16).
Steps of more than one row (batches, beams) run the "torch" back end.
"""

import math

import numba
import numpy as np
import torch

from .torch_ops import TorchDecode

LAYER_WEIGHTS = ("ln_1", "qkv_t", "qkv_b", "dense_t", "ln_2", "gate_fc_t", "proj_t")  # EngineLayer's, in this order


@numba.njit(cache=True, fastmath=True, nogil=True)
def _rms_norm(x, weight, eps, out):
    """out = x / rms(x) · weight: [H]."""
    squares = np.float32(0.0)
    for i in range(x.shape[0]):
        squares += x[i] * x[i]
    scale = np.float32(1.0 / math.sqrt(squares / x.shape[0] + eps))
    for i in range(x.shape[0]):
        out[i] = x[i] * scale * weight[i]


@numba.njit(cache=True, fastmath=True, nogil=True)
def _add_product(v, w_t, out):
    """out += v @ w_t, w_t [K, N] read row after row: [N]."""
    for k in range(w_t.shape[0]):
        vk, row = v[k], w_t[k]
        for n in range(w_t.shape[1]):
            out[n] += vk * row[n]


@numba.njit(cache=True, fastmath=True, nogil=True)
def _attend(q, keys, values, n, out):
    """Softmax attention of q [hd] over the first n rows of keys / values [S, hd]: out [hd]."""
    scale = np.float32(1.0 / math.sqrt(q.shape[0]))
    scores = np.empty(n, np.float32)
    top = np.float32(-np.inf)
    for s in range(n):
        dot = np.float32(0.0)
        for d in range(q.shape[0]):
            dot += q[d] * keys[s, d]
        scores[s] = dot * scale
        top = max(top, scores[s])
    total = np.float32(0.0)
    for s in range(n):
        scores[s] = np.exp(scores[s] - top)
        total += scores[s]
    out[:] = 0.0
    for s in range(n):
        p = scores[s] / total
        for d in range(q.shape[0]):
            out[d] += p * values[s, d]


@numba.njit(cache=True, fastmath=True, nogil=True)
def decode_row(
    x, ln_1, qkv_t, qkv_b, dense_t, ln_2, gate_fc_t, proj_t, ln_f, kv_cache, cos, sin_signed, at, kv_len, eps, heads
):
    """One decode step's layers for cache row 0 at position `at`, attending to its keys up to min(kv_len, at + 1);
    x [H] (the token's embedding) is the residual stream, updated in place: the final norm's output [H]."""
    layers, hidden = ln_1.shape
    hd, ffn = cos.shape[1], proj_t.shape[1]
    half, keys = hd // 2, min(kv_len, at + 1)  # later keys (a KV bucket past the row) are masked: left out
    normed, qkv = np.empty(hidden, np.float32), np.empty(3 * hidden, np.float32)
    attn, gate_fc = np.empty(hidden, np.float32), np.empty(2 * ffn, np.float32)
    cos_at, sin_at = cos[at], sin_signed[at]  # [hd]
    for layer in range(layers):
        _rms_norm(x, ln_1[layer], eps, normed)
        qkv[:] = qkv_b[layer]
        _add_product(normed, qkv_t[layer], qkv)  # [q heads | k heads | v heads]
        for head in range(2 * heads):  # NeoX RoPE on q and k: x·cos + [x2 | x1]·[-sin | sin]
            t = qkv[head * hd : (head + 1) * hd]
            for d in range(half):
                a, b = t[d], t[half + d]
                t[d] = a * cos_at[d] + b * sin_at[d]
                t[half + d] = b * cos_at[half + d] + a * sin_at[half + d]
        for head in range(heads):
            keys_h, values_h = kv_cache[layer, 0, 0, head], kv_cache[layer, 1, 0, head]  # [S, hd]
            keys_h[at] = qkv[hidden + head * hd : hidden + (head + 1) * hd]
            values_h[at] = qkv[2 * hidden + head * hd : 2 * hidden + (head + 1) * hd]
            _attend(qkv[head * hd : (head + 1) * hd], keys_h, values_h, keys, attn[head * hd : (head + 1) * hd])
        _add_product(attn, dense_t[layer], x)  # the residual add is the product's accumulator
        _rms_norm(x, ln_2[layer], eps, normed)
        gate_fc[:] = 0.0
        _add_product(normed, gate_fc_t[layer], gate_fc)  # [gate | fc]
        for n in range(ffn):  # gate · silu(fc), written over the gate half
            fc = gate_fc[ffn + n]
            gate_fc[n] = gate_fc[n] * fc / (np.float32(1.0) + np.exp(-fc))
        _add_product(gate_fc[:ffn], proj_t[layer], x)
    _rms_norm(x, ln_f, eps, normed)
    return normed


class RowDecoder:
    """decode_row over an engine's weights and KV cache (float32 on a CPU): its layers' weights become views of
    stacked [layers, …] tensors, and the kernel reads them and the cache through NumPy views of the same memory."""

    def __init__(self, engine):
        if engine.device.type != "cpu" or engine.dtype != torch.float32:
            raise ValueError(
                f"the numba decode kernel runs float32 engines on a CPU, not {engine.dtype} on "
                f"{engine.device.type}: build the engine with dtype float32, or choose another "
                "decode_backend"
            )
        first, layers = engine.layers[0], len(engine.layers)
        stacked = {name: torch.empty(layers, *getattr(first, name).shape, dtype=engine.dtype) for name in LAYER_WEIGHTS}
        for i, layer in enumerate(engine.layers):  # one layer at a time: its own tensors are freed as it goes
            for name in LAYER_WEIGHTS:
                setattr(layer, name, stacked[name][i].copy_(getattr(layer, name)))
        self.layer_weights = [stacked[name].numpy() for name in LAYER_WEIGHTS]  # [layers, …] each
        self.embedding, self.ln_f = engine.vocab_embedding.numpy(), engine.ln_f.numpy()
        self.kv_cache = engine.kv_cache.numpy()  # [layers, 2, rows, heads, S, hd]: written in place
        half = engine.head_dim // 2
        self.cos = engine.cos.numpy()  # [S, hd]
        self.sin_signed = torch.cat([-engine.sin[:, :half], engine.sin[:, half:]], dim=-1).numpy()  # [S, hd]
        self.eps, self.heads = engine.eps, engine.heads

    def __call__(self, token: int, at: int, kv_len: int) -> torch.Tensor:
        """The final norm's output [1, H] for `token` at position `at` (its key and value cached in row 0)."""
        x = self.embedding[token].copy()  # [H]: the residual stream
        return torch.from_numpy(
            decode_row(
                x,
                *self.layer_weights,
                self.ln_f,
                self.kv_cache,
                self.cos,
                self.sin_signed,
                at,
                kv_len,
                self.eps,
                self.heads,
            )
        )[None]


class NumbaDecode(TorchDecode):
    """One-row steps through `decode_row`, steps of several rows through the "torch" back end."""

    name = "numba"

    def __init__(self, engine):
        super().__init__(engine)
        self.row_decoder = RowDecoder(engine)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """ids [n] at positions pos [n]: logits [n, V]."""
        if ids.shape[0] != 1:
            return super().__call__(ids, pos, kv_len)
        return (self.row_decoder(int(ids[0]), int(pos[0]), kv_len) @ self.engine.lm_head_t).float()  # [1, V]
