"""The engine: TensorRT-LLM's build-then-generate interface (prompt tables, KV cache, CUDA graphs) in PyTorch."""

from ..limits import BuildConfig
from ..requests import GenerationStream
from .build import build_engine, load_engine_config, load_engine_vision_tower, verify_engine
from .runner import ModelRunner

__all__ = [
    "BuildConfig",
    "GenerationStream",
    "ModelRunner",
    "build_engine",
    "load_engine_config",
    "load_engine_vision_tower",
    "verify_engine",
]
