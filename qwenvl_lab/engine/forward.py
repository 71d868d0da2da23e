"""Engine, forward — packed prefill and one decode step of the language model over a preallocated KV cache."""

import importlib.util
import math
import warnings

import torch
import torch.nn.functional as F

from ..modeling import attention_bias, rope_cos_sin
from .build import BuildConfig, check_engine_weights


def rms_norm(x, weight, eps: float):
    """modeling.RMSNorm's output, bit for bit, with one fused normalisation op instead of five (no autograd here;
    RMSNorm keeps its own ops because their bf16-autocast gradients, which trained the toy model, differ)."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).type_as(x) * weight


def rms_norm_row(x, weight, eps: float):
    """rms_norm of one row [1, H] for a CPU's one-row decode step: the sum of squares as one dot product and the scale
    as a Python float, three small ops where F.rms_norm runs eight (equal to rms_norm up to the last bit, not bit for
    bit: the sum is added up in another order)."""
    xf = x.float()
    return (xf * (1.0 / math.sqrt(float(torch.dot(xf[0], xf[0])) / x.shape[-1] + eps))).type_as(x) * weight


def rope_(qk, cos, sin_signed):
    """NeoX RoPE in place on qk [T, 2, heads, hd]: x·cos + rotate_half(x)·sin, with rotate_half(x)·sin written as
    the swapped halves of x times sin_signed = [-sin | sin] (three ops instead of slicing and concatenating)."""
    swapped = torch.roll(qk, qk.shape[-1] // 2, -1)  # [x2 | x1], a copy
    qk.mul_(cos).addcmul_(swapped, sin_signed)


def attention_input(x, ln_1, eps: float, qkv_t, qkv_b, cos, sin_signed, heads: int, norm=rms_norm):
    """ln_1, fused qkv and RoPE: (q [T, heads, hd], kv [T, 2, heads, hd]), views of one qkv buffer."""
    qkv = torch.addmm(qkv_b, norm(x, ln_1, eps), qkv_t).view(x.shape[0], 3, heads, -1)  # [T, 3, heads, hd]
    rope_(qkv[:, :2], cos, sin_signed)
    return qkv[:, 0], qkv[:, 1:]


def mlp_output(x, attn, dense_t, ln_2, eps: float, gate_fc_t, proj_t, norm=rms_norm):
    """Attention projection and residual, ln_2, gated MLP `proj(gate(x) * silu(fc(x)))` and residual: the new x [T, H]
    (each residual add inside its product: addmm)."""
    x = torch.addmm(x, attn, dense_t)  # [T, H]
    gate, fc = (norm(x, ln_2, eps) @ gate_fc_t).unflatten(-1, (2, -1)).unbind(-2)  # [T, ffn] each
    return torch.addmm(x, gate * F.silu(fc), proj_t)


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """A weight [out, in] as the engine multiplies it, `x @ w_t` with w_t [in, out].

    On a CPU a contiguous copy: MKL's matrix-vector product over a row-major [in, out] matrix streams it about
    three times faster than over [out, in] with short rows (the 151936 × 128 output layer of the toy model).
    On CUDA the transposed view, which is what F.linear hands to cuBLAS.
    """
    return weight.t() if weight.device.type == "cuda" else weight.t().contiguous()


class EngineLayer:
    """One decoder layer's weights as the engine reads them: transposed (see `transposed`), gate and fc fused."""

    def __init__(self, weights: dict, prefix: str):
        self.ln_1 = weights[prefix + "input_layernorm.weight"]
        self.qkv_t = transposed(weights[prefix + "attention.qkv.weight"])  # [H, 3·heads·hd]
        self.qkv_b = weights[prefix + "attention.qkv.bias"]
        self.dense_t = transposed(weights[prefix + "attention.dense.weight"])  # [heads·hd, H]
        self.ln_2 = weights[prefix + "post_layernorm.weight"]
        gate_fc = torch.cat([weights[prefix + "mlp.gate.weight"], weights[prefix + "mlp.fc.weight"]])  # [2·ffn, H]
        self.gate_fc_t = transposed(gate_fc)  # [H, 2·ffn]
        self.proj_t = transposed(weights[prefix + "mlp.proj.weight"])  # [ffn, H]


