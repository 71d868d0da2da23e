"""Files — reading the package's JSON configs with errors that name the file, the key and what to do."""

import json
import math
import os
import secrets
import shutil
import stat
from pathlib import Path

from .checks.values import is_int, is_number


class CheckpointError(ValueError):
    """A checkpoint or engine directory that cannot be read as what it claims to be (the message names the file)."""


def read_json(path, fix: str) -> dict:
    """The JSON object in file `path`; a missing file, invalid JSON or a non-object is refused, naming `fix`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} not found; {fix}")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(
            f"{path} is not valid JSON (not UTF-8 text: {err.reason} at byte {err.start}); {fix}"
        ) from None
    except json.JSONDecodeError as err:
        raise CheckpointError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); {fix}"
        ) from None
    except RecursionError:
        raise CheckpointError(f"{path} is not valid JSON (nested too deeply to read); {fix}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} must hold a JSON object, found {type(value).__name__}; {fix}")
    return value


def field(config: dict, key: str, kind: str, where, fix: str):
    """config[key] checked to be of `kind`: "int" (>= 1), "count" (>= 0), "positive" (a finite number > 0), "str",
    "bool" or "dict"; a missing key or a value of the wrong type is refused, naming the key and `where` (a file)."""
    if key not in config:
        raise CheckpointError(f"{where} has no {key!r}; {fix}")
    value = config[key]
    number = is_number(value)
    ok = {
        "int": is_int(value) and value >= 1,
        "count": is_int(value) and value >= 0,
        "positive": number and math.isfinite(value) and value > 0,
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "dict": isinstance(value, dict),
    }[kind]
    if not ok:
        wanted = {
            "int": "a positive integer",
            "count": "an integer >= 0",
            "positive": "a finite number > 0",
            "str": "a string",
            "bool": "true or false",
            "dict": "an object",
        }[kind]
        raise CheckpointError(f"{where}: {key!r} must be {wanted}, found {value!r} ({type(value).__name__}); {fix}")
    return value


def sibling_name(target: Path) -> Path:
    """A new name beside `target` for a temporary folder or file that will replace it (`.NAME.<random>.tmp`)."""
    return target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"


def put_in_place(staging: Path, target: Path) -> None:
    """Give the files of the finished folder `staging` its permissions (the umask's, as mkdir applied them), then put it
    in `target`'s place by renames: an earlier `target` is moved aside first and removed after."""
    files_mode = stat.S_IMODE(staging.stat().st_mode) & 0o666
    for path in staging.rglob("*"):
        if path.is_file():  # safetensors writes its files 0600 whatever the umask
            path.chmod(files_mode)
    if target.exists():
        replaced = sibling_name(target)
        os.replace(target, replaced)
        os.replace(staging, target)
        shutil.rmtree(replaced, ignore_errors=True)  # else removed with the next writer's leftovers
    else:
        os.replace(staging, target)


def put_file(data: bytes, target: Path) -> None:
    """Write `data` as the file `target` the one way: into a new temporary file beside it (the umask's permissions),
    flushed to disk, then renamed into place, so a reader sees the old file or the whole new one, never a part."""
    target = Path(target)
    staging = sibling_name(target)
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, target)
    finally:
        if staging.exists():
            staging.unlink()
