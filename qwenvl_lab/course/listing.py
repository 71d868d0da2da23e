"""Listings — the package source a notebook shows: a function whole, or an excerpt checked against the source, so
the code a learner reads is the code the tests run."""

import inspect
import re


def show_source(function, first: str | None = None, last: str | None = None) -> None:
    """Print the source of `function` (or class): whole, or from its line holding `first` to the next holding `last`
    (to its end without `last`); a ValueError when either is no longer in it."""
    lines = inspect.getsource(function).splitlines(keepends=True)
    start = 0 if first is None else next((k for k, line in enumerate(lines) if first in line), None)
    end = (
        len(lines) - 1
        if last is None or start is None
        else next((k for k in range(start, len(lines)) if last in lines[k]), None)
    )
    if start is None or end is None:
        missing = first if start is None else last
        raise ValueError(f"no line of {function.__qualname__}'s source holds {missing!r}: the listing is out of date")
    print("".join(lines[start : end + 1]), end="")


def excerpt(function, text: str) -> None:
    """Print `text`, lines of `function`'s source; each part between '…' lines must be in the source as it is, else a
    ValueError names the part that no longer is."""
    source = inspect.getsource(function)
    for part in re.split(r"(?m)^\s*…\n", text):
        if part not in source:
            raise ValueError(f"this excerpt no longer matches the source of {function.__qualname__}:\n{part}")
    print(text, end="")
