"""Decode back end "torch": the decode step as plain PyTorch ops, the reference the other back ends are tested against."""

import torch
import torch.nn.functional as F

from ..layers import attention_input, mlp_output
from . import DecodeStep


class TorchDecode(DecodeStep):
    """One token per row through every layer with PyTorch ops, attention by SDPA over the cached keys."""

    name = "torch"
    layout = "[in, out]"  # MKL's and cuBLAS's one-row products stream it fastest (docs/engine.md)

    def __init__(self, engine, tuning_file=None):
        super().__init__(engine)
        self.row_ids = torch.arange(engine.rows, device=engine.device)
        self.mask_value = torch.finfo(engine.dtype).min

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """ids [n] at positions pos [n], attending to the first kv_len cache entries (later ones masked): logits [n, V]."""
        e, n = self.engine, ids.shape[0]
        x, rows = e.embed(ids), self.row_ids[:n]  # [n, H]
        cos, sin = e.cos[pos][:, None], e.sin[pos][:, None]  # [n, 1, hd]
        bias = torch.zeros(n, 1, 1, kv_len, dtype=e.dtype, device=e.device)
        bias.masked_fill_(e.key_pos[:kv_len] > pos[:, None, None, None], self.mask_value)  # keys after each row's pos
        for layer, cache in zip(e.layers, e.kv_cache):
            q, k, v = attention_input(x, layer, e.eps, cos, sin, e.heads)  # [n, heads, hd] each
            cache[0, rows, :, pos], cache[1, rows, :, pos] = k, v  # row i's key and value at position pos[i]
            out = F.scaled_dot_product_attention(
                q[:, :, None], cache[0, :n, :, :kv_len], cache[1, :n, :, :kv_len], attn_mask=bias
            )  # [n, heads, 1, hd]
            x = mlp_output(x, out.reshape(n, -1), layer, e.eps)
        return e.logits(x)  # [n, V]
