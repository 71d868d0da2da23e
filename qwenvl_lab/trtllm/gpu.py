"""The optional GPU stack (tensorrt, tensorrt_llm, an NVIDIA GPU): what is missing, said clearly."""

import importlib.util

import torch

# what each piece is and how a learner gets it
GPU_STACK = {
    "tensorrt": "tensorrt (pip install tensorrt, NVIDIA GPU)",
    "tensorrt_llm": "tensorrt_llm 1.2.x (its own environment: Python 3.10/3.12, CUDA 13, libopenmpi, NVIDIA GPU; "
    "pip install 'tensorrt_llm>=1.2,<1.3' there, then pip install --no-deps -e .)",
    "cuda": "an NVIDIA GPU visible to torch (torch.cuda.is_available() is False here)",
}


class GPUStackError(RuntimeError):
    """A GPU step was asked for on a machine that lacks part of the TensorRT stack."""


def _present(need: str) -> bool:
    if need == "cuda":
        return torch.cuda.is_available()
    return importlib.util.find_spec(need) is not None


def missing_gpu_stack(*needs: str) -> list[str]:
    """The pieces of `needs` ("tensorrt", "tensorrt_llm", "cuda") this machine lacks, described."""
    unknown = [n for n in needs if n not in GPU_STACK]
    if unknown:
        raise ValueError(f"unknown GPU-stack piece(s) {unknown}; use some of {sorted(GPU_STACK)}")
    return [GPU_STACK[n] for n in needs if not _present(n)]


def require_gpu_stack(*needs: str, step: str) -> None:
    """Raise GPUStackError naming `step` and every missing piece of `needs`."""
    missing = missing_gpu_stack(*needs)
    if missing:
        raise GPUStackError(
            f"{step} needs {'; '.join(missing)}. This is a GPU step: run it on a machine with the TensorRT stack "
            "(the CPU steps — ONNX export, checkpoint conversion, the trtllm-build command line — run anywhere)"
        )
