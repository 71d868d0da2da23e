"""The command line's option types: every option's value checked as it is parsed, refused with the option's name.

Each type is a function argparse calls on the text typed; it returns the value or raises ArgumentTypeError with what
was wrong and what to give instead, and `Parser` prints that as one line that starts with the option as typed
(`--max-new-tokens must be a whole number >= 1, got '0'`). Each type carries a `kind` (and its bounds),
so a test can read every option of every subcommand from its parser and know what each accepts.
"""

import argparse
import math
import os
import re
import stat
from pathlib import Path

from .checks.values import unusable_path
from .pictures import load_image

INT32_MAX = 2**31 - 1  # the default upper bound of a whole number: the engine keeps sizes and ids as int32
SEED_MAX = 2**32 - 1  # random seeds: what every generator the package seeds accepts (numpy's legacy one included)


class Parser(argparse.ArgumentParser):
    """argparse whose errors name the option as typed (`--n must be …`, not `argument --n: …`), and which runs
    `check(parser, args)` — the checks that span several options, each refused with `parser.error` — once every
    option is parsed, so that parsing an argument list checks all of it."""

    def __init__(self, *args, check=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.check = check

    def parse_known_args(self, args=None, namespace=None):
        """argparse's parse, then `check` on the options together."""
        parsed, rest = super().parse_known_args(args, namespace)
        if self.check is not None:
            self.check(self, parsed)
        return parsed, rest

    def error(self, message: str):
        """argparse's error, its message starting with the option as typed."""
        super().error(re.sub(r"^argument (\S+): ", r"\1 ", message))


def _typed(kind: str, name: str, **bounds):
    """Decorate an option type with its kind and bounds (what a test reads) and a name argparse can print."""

    def mark(parse):
        parse.kind, parse.__name__ = kind, name
        for key, value in bounds.items():
            setattr(parse, key, value)
        return parse

    return mark


def whole(low: int, high: int = INT32_MAX, multiple: int = 1):
    """An option type: a whole number from `low` to `high` (a multiple of `multiple`)."""
    span = (f">= {low}" if high == INT32_MAX else f"from {low} to {high}") + (
        f", a multiple of {multiple}" if multiple > 1 else ""
    )

    @_typed("whole", f"whole number {span}", low=low, high=high, multiple=multiple)
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be a whole number of at most {high}, got {text!r}")
        if value is None or value < low or value % multiple:
            raise argparse.ArgumentTypeError(f"must be a whole number {span}, got {text!r}")
        return value

    return parse


def real(low: float = -math.inf, high: float = math.inf, above: bool = False):
    """An option type: a finite number from `low` (above it, if `above`) to `high`."""
    span = f"{'above' if above else 'at least'} {low:g}" + (f" and at most {high:g}" if high < math.inf else "")

    @_typed("real", f"number {span}", low=low, high=high, above=above)
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if above else value >= low) and value <= high):
            raise argparse.ArgumentTypeError(f"must be a finite number {span}, got {text!r}")
        return value

    return parse


@_typed("device", "device")
def device(text: str) -> str:
    """An option type: a torch device this machine has (cpu, or cuda with a CUDA GPU)."""
    import torch  # noqa: PLC0415 — only once a device is asked for: `--help` answers without torch

    try:
        found = torch.device(text)
    except (RuntimeError, ValueError):
        found = None
    if found is None or found.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use cpu or cuda")
    if found.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: torch sees no CUDA GPU here; use cpu")
    if found.type == "cuda" and found.index is not None and found.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text}: this machine has {torch.cuda.device_count()} CUDA GPU(s), numbered from 0; use cuda or cuda:0"
        )
    return text


@_typed("text", "text")
def text(value: str) -> str:
    """An option type: text that is not empty (nor only spaces)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("is empty: type the text, or leave the option out for its default")
    return value


def _where(value: str):
    """os.stat of the path typed: its result, None when nothing is there, or an ArgumentTypeError saying why the path
    cannot be used at all (a name too long, a file where a folder should be, a loop of links, no right to look)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("is empty: give a path")
    try:
        return os.stat(value)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{value!r} cannot be used: {unusable_path(value, err)}") from None
    except (ValueError, UnicodeError) as err:  # a NUL byte, a lone surrogate
        raise argparse.ArgumentTypeError(f"{value!r} is not a path this system can use ({err})") from None


@_typed("picture", "picture file")
def picture(value: str) -> str:
    """An option type: a picture file that is there and that the course's picture reader reads (PNG, JPEG, …)."""
    found = _where(value)
    if found is None:
        raise argparse.ArgumentTypeError(f"{value!r}: no such file; give a picture file (PNG, JPEG, …)")
    if stat.S_ISDIR(found.st_mode):
        raise argparse.ArgumentTypeError(f"{value!r} is a folder, not a picture: give a PNG or JPEG file")
    try:
        load_image(value)  # read as the command will read it: a file it cannot read is refused now
    except (ValueError, OSError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def folder_with(marker: str, what: str):
    """An option type: a folder that is there and holds `marker` (config.json: a checkpoint, an engine)."""

    @_typed("folder_with", what, marker=marker)
    def parse(value: str) -> Path:
        found = _where(value)
        if found is None:
            raise argparse.ArgumentTypeError(f"{value!r}: no such folder; give {what}")
        path = Path(value)
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{value!r} is a file, not a folder: give {what}")
        if not (path / marker).is_file():
            raise argparse.ArgumentTypeError(f"{value!r} holds no {marker}, so it is not {what}")
        return path

    return parse


@_typed("output_folder", "folder to write in")
def output_folder(value: str) -> Path:
    """An option type: a folder to write in, there already or not (then made when the command writes): not a file."""
    found = _where(value)
    if found is not None and not Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a file: give a folder")
    return Path(value)


@_typed("output_file", "file to write")
def output_file(value: str) -> Path:
    """An option type: a file to write: not a folder."""
    found = _where(value)
    if found is not None and Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a folder: give the path of a file to write")
    return Path(value)


def input_file(what: str, read=None):
    """An option type: a file that is there (not a folder): `what` it should be (an ONNX graph, a dump); with `read`,
    a file that `read(path)` reads without an error (its format checked before any work)."""

    @_typed("input_file", what, format=read is not None)
    def parse(value: str) -> Path:
        found = _where(value)
        if found is None:
            raise argparse.ArgumentTypeError(f"{value!r}: no such file; give {what}")
        if stat.S_ISDIR(found.st_mode):
            raise argparse.ArgumentTypeError(f"{value!r} is a folder: give {what}")
        if read is not None:
            try:
                read(Path(value))
            except Exception as err:  # whatever the reader raises (onnx: protobuf's DecodeError): one line
                reason = " ".join(str(err).split()) or type(err).__name__
                raise argparse.ArgumentTypeError(f"{value!r} is not {what}: {reason}") from None
        return Path(value)

    return parse
