"""Checks of plain Python values: an int is an int and not a bool, a number is finite and in its range, a path is one
the file system can take."""

import errno
import math
import numbers
import os
import warnings
from pathlib import Path


def is_int(value) -> bool:
    """True for an integer (Python's or numpy's) that is not a bool (bool is an int subclass: True would pass as 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """True for a real number (int or float, Python's or numpy's) that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int: a TypeError for a non-integer (bool, float, str …), a ValueError outside [minimum, maximum]."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = (
            f">= {minimum}" if maximum is None else f"<= {maximum}" if minimum is None else f"in [{minimum}, {maximum}]"
        )
        raise ValueError(f"{name} must be an int {bounds}, got {value}")
    return int(value)


def check_number(name: str, value, minimum: float = -math.inf, maximum: float = math.inf, open_minimum=False) -> float:
    """A finite real `value` in its range: a TypeError for a non-number (bool, str …), a ValueError outside it."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < minimum or (open_minimum and value == minimum) or value > maximum:
        low = f"{'>' if open_minimum else '>='} {minimum:g}"
        bounds = f"{low} and <= {maximum:g}" if maximum < math.inf else low
        raise ValueError(f"{name} must be a finite number {bounds}, got {value!r}")
    return value


def check_path(name: str, path) -> Path:
    """`path` (a str or os.PathLike) as a Path: a TypeError for anything else, a ValueError for an empty path, one
    holding a NUL character, or text the file system cannot encode (a lone surrogate such as '\\ud800', which broken
    copy-and-paste or a bad decoding leaves in a string)."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"{name} must be a path (a str or os.PathLike), got {type(path).__name__} {path!r}")
    if not path:
        raise ValueError(f"{name} is empty: give a path")
    if "\0" in path:
        raise ValueError(f"{name} {path!r} holds a NUL character, which no file name can hold: type the path again")
    try:
        os.fsencode(path)
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{name} {path!r} cannot be encoded as a file name ({err.reason}: {path[err.start]!r} at character "
            f"{err.start}): type the path again without it"
        ) from None
    return Path(path)


def check_choice(name: str, value, choices):
    """`value` if it is one of `choices` (compared by equality and type, so True is not 1), else a ValueError."""
    if not any(value == c and type(value) is type(c) for c in choices):
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_model_limits(build_config, max_position_embeddings: int, seq_length: int) -> None:
    """Raise when a BuildConfig's max_seq_len does not fit the model; warn past seq_length, where Qwen-VL's dynamic NTK
    would start."""
    if build_config.max_seq_len > max_position_embeddings:
        raise ValueError(
            f"max_seq_len {build_config.max_seq_len} exceeds the model's max_position_embeddings {max_position_embeddings}"
        )
    if build_config.max_seq_len > seq_length:
        warnings.warn(
            f"max_seq_len {build_config.max_seq_len} > seq_length {seq_length}: past that length Qwen-VL applies "
            "dynamic NTK and logn attention, which this engine (like TensorRT-LLM) does not, so long answers differ "
            "from the original model",
            stacklevel=3,
        )


def unusable_path(path, err: OSError) -> str:
    """Why the system refused to look at `path` (its OSError), in words that say what to change."""
    if err.errno == errno.ENAMETOOLONG:
        parts = Path(path).parts
        longest = max((len(os.fsencode(part)) for part in parts), default=0)
        if longest > 255:
            return f"a name in it is {longest} bytes long, more than a file system allows (255 bytes): rename it"
        return f"it is {len(os.fsencode(path))} bytes long, more than this system allows: use a shorter path"
    return f"{err.strerror or err}: give a path that can be read"
