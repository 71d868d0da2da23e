"""Decode back end "triton": the decode step as the engine's own Triton kernels (NVIDIA GPU; CPU via the interpreter).

A float32 residual stream that the two projections add into, gate · silu(fc) inside the MLP's first product, and
RoPE, the KV-cache write and attention split over the keys in one kernel: seven launches a layer; the embedding
lookup is the first norm's, and the output layer writes float32 logits itself. A weight-only INT8 engine's products
read int8 and scale their sums (triton_linear). The tile shapes
the autotuner picks for each product are saved in the engine's tuning.json (one entry per GPU name and Triton
version) and handed back to the autotuner by the next process that loads the engine, which then times nothing.
"""

import json
import warnings
from pathlib import Path

import torch
import triton

from ... import files
from . import DecodeStep, triton_linear
from .triton_attention import decode_attention
from .triton_linear import embed_rms_norm, fused_linear, rms_norm


def _tuning_file(path) -> bool:
    """True for a tuning file this package wrote: a JSON object of tuning keys and their choices."""
    try:
        return isinstance(json.loads(Path(path).read_text()), dict)
    except (OSError, ValueError):
        return False


TUNING_WRITER = files.writer("decode tuning", "the decode kernels' tuned choices (tuning.json beside an engine)")


class TritonDecode(DecodeStep):
    """The decode step with the kernels of triton_linear and triton_attention."""

    name = "triton"
    layout = "[out, in]"  # fused_linear streams W [N, K] row after row

    def __init__(self, engine, tuning_file=None):
        super().__init__(engine)
        half = engine.head_dim // 2
        self.sin_signed = torch.cat([-engine.sin[:, :half], engine.sin[:, half:]], dim=-1).contiguous()  # [S, hd]
        self.cos = engine.cos.contiguous()
        self.tickets = torch.zeros(engine.rows * engine.heads, dtype=torch.int32, device=engine.device)  # attention's
        self.tuning_file = None if tuning_file is None else Path(tuning_file)
        self.tuning_key = (
            f"{'interpreter' if triton_linear.INTERPRETED else torch.cuda.get_device_name(engine.device)} | "
            f"triton {triton.__version__}"
        )  # which tuned choices fit here
        choices = self._saved().get(self.tuning_key)
        if isinstance(choices, list):
            triton_linear.use_choices(choices)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """ids [n] at positions pos [n], attending to their cached keys up to pos: logits [n, V]."""
        e = self.engine
        x, h = embed_rms_norm(ids, e.vocab_embedding, e.layers[0].ln_1, e.eps)  # [n, H]: the residual stream, ln_1
        for i, (layer, cache) in enumerate(zip(e.layers, e.kv_cache)):
            if i:
                h = rms_norm(x, layer.ln_1, e.eps)
            qkv = fused_linear(h, layer.qkv_t.t(), layer.qkv_b, scale=layer.qkv_s)
            attn = decode_attention(qkv, self.cos, self.sin_signed, pos, cache, kv_len, self.tickets)  # [n, H]
            fused_linear(attn, layer.dense_t.t(), out=x, scale=layer.dense_s)
            h = rms_norm(x, layer.ln_2, e.eps)
            mlp = fused_linear(h, layer.gate_fc_t.t(), swiglu=True, scale=layer.gate_fc_s)
            fused_linear(mlp, layer.proj_t.t(), out=x, scale=layer.proj_s)  # [n, H]
        return fused_linear(rms_norm(x, e.ln_f, e.eps), e.lm_head_t.t(), dtype=torch.float32)  # [n, V]

    def _saved(self) -> dict:
        """tuning.json's entries ({tuning key: choices}), {} when there is none or it cannot be read."""
        if self.tuning_file is None:
            return {}
        try:
            entries = json.loads(self.tuning_file.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def save_tuning(self) -> None:
        """Write the autotuner's choices for this GPU into tuning.json (a read-only engine is left as it is)."""
        choices = triton_linear.tuned_choices()
        entries = self._saved()
        if self.tuning_file is None or not choices or entries.get(self.tuning_key) == choices:
            return
        entries[self.tuning_key] = choices
        try:  # the runner's own file beside the engine: replaced whenever its choices change
            text = json.dumps(entries, indent=1) + "\n"  # the entries there (another GPU's) kept, this one's added
            files.write_text(self.tuning_file, text, TUNING_WRITER, made=_tuning_file)
        except (OSError, ValueError) as err:
            warnings.warn(
                f"could not save the tuned kernel choices to {self.tuning_file} ({err}); the next process "
                "will tune them again",
                stacklevel=3,
            )
