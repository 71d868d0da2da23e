"""The course's model — the shipped toy, a small Qwen-VL trained on shape pictures, or a real Qwen-VL-Chat — its
data (`shapes`, `make_samples`, `batches`), training and evaluation, and the engine built from it once (`course`).

The names of `course` load on first use (PEP 562), so `import qwenvl_lab.toy.shapes`, pure Python, loads no torch.
"""

import importlib

_COURSE = (
    "CHECKPOINT_ENV",
    "COURSE_BUILD",
    "DATA_DIR",
    "TOY_CONFIG",
    "TOY_DIR",
    "course_engine",
    "default_checkpoint_dir",
    "load_course_model",
    "load_toy_model",
)
__all__ = sorted(_COURSE)


def __getattr__(name):
    """A name of `toy.course`, imported on first use."""
    if name not in _COURSE:
        raise AttributeError(f"module 'qwenvl_lab.toy' has no attribute {name!r}")
    return getattr(importlib.import_module(".course", __name__), name)


def __dir__():
    return __all__