def weight_bytes_per_token(weights: dict) -> int:
    """Bytes of LM weights one decode step reads: every tensor but the embedding, of which it reads one row."""
    embedding = weights["transformer.vocab_embedding.weight"]
    rest = sum(t.numel() * t.element_size() for t in weights.values() if t is not embedding)
    return rest + embedding.shape[1] * embedding.element_size()


class LanguageModelEngine:
    """The LM on one device: weights in the engine dtype, RoPE tables, KV cache [layers, 2, rows, heads, S, hd]."""

    def __init__(self, build_config: BuildConfig, pretrained_config: dict, weights: dict, device, compile_decode=False,
                 fused_decode=False, numba_decode=False):
        check_engine_weights(weights, pretrained_config)
        self.dtype, self.device = build_config.torch_dtype, torch.device(device)
        w = {name: t.to(device=self.device, dtype=self.dtype) for name, t in weights.items()}
        self.weight_bytes_per_token = weight_bytes_per_token(w)
        self.eps = pretrained_config["norm_epsilon"]
        self.heads, self.head_dim = pretrained_config["num_attention_heads"], pretrained_config["head_size"]
        self.vocab_size = pretrained_config["vocab_size"]
        self.vocab_embedding = w["transformer.vocab_embedding.weight"]  # [V, H]: rows are looked up
        self.lm_head_t = transposed(w["lm_head.weight"])  # [H, V]
        self.ln_f = w["transformer.ln_f.weight"]
        self.layers = [EngineLayer(w, f"transformer.layers.{i}.")
                       for i in range(pretrained_config["num_hidden_layers"])]
        del w  # only the engine's layout of each weight is kept
        self.max_seq_len = build_config.max_seq_len
        rows = build_config.max_batch_size * build_config.max_beam_width
        self.kv_cache = torch.zeros(len(self.layers), 2, rows, self.heads, self.max_seq_len, self.head_dim,
                                    dtype=self.dtype, device=self.device)
        positions = torch.arange(self.max_seq_len, device=self.device)
        cos, sin = rope_cos_sin(positions[None], self.head_dim, pretrained_config["rotary_base"], self.dtype)
        half = self.head_dim // 2
        self.cos, self.sin_signed = cos[0, 0], torch.cat([-sin[0, 0, :, :half], sin[0, 0, :, half:]], dim=-1)  # [S, hd]
        self.key_pos, self.row_ids = positions, torch.arange(rows, device=self.device)
        self.first_row = [(cache[:, 0], cache[0, :1], cache[1, :1]) for cache in self.kv_cache]  # cache row 0's views
        self.mask_value = torch.finfo(self.dtype).min
        self.decode_attention_input, self.decode_mlp_output = attention_input, mlp_output
        if compile_decode:
            self.compile_decode()
        self.fused_decode = None
        if fused_decode:  # Triton's decode kernels (on a CPU through its interpreter: tests only)
            if importlib.util.find_spec("triton") is None:
                raise ValueError("fused_decode=True needs triton (pip install triton; CUDA builds of torch bring it), "
                                 "or pass fused_decode=False")
            import triton

            if self.device.type != "cuda" and not triton.knobs.runtime.interpret:
                raise ValueError(f"the fused decode kernels run on an NVIDIA GPU, not on {self.device.type}; a CPU runs "
                                 "them only through Triton's interpreter (TRITON_INTERPRET=1 set before torch is "
                                 "imported, as the tests do). Pass fused_decode=False here")
            from . import triton_linear
            from .triton_attention import decode_attention

            if rows > triton_linear.MAX_ROWS:
                raise ValueError(f"the fused decode kernels take at most {triton_linear.MAX_ROWS} rows a step, and this "
                                 f"engine holds {rows} (max_batch_size × max_beam_width): build it smaller or pass "
                                 "fused_decode=False")
            self.fused_decode, self.fused_attention = triton_linear, decode_attention
            self.tickets = torch.zeros(rows * self.heads, dtype=torch.int32, device=self.device)  # attention's counters
        self.row_decoder = None
        if numba_decode:  # a CPU's one-row decode step as one compiled call
            if importlib.util.find_spec("numba") is None:
                raise ValueError("numba_decode=True needs numba (pip install numba), or pass numba_decode=False")
            from .numba_decode import RowDecoder

            self.row_decoder = RowDecoder(self)

    def compile_decode(self) -> None:
        """Fuse the decode step's small ops with torch.compile (Triton on CUDA): fewer kernels per layer."""
        if self.device.type == "cuda" and importlib.util.find_spec("triton") is None:
            warnings.warn("triton is not installed, so the decode step is not compiled (CUDA graphs still apply)")
            return
        self.decode_attention_input = torch.compile(attention_input, fullgraph=True)
        self.decode_mlp_output = torch.compile(mlp_output, fullgraph=True)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary rows of ids [T] (no prompt table): [T, H]."""
        return F.embedding(ids, self.vocab_embedding)

    def prefill(self, embeds: torch.Tensor, lengths: list[int], rows: list[range]) -> torch.Tensor:
        """Run the prompts packed [N, H] (request r has lengths[r] tokens, cached into `rows[r]`): last logits [B, V]."""
        positions = torch.cat([torch.arange(n, device=self.device) for n in lengths])  # [N]
        cos, sin = self.cos[positions][:, None, None], self.sin_signed[positions][:, None, None]  # [N, 1, 1, hd]
        masks = [attention_bias(None, n, 0, self.dtype, self.device) for n in lengths]  # [1, 1, L, L] each
        starts = [sum(lengths[:r]) for r in range(len(lengths))]
        x = embeds
        for layer, cache in zip(self.layers, self.kv_cache):
            q, kv = attention_input(x, layer.ln_1, self.eps, layer.qkv_t, layer.qkv_b, cos, sin, self.heads)
            outputs = []
            for start, n, slots, mask in zip(starts, lengths, rows, masks):
                kv_r = kv[start : start + n].permute(1, 2, 0, 3)  # [2, heads, L, hd]
                cache[:, slots.start : slots.stop, :, :n] = kv_r[:, None]  # every beam row of the request
                k, v = kv_r
                out = F.scaled_dot_product_attention(q[start : start + n].transpose(0, 1)[None], k[None], v[None],
                                                     attn_mask=mask)  # [1, heads, L, hd]
                outputs.append(out[0].transpose(0, 1).reshape(n, -1))
            x = mlp_output(x, torch.cat(outputs), layer.dense_t, layer.ln_2, self.eps, layer.gate_fc_t, layer.proj_t)
        last = torch.tensor([s + n - 1 for s, n in zip(starts, lengths)], device=self.device)
        return (rms_norm(x[last], self.ln_f, self.eps) @ self.lm_head_t).float()  # [B, V]

    def decode_step(self, ids: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One token per row: ids [n] at positions pos [n], attending to the first kv_len cache entries: logits [n, V]."""
        n = ids.shape[0]
        if self.fused_decode is not None:
            return self._fused_layers(self.embed(ids), pos, kv_len)
        if self.device.type == "cpu" and n == 1:
            if self.row_decoder is not None:
                return self.row_decoder(int(ids[0]), int(pos[0]), kv_len) @ self.lm_head_t  # [1, V]
            return self._one_row_step(int(ids[0]), int(pos[0]), kv_len)
        x, rows = self.embed(ids), self.row_ids[:n]  # [n, H]
        cos, sin = self.cos[pos][:, None, None], self.sin_signed[pos][:, None, None]  # [n, 1, 1, hd]
        bias = self._mask(pos, kv_len)
        for layer, cache in zip(self.layers, self.kv_cache):
            q, kv = self.decode_attention_input(x, layer.ln_1, self.eps, layer.qkv_t, layer.qkv_b, cos, sin, self.heads)
            cache[:, rows, :, pos] = kv  # row i's key and value at position pos[i]
            out = F.scaled_dot_product_attention(q[:, :, None], cache[0, :n, :, :kv_len], cache[1, :n, :, :kv_len],
                                                 attn_mask=bias)  # [n, heads, 1, hd]
            x = self.decode_mlp_output(x, out.reshape(n, -1), layer.dense_t, layer.ln_2, self.eps, layer.gate_fc_t,
                                       layer.proj_t)
        return (rms_norm(x, self.ln_f, self.eps) @ self.lm_head_t).float()  # [n, V]

    def _one_row_step(self, token: int, at: int, kv_len: int) -> torch.Tensor:
        """decode_step for a single row on a CPU without numba's kernel (bfloat16 and float16 engines, compile_decode,
        numba missing or turned off), where every small op's overhead shows: the token and position as Python ints
        (the embedding and RoPE rows are views, the cache write a plain copy into views of cache row 0 made once),
        rms_norm_row, and no mask while the row attends to every key: logits [1, V]."""
        x, cos, sin = self.vocab_embedding[token][None], self.cos[at], self.sin_signed[at]  # [1, H], [hd], [hd]
        bias = self._mask(torch.tensor([at]), kv_len) if kv_len > at + 1 else None  # a KV bucket past the row
        # torch.compile's functions keep rms_norm (the Python float would break their graph)
        norm = rms_norm_row if self.decode_attention_input is attention_input else rms_norm
        for layer, (kv_row, k_row, v_row) in zip(self.layers, self.first_row):
            q, kv = self.decode_attention_input(x, layer.ln_1, self.eps, layer.qkv_t, layer.qkv_b, cos, sin, self.heads,
                                                norm)
            kv_row.select(2, at).copy_(kv[0])  # [2, heads, hd]
            out = F.scaled_dot_product_attention(q.unsqueeze(2), k_row.narrow(2, 0, kv_len), v_row.narrow(2, 0, kv_len),
                                                 attn_mask=bias)  # [1, heads, 1, hd]
            x = self.decode_mlp_output(x, out.view(1, -1), layer.dense_t, layer.ln_2, self.eps, layer.gate_fc_t,
                                       layer.proj_t, norm)
        return (norm(x, self.ln_f, self.eps) @ self.lm_head_t).float()  # [1, V]

    def _mask(self, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Attention bias [n, 1, 1, kv_len]: 0 up to each row's position pos[i], the dtype's minimum after it."""
        bias = torch.zeros(pos.shape[0], 1, 1, kv_len, dtype=self.dtype, device=self.device)
        return bias.masked_fill_(self.key_pos[:kv_len] > pos[:, None, None, None], self.mask_value)

    def _fused_layers(self, x, pos, kv_len: int) -> torch.Tensor:
        """The decode step's layers with the Triton kernels (triton_linear, triton_attention): a float32 residual
        stream that the two projections add into, gate · silu(fc) inside the MLP's first product, RoPE, the KV-cache
        write and attention split over the keys in one kernel."""
        kernels = self.fused_decode
        x = x.float()  # [n, H]: the residual stream
        for layer, cache in zip(self.layers, self.kv_cache):
            qkv = kernels.fused_linear(kernels.rms_norm(x, layer.ln_1, self.eps), layer.qkv_t.t(), layer.qkv_b)
            attn = self.fused_attention(qkv, self.cos, self.sin_signed, pos, cache, kv_len, self.tickets)  # [n, H]
            kernels.fused_linear(attn, layer.dense_t.t(), out=x)
            mlp = kernels.fused_linear(kernels.rms_norm(x, layer.ln_2, self.eps), layer.gate_fc_t.t(), swiglu=True)
            kernels.fused_linear(mlp, layer.proj_t.t(), out=x)  # [n, H]
        return kernels.fused_linear(kernels.rms_norm(x, self.ln_f, self.eps), self.lm_head_t.t()).float()  # [n, V]

    def reorder(self, src_rows: torch.Tensor, kv_len: int) -> None:
        """Beam search: cache row i takes row src_rows[i]'s first kv_len keys and values."""
        n = src_rows.shape[0]
        self.kv_cache[:, :, :n, :, :kv_len] = self.kv_cache[:, :, src_rows, :, :kv_len]
