"""Engine, decode back ends — the decode step: a PyTorch reference and one fast path per device, chosen by name.

A back end is a class built over a LanguageModelEngine and called as `step(ids [n], pos [n], kv_len) -> logits
[n, V]`: one new token per row, each written into the KV cache at its position and attending to the cached keys up
to it (keys from pos + 1 to kv_len are masked). All give the same tokens; they differ in speed and in where they run:

| backend | what runs | where |
|---|---|---|
| "torch" | plain PyTorch ops (`engine.layers`): the reference | anywhere |
| "numba" | every layer of every row as one compiled call | a CPU, float32 engines without weight-only INT8 |
| "triton" | the engine's Triton kernels (`triton_linear`, `triton_attention`) | an NVIDIA GPU (a CPU via the interpreter) |

A weight-only INT8 engine runs on "torch" (each int8 matrix dequantised where it is used) and "triton" (its
products read the int8 and scale the sums).

Nothing is chosen for the caller: `ModelRunner(backend=..., cuda_graphs=...)` names the step, and a back end that
cannot run here is refused with what to choose instead. FAST_PATH names each device's fast path (the benchmark's
default). Each back end says how the engine keeps its weight matrices for it (`layout`) and owns every other
tensor it needs; it writes only the KV cache.
"""

import importlib
import importlib.util

import torch

from ...checks.values import check_choice

BACKENDS = ("torch", "numba", "triton")
FAST_PATH = {"cpu": "numba", "cuda": "triton"}  # the one fast back end of each device type
_MODULES = {
    "torch": ("torch_ops", "TorchDecode"),
    "numba": ("numba_step", "NumbaDecode"),
    "triton": ("triton_step", "TritonDecode"),
}


class DecodeStep:
    """What every back end is: built over an engine, called as step(ids [n], pos [n], kv_len) -> logits [n, V]."""

    name = ""
    layout = "[in, out]"  # how the engine keeps the weight matrices this step reads (engine.forward.LAYOUTS)

    def __init__(self, engine, tuning_file=None):
        self.engine = engine

    def save_tuning(self) -> None:
        """Keep what the first steps tuned for the next process that loads the engine (only Triton tunes)."""


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def backend_class(name: str, device, dtype: torch.dtype, cuda_graphs: bool = False, weight_only=None) -> type:
    """The class of back end `name` for an engine of `dtype` (and weight-only precision) on `device` (CUDA graphs or
    not); refuse a back end or CUDA graphs that cannot run here, saying why and what to choose instead."""
    device = torch.device(device)
    check_choice("backend", name, BACKENDS)
    check_choice("cuda_graphs", cuda_graphs, (False, True))
    if cuda_graphs and device.type != "cuda":
        raise ValueError(f"CUDA graphs need device='cuda', not {device.type!r}: leave cuda_graphs=False")
    if name == "numba":
        if not _installed("numba"):
            raise ValueError('backend="numba" needs numba (pip install numba); choose backend="torch"')
        if device.type != "cpu" or dtype != torch.float32:
            raise ValueError(
                f"the numba decode kernel runs float32 engines on a CPU, not {dtype} on {device.type}: "
                f'build the engine with dtype float32, or choose backend="torch"'
                + (' (on an NVIDIA GPU, backend="triton")' if device.type == "cuda" else "")
            )
        if weight_only is not None:
            raise ValueError(
                f'the numba decode kernel reads float32 weights, not weight-only {weight_only}: choose backend="torch" '
                "on a CPU (it dequantises each int8 matrix where it is used), or build the engine without weight_only"
            )
    if name == "triton":
        if not _installed("triton"):
            raise ValueError('backend="triton" needs triton (CUDA builds of torch bring it); choose backend="torch"')
        if device.type != "cuda" and not importlib.import_module("triton").knobs.runtime.interpret:
            raise ValueError(
                f"the Triton decode kernels run on an NVIDIA GPU, not on {device.type}; a CPU runs them only "
                "through Triton's interpreter (TRITON_INTERPRET=1 set before torch is imported, as the tests "
                f'do). Choose backend="{FAST_PATH.get(device.type, "torch")}" or "torch"'
            )
    module, cls = _MODULES[name]  # imported on use: numba and triton are optional
    return getattr(importlib.import_module(f".{module}", __name__), cls)
