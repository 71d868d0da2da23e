"""Exercises — the notebooks' checks, kept out of the notebooks so a cell never shows the formula it checks.

`check("03.2", answer)` confirms a right answer, gives a hint (not the solution) for a wrong one, and says "not
attempted yet" for None. The result is truthy only when the answer is right, so a solution cell can `assert` it.
Each notebook's exercises live in their own module (`nb01`, `nb02`, …), registered with `@exercise`.
"""

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from ...checks.values import is_int
from ..notebooks import with_exercises

NOTEBOOK_MODULES = tuple(n.exercise_module for n in with_exercises())  # modules that register exercises


@dataclass(frozen=True)
class Exercise:
    """One exercise: its key ("NN.k": notebook NN, exercise k), what it asks, and its check."""

    key: str
    question: str
    check: Callable  # answer -> None when right, else a hint (str)


@dataclass(frozen=True)
class Result:
    """The outcome of a check: `ok` is True only for a right answer; `message` says so, or hints."""

    key: str
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"exercise {self.key}: {self.message}"

    __repr__ = __str__


REGISTRY: dict[str, Exercise] = {}


def whole_number(answer):
    """`answer` as an int when it is one whole number (an int, a numpy or 0-d torch integer), else None."""
    if is_int(answer):
        return int(answer)
    if isinstance(answer, torch.Tensor) and answer.numel() == 1 and not answer.dtype.is_floating_point:
        return None if answer.dtype == torch.bool else int(answer)
    return None


def int_list(value):
    """A sequence of whole numbers (a list, a tuple, a 1-D integer tensor or array) as a list of ints, else None."""
    if isinstance(value, (str, bytes)) or whole_number(value) is not None:
        return None
    try:
        items = list(value.tolist() if hasattr(value, "tolist") else value)
    except TypeError:
        return None
    numbers = [whole_number(item) for item in items]
    return None if any(n is None for n in numbers) else numbers


def exercise(key: str, question: str):
    """Register a check function (answer -> None or a hint) as exercise `key`."""

    def register(check: Callable) -> Callable:
        if key in REGISTRY:
            raise ValueError(f"exercise {key} is registered twice")
        REGISTRY[key] = Exercise(key, question, check)
        return check

    return register


def _load() -> None:
    for module in NOTEBOOK_MODULES:
        importlib.import_module(f".{module}", __name__)


def check(key: str, answer) -> Result:
    """Check `answer` to exercise `key`: right, a hint, or not attempted yet (answer None)."""
    _load()
    if key not in REGISTRY:
        raise KeyError(f"no exercise {key!r}; the exercises are {sorted(REGISTRY)}")
    if answer is None:
        return Result(key, False, "not attempted yet — replace None with your answer")
    try:
        hint = REGISTRY[key].check(answer)
    except Exception as err:  # a learner's function that fails is a hint too, not a crash of the check
        hint = f"your answer raised {type(err).__name__}: {err}"
    if hint is not None and hint.startswith("not attempted yet"):  # a stub function, still returning None
        return Result(key, False, hint)
    return Result(key, hint is None, "correct" if hint is None else f"not yet — {hint}")
