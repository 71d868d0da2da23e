"""Decode back end "numba": a CPU's decode step, every layer of every row in one compiled call.

On a CPU a decode step of a small model spends more time dispatching ~80 small PyTorch ops than reading the layers'
weights. `decode_rows` runs all the layers for all the rows as one compiled loop nest: RMSNorm, the fused qkv
product, RoPE, the KV-cache write, attention over each row's keys, the attention projection and the gated MLP, the
residual adds, and the final norm; the output layer stays a PyTorch product. Each weight row is read once for all
the rows of the step. Float32 only (numba has no bfloat16).
"""

import math

import numba
import numpy as np
import torch

from ..layers import LAYER_WEIGHTS
from . import DecodeStep


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
    """out += v @ w_t for v [n, K], w_t [K, N] read row after row (each row once for the n rows): out [n, N]."""
    for k in range(w_t.shape[0]):
        row = w_t[k]
        for r in range(v.shape[0]):
            vk, target = v[r, k], out[r]
            for j in range(w_t.shape[1]):
                target[j] += vk * row[j]


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
def decode_rows(
    ids,
    pos,
    embedding,
    ln_1,
    qkv_t,
    qkv_b,
    dense_t,
    ln_2,
    gate_fc_t,
    proj_t,
    ln_f,
    kv_cache,
    cos,
    sin_signed,
    kv_len,
    eps,
    heads,
):
    """One decode step's layers for tokens ids [n] at positions pos [n], row r cached in cache row r and attending
    to its keys up to min(kv_len, pos[r] + 1): the final norm's output [n, H]."""
    layers, hidden = ln_1.shape
    n = ids.shape[0]
    hd, ffn = cos.shape[1], proj_t.shape[1]
    half = hd // 2
    x = np.empty((n, hidden), np.float32)  # the residual stream
    for r in range(n):
        x[r] = embedding[ids[r]]
    normed, qkv = np.empty((n, hidden), np.float32), np.empty((n, 3 * hidden), np.float32)
    attn, gate_fc = np.empty((n, hidden), np.float32), np.empty((n, 2 * ffn), np.float32)
    for layer in range(layers):
        for r in range(n):
            _rms_norm(x[r], ln_1[layer], eps, normed[r])
            qkv[r] = qkv_b[layer]
        _add_product(normed, qkv_t[layer], qkv)  # [q heads | k heads | v heads] per row
        for r in range(n):
            at = pos[r]
            keys = min(kv_len, at + 1)  # later keys (a KV bucket past the row) are masked: left out
            cos_at, sin_at = cos[at], sin_signed[at]  # [hd]
            for head in range(2 * heads):  # NeoX RoPE on q and k: x·cos + [x2 | x1]·[-sin | sin]
                t = qkv[r, head * hd : (head + 1) * hd]
                for d in range(half):
                    a, b = t[d], t[half + d]
                    t[d] = a * cos_at[d] + b * sin_at[d]
                    t[half + d] = b * cos_at[half + d] + a * sin_at[half + d]
            for head in range(heads):
                keys_h, values_h = kv_cache[layer, 0, r, head], kv_cache[layer, 1, r, head]  # [S, hd]
                keys_h[at] = qkv[r, hidden + head * hd : hidden + (head + 1) * hd]
                values_h[at] = qkv[r, 2 * hidden + head * hd : 2 * hidden + (head + 1) * hd]
                _attend(
                    qkv[r, head * hd : (head + 1) * hd], keys_h, values_h, keys, attn[r, head * hd : (head + 1) * hd]
                )
        _add_product(attn, dense_t[layer], x)  # the residual add is the product's accumulator
        for r in range(n):
            _rms_norm(x[r], ln_2[layer], eps, normed[r])
        gate_fc[:] = 0.0
        _add_product(normed, gate_fc_t[layer], gate_fc)  # [gate | fc] per row
        for r in range(n):
            for j in range(ffn):  # gate · silu(fc), written over the gate half
                fc = gate_fc[r, ffn + j]
                gate_fc[r, j] = gate_fc[r, j] * fc / (np.float32(1.0) + np.exp(-fc))
        _add_product(gate_fc[:, :ffn], proj_t[layer], x)
    for r in range(n):
        _rms_norm(x[r], ln_f, eps, normed[r])
    return normed


class NumbaDecode(DecodeStep):
    """decode_rows over an engine's stacked weights and KV cache (float32 on a CPU), read through NumPy views of the
    same memory; it owns only its RoPE table with the signs of the rotation folded in."""

    name = "numba"
    layout = "[in, out]"  # decode_rows streams every w_t [K, N] row after row

    def __init__(self, engine, tuning_file=None):
        super().__init__(engine)
        self.layer_weights = [engine.stacks[name].numpy() for name in LAYER_WEIGHTS]  # [layers, …] each
        self.embedding, self.ln_f = engine.vocab_embedding.numpy(), engine.ln_f.numpy()
        self.kv_cache = engine.kv_cache.numpy()  # [layers, 2, rows, heads, S, hd]: written in place
        half = engine.head_dim // 2
        self.cos = engine.cos.numpy()  # [S, hd]
        self.sin_signed = torch.cat([-engine.sin[:, :half], engine.sin[:, half:]], dim=-1).numpy()  # [S, hd]

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """ids [n] at positions pos [n], attending to their cached keys up to pos: logits [n, V]."""
        e = self.engine
        normed = decode_rows(
            ids.numpy(),
            pos.numpy(),
            self.embedding,
            *self.layer_weights,
            self.ln_f,
            self.kv_cache,
            self.cos,
            self.sin_signed,
            kv_len,
            e.eps,
            e.heads,
        )
        return torch.from_numpy(normed) @ e.lm_head_t  # [n, V] float32
