"""Engine, decode back ends — one decode step, four implementations behind one interface.

A back end is built from a LanguageModelEngine and called as `step(ids [n], pos [n], kv_len) -> logits [n, V]`: one
new token per row, each written into the KV cache at its position and attending to the cached keys up to it (keys
from pos + 1 to kv_len are masked). All four give the same tokens; they differ in speed and in where they run:

| name | what runs | where |
|---|---|---|
| "torch" | plain PyTorch ops (`engine.layers`): the reference | anywhere |
| "compiled" | the same ops fused by torch.compile | anywhere (CUDA needs triton) |
| "triton" | the engine's Triton kernels (`triton_linear`, `triton_attention`) | NVIDIA GPU; CPU via the interpreter |
| "numba" | one compiled call for a one-row step (batches of more rows: "torch") | CPU, float32 |

"auto" picks "triton" on an NVIDIA GPU when triton is installed, else "compiled" there; on a CPU "numba" for float32
engines when numba is installed, else "torch". On CUDA every back end runs inside CUDA graphs (`cuda_graphs`).
"""

import importlib
import importlib.util

import torch

BACKENDS = ("torch", "compiled", "triton", "numba")
TRITON_MAX_ROWS = 16  # the Triton kernels take one tile of rows: max_batch_size × max_beam_width at most
_MODULES = {
    "torch": ("torch_ops", "TorchDecode"),
    "compiled": ("compiled", "CompiledDecode"),
    "triton": ("triton_step", "TritonDecode"),
    "numba": ("numba_step", "NumbaDecode"),
}


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def choose_backend(name: str, device, dtype: torch.dtype, rows: int) -> str:
    """The back end `name` stands for ("auto" resolved) on this device, dtype and number of cache rows; refuse a back
    end that cannot run here, saying why and what to choose instead."""
    device = torch.device(device)
    if name == "auto":
        if device.type == "cuda":
            return (
                "triton"
                if _installed("triton") and rows <= TRITON_MAX_ROWS
                else "compiled"
                if _installed("triton")
                else "torch"
            )
        return "numba" if dtype == torch.float32 and _installed("numba") else "torch"
    if name not in BACKENDS:
        raise ValueError(f'decode_backend must be "auto" or one of {BACKENDS}, got {name!r}')
    if name in ("triton", "compiled") and device.type == "cuda" and not _installed("triton"):
        raise ValueError(
            f'decode_backend="{name}" on CUDA needs triton (CUDA builds of torch bring it); choose "torch"'
        )
    if name == "triton":
        if not _installed("triton"):
            raise ValueError('decode_backend="triton" needs triton (pip install triton, Linux); choose "auto"')
        if device.type != "cuda" and not importlib.import_module("triton").knobs.runtime.interpret:
            raise ValueError(
                f"the Triton decode kernels run on an NVIDIA GPU, not on {device.type}; a CPU runs them "
                "only through Triton's interpreter (TRITON_INTERPRET=1 set before torch is imported, as "
                'the tests do). Choose decode_backend="auto"'
            )
        if rows > TRITON_MAX_ROWS:
            raise ValueError(
                f"the Triton decode kernels take at most {TRITON_MAX_ROWS} rows a step, and this engine "
                f"holds {rows} (max_batch_size × max_beam_width): build it smaller or choose "
                'decode_backend="compiled"'
            )
    if name == "numba":
        if not _installed("numba"):
            raise ValueError('decode_backend="numba" needs numba (pip install numba); choose "torch"')
        if device.type != "cpu" or dtype != torch.float32:
            raise ValueError(
                f"the numba decode kernel runs float32 engines on a CPU, not {dtype} on {device.type}: "
                'build the engine with dtype float32, or choose decode_backend="auto"'
            )
    return name


def make_decode_step(name: str, engine):
    """The decode step of back end `name` (one of BACKENDS) over `engine`."""
    module, cls = _MODULES[name]  # imported on use: triton and numba are optional
    return getattr(importlib.import_module(f".{module}", __name__), cls)(engine)
