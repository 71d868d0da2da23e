"""The engine: TensorRT-LLM's build-then-generate interface (prompt tables, KV cache, CUDA graphs) in PyTorch."""

from .build import BuildConfig, build_engine, load_engine_config, load_vision_tower
from .infer import QWenInfer, generate_for_qwenvl
from .runner import ModelRunner

__all__ = ["BuildConfig", "ModelRunner", "QWenInfer", "build_engine", "generate_for_qwenvl", "load_engine_config",
           "load_vision_tower"]
