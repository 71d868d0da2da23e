"""The optional GPU stack (tensorrt, tensorrt_llm, an NVIDIA GPU): what is missing, said clearly."""

import importlib.util

import torch

TENSORRT_LLM_VERSION = "1.2.1"
TENSORRT_PIN = "tensorrt~=10.14.1"  # what tensorrt_llm 1.2.1 requires (its PKG-INFO): the TensorRT of every plan here

# what each piece is and how a learner gets it
GPU_STACK = {
    "tensorrt": f"tensorrt 10.14.1 ({TENSORRT_PIN}), the one tensorrt_llm {TENSORRT_LLM_VERSION} pins, as a plan loads "
    "only in the TensorRT that built it: it comes with tensorrt_llm (make trtllm-env); pip install -e '.[trtllm]' "
    "gives the same one to this environment",
    "tensorrt_llm": f"tensorrt_llm {TENSORRT_LLM_VERSION} in its own environment (Python 3.12, CUDA Toolkit 13.1, "
    "libopenmpi, NVIDIA GPU): make trtllm-env, or the steps in docs/tensorrt.md",
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
