"""Listings — the package source a notebook shows: a function whole, or an excerpt checked against the source, so
the code a learner reads is the code the tests run."""

import inspect
import re


def show_source(function) -> None:
    """Print the source of `function` (or class) whole."""
    print(inspect.getsource(function), end="")


def excerpt(function, text: str) -> None:
    """Print `text`, lines of `function`'s source; each part between '…' lines must be in the source as it is, else a
    ValueError names the part that no longer is."""
    source = inspect.getsource(function)
    for part in re.split(r"(?m)^\s*…\n", text):
        if part not in source:
            raise ValueError(f"this excerpt no longer matches the source of {function.__qualname__}:\n{part}")
    print(text, end="")
