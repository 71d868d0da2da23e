"""Files — the one way the package reads a JSON config, writes a file or a folder, and deletes what it made.

Writing: every writer of the package has a name (`writer`) and writes through `writing_file` or `writing_folder`.
Both check the destination before the work — the path, what is there already, that its folder takes files, that it
has room for the bytes the writer says it needs — then write into a staging folder beside it (marked as the
package's own, see MARK), and put the result in place by a rename only when it is complete. A failure names the
user's path, never the staging one. An existing file is replaced only when asked (overwrite=True); an existing
folder only when asked and the package made it.

Deleting: `remove_made` deletes the files a folder's mark lists and nothing else, and says what it kept;
`remove_leftovers` deletes the staging folders that killed writers left, recognised by their mark, not their name.
"""

import errno
import json
import math
import os
import re
import secrets
import shutil
import stat
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from .checks.values import check_path, is_int, is_number

try:
    import fcntl  # POSIX: a staging folder's writer holds a lock on its mark while it lives
except ImportError:  # Windows
    fcntl = None

MARK = ".qwenvl-lab-made"  # in every folder the package writes: JSON naming the writer and the files it wrote
DISPOSABLE = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})  # what a file browser leaves in a folder it showed
ROOM_MARGIN = 2**20  # bytes left free beyond a writer's estimate
WRITERS: dict[str, str] = {}  # every writer of the package: its name → what it writes
_HELD: dict[Path, int] = {}  # staging folder → the open descriptor of its mark (locked while its writer lives)


class CheckpointError(ValueError):
    """A checkpoint or engine directory that cannot be read as what it claims to be (the message names the file)."""


class WriteError(OSError):
    """A write that failed or was refused: the message names the user's path and says what to do."""

    def __str__(self):
        return self.strerror or super().__str__()


class NotWritableError(WriteError, PermissionError):
    """A folder that takes no files (permission denied, a read-only file system)."""


def read_json(path, fix: str) -> dict:
    """The JSON object in file `path`; a missing file, invalid JSON or a non-object is refused, naming `fix`."""
    path = check_path("path", path)
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


# --- writers


def writer(name: str, what: str) -> str:
    """Register a writer of the package (`name`, as its errors and the reliability tests call it; `what` it writes);
    returns the name, which writing_file and writing_folder take."""
    WRITERS[name] = what
    return name


def size_text(n: int) -> str:
    """A byte count for people: '1.3 GB', '12 MB', '640 bytes'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def free_bytes(folder) -> int:
    """Bytes free to this user on the file system of `folder`."""
    return shutil.disk_usage(folder).free


def _existing_ancestor(path: Path) -> Path:
    """`path`'s nearest folder that exists (itself when it does)."""
    path = Path(os.path.abspath(path))
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def check_room(folder, need_bytes: int, target) -> None:
    """Refuse, before any work, a write of about `need_bytes` into `folder` whose file system has less free."""
    free = free_bytes(folder)
    if free < need_bytes + ROOM_MARGIN:
        raise WriteError(
            errno.ENOSPC,
            f"no room for {target}: it needs about {size_text(need_bytes)}, the device of {folder} has "
            f"{size_text(free)} free; free some space, or write it elsewhere",
        )


def _probe(folder: Path, target) -> None:
    """Refuse a folder that takes no new entries (a read-only folder or file system), by making one and removing it."""
    probe = folder / f".qwenvl-lab-probe.{secrets.token_hex(4)}.tmp"
    try:
        os.mkdir(probe)
    except OSError as err:
        raise _failure(err, target, folder) or err from None
    os.rmdir(probe)


def _listing(entries) -> str:
    entries = sorted(entries)
    return ", ".join(entries[:6]) + (" …" if len(entries) > 6 else "")


def _content(folder: Path) -> list[str]:
    """Every file, link and empty folder inside `folder` (relative POSIX paths; empty folders end in /)."""
    found = []
    for root, dirs, names in os.walk(folder):
        here = Path(root).relative_to(folder)
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        found += [(here / n).as_posix() for n in names + links]
        dirs[:] = [d for d in dirs if d not in links]
        if here != Path(".") and not names and not dirs:
            found.append(here.as_posix() + "/")
    return sorted(found)


def check_destination(  # noqa: PLR0913 — each writer's rule for what it may replace, one argument each
    target,
    name: str,
    *,
    folder: bool,
    overwrite: bool = False,
    need_bytes: int = 0,
    parents: bool = False,
    allow=None,
    made=None,
    probe: bool = True,
) -> Path:
    """Check, before any work, that writer `name` may write `target` (a file, or a folder when `folder`); returns where
    it goes (a symbolic link to an existing folder is followed). Refused: a path the file system cannot take, a link
    to nothing, a file where a folder goes or the reverse, an existing file unless `overwrite` (or, with `made`, one
    that made(path) says the package wrote: replaced without asking), a folder that is not empty unless the writer's `allow(folder,
    overwrite)` accepts it (by default: `overwrite` and a folder the package made, see MARK), a missing folder around
    it unless `parents`, a folder that takes no files, a device with less room than `need_bytes`."""
    what = WRITERS[name]
    target = check_path(name, target)
    dest = _through_link(target, folder, what)
    if dest.is_dir() and not folder:
        raise IsADirectoryError(f"{target} is a folder: give a file name for {what}")
    if dest.exists() and folder and not dest.is_dir():
        raise NotADirectoryError(f"{target} is a file, not a folder: give a folder for {what}")
    if dest.is_file() and not overwrite and not (made is not None and made(dest)):
        raise FileExistsError(
            f"{target} already exists"
            + (f" and is not {what} this package wrote" if made is not None else "")
            + ": pass overwrite=True (--overwrite) to replace it, or give another name"
        )
    if folder and dest.is_dir() and any(dest.iterdir()):
        if allow is None:
            _made_here(dest, overwrite, target, what)
        else:
            allow(dest, overwrite)
    around = dest.parent
    if around.exists() and not around.is_dir():
        raise NotADirectoryError(f"{around} is a file, so {target} cannot be written: give another path")
    if not around.exists() and not parents:
        raise FileNotFoundError(
            f"the folder {around} does not exist: create it first, or give another place for {target}"
        )
    existing = _existing_ancestor(around)
    if probe:
        _probe(existing, target)
    check_room(existing, need_bytes, target)
    return dest


def _through_link(target: Path, folder: bool, what: str) -> Path:
    """Where a write of `target` goes: a symbolic link to an existing folder leads there (for a folder writer); a link
    to nothing, or to a file, is refused."""
    if not target.is_symlink():
        return target
    real = target.resolve()
    if not real.exists():
        raise FileNotFoundError(
            f"{target} is a symbolic link to {real}, which does not exist: remove the link, or create {real} first; "
            "nothing was written"
        )
    if not (folder and real.is_dir()):
        raise FileExistsError(
            f"{target} is a symbolic link (to {real}): refusing to write {what} through it; remove the link or give "
            "another path"
        )
    return real


def _made_here(dest: Path, overwrite: bool, target, what: str) -> None:
    """The default rule for a folder that is not empty: replaced only with overwrite and when the package made it."""
    if made_files(dest) is None:
        raise FileExistsError(
            f"{target} is not empty and holds nothing this package wrote ({_listing(_content(dest))}): refusing to "
            f"write {what} over it; give a new or empty folder"
        )
    if not overwrite:
        raise FileExistsError(
            f"{target} already holds {what}: pass overwrite=True (--overwrite) to replace it, or give another folder"
        )


# --- the mark, staging and leftovers


def _write_mark(folder: Path, content: dict) -> int:
    """Write `folder`'s mark (exclusive: never over another); the open descriptor, locked where the system can."""
    fd = os.open(folder / MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    os.write(fd, (json.dumps({"made_by": "qwenvl-lab", **content}, ensure_ascii=False) + "\n").encode())
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def read_mark(folder) -> dict | None:
    """The mark the package wrote in `folder`, or None when there is none (or it is not one of the package's)."""
    path = Path(folder) / MARK
    try:
        if path.is_symlink() or not path.is_file():
            return None
        mark = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and mark.get("made_by") == "qwenvl-lab" else None


def made_files(folder) -> dict[str, list[int]] | None:
    """{file: [bytes, mtime_ns]} of the files the package wrote in `folder` as its mark lists them, or None when the
    package did not make it."""
    mark = read_mark(folder)
    if mark is None or mark.get("staging") or not isinstance(mark.get("files"), dict):
        return None
    return mark["files"]


def _alive(folder: Path) -> bool:
    """True while the writer of a staging folder still runs (it holds the lock on its mark)."""
    if fcntl is None:
        return True  # no lock to ask: never taken for a leftover
    try:
        fd = os.open(folder / MARK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def remove_leftovers(dest, name: str | None = None) -> list[Path]:
    """Delete what killed writers of `dest` (or, given its `name`, of any destination of that writer: a numbering
    writer's next run writes another name) left beside it: staging folders marked as the package's whose writer no
    longer runs (whole: every byte in them is the package's), and finished ones or earlier versions moved aside (only
    the files their mark lists). Recognised by the mark, never by a name. The folders removed."""
    dest = Path(dest)
    removed = []
    try:
        siblings = [p for p in dest.parent.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    except OSError:
        return removed
    for path in siblings:
        if path.is_symlink() or not path.is_dir():
            continue
        mark = read_mark(path)
        if mark is None or (mark.get("target") != dest.name and (name is None or mark.get("writer") != name)):
            continue
        if mark.get("staging"):
            if not _alive(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        elif not _alive(path) and not remove_made(path, report=dest):  # finished, under a hidden name: moved aside
            removed.append(path)
    return removed


def _staging(dest: Path, name: str, parents: bool, target) -> Path:
    """A new staging folder beside `dest`, marked as writer `name`'s and locked while this process lives."""
    if parents and not dest.parent.is_dir():
        make_folder(dest.parent, parents=True)
    remove_leftovers(dest, name)
    while True:
        staging = dest.parent / f".{dest.name[:64]}.{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(staging)  # with the umask's permissions, like every file written into it
            break
        except FileExistsError:
            continue
        except OSError as err:
            raise _failure(err, target, dest.parent) or err from None
    _HELD[staging] = _write_mark(staging, {"writer": name, "staging": True, "target": dest.name, "pid": os.getpid()})
    return staging


def _release(staging: Path) -> None:
    fd = _HELD.pop(staging, None)
    if fd is not None:
        os.close(fd)


def _discard(staging: Path) -> None:
    """Remove a staging folder (every byte in it is the package's) and let go of its lock."""
    _release(staging)
    shutil.rmtree(staging, ignore_errors=True)


def _seal(staging: Path, name: str, dest: Path) -> None:
    """Turn a staging folder into a finished one: its files get the umask's permissions (as mkdir applied them to
    the folder) and reach the disk, and its mark lists them."""
    files_mode = stat.S_IMODE(staging.stat().st_mode) & 0o666
    listed = {}
    for path in sorted(staging.rglob("*")):
        if path.is_file() and not path.is_symlink() and path != staging / MARK:
            path.chmod(files_mode)  # safetensors writes its files 0600 whatever the umask
            _sync(path)
            info = path.stat()
            listed[path.relative_to(staging).as_posix()] = [info.st_size, info.st_mtime_ns]
    sealed = staging / f"{MARK}.sealed"  # the finished mark replaces the first in one rename, held as that was
    fd = os.open(sealed, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    content = {"made_by": "qwenvl-lab", "writer": name, "target": dest.name, "files": listed}
    os.write(fd, (json.dumps(content, ensure_ascii=False) + "\n").encode())
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.fsync(fd)
    os.chmod(sealed, files_mode)
    os.replace(sealed, staging / MARK)
    _release(staging)
    _HELD[staging] = fd


def _sync(path: Path) -> None:
    """Flush a file (or a folder's entries) to the disk; where the system cannot, it is left to the page cache."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def _aside_name(dest: Path, kind: str) -> Path:
    """A new visible name beside `dest` for something kept: NAME.kept-<date>, NAME.backup-<date>."""
    base = dest.parent / f"{dest.name}.{kind}-{_stamp()}"
    path, n = base, 1
    while path.exists() or path.is_symlink():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def remove_made(folder, made=None, also=(), report=None) -> list[str]:
    """Delete from `folder` the files the package made — those `made` lists ({file: [bytes, mtime_ns]}; default: the
    folder's mark), each only while its size and time are still as written, `also` (files its runs add later), a file
    browser's leftovers (DISPOSABLE) — then the mark and the folders left empty. What is left is kept: the folder moves
    to a visible NAME.kept-<date> beside `report` (default: itself), with a warning naming it. Returns the kept
    entries ([] when the folder is gone)."""
    folder = Path(folder)
    listed = made_files(folder) if made is None else made
    if listed is None:
        listed = {}
    for rel, record in listed.items():
        path = folder / rel
        try:
            info = path.lstat()
        except OSError:
            continue
        if (
            stat.S_ISREG(info.st_mode)
            and isinstance(record, list)
            and [info.st_size, info.st_mtime_ns][: len(record)] == record
        ):
            path.unlink()
    for rel in also:
        remove_leftovers(folder / rel)  # what a killed writer of that file left beside it
        if (folder / rel).is_file() and not (folder / rel).is_symlink():
            (folder / rel).unlink()
    for path in sorted(folder.rglob("*"), key=lambda p: -len(p.parts)):
        if path.name in DISPOSABLE and path.is_file() and not path.is_symlink():
            path.unlink()
    if read_mark(folder) is not None:
        (folder / MARK).unlink()
    for path in sorted(
        (p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink()), key=lambda p: -len(p.parts)
    ):
        try:
            path.rmdir()
        except OSError:
            pass  # not empty: something in it is kept
    try:
        folder.rmdir()
        return []
    except OSError:
        pass
    kept = _content(folder)
    report = Path(report) if report is not None else folder
    keep = _aside_name(report, "kept")
    os.replace(folder, keep)
    warnings.warn(
        f"{report}: kept {_listing(kept)}, which the package did not write (or which changed since): moved to {keep}",
        stacklevel=2,
    )
    return kept


# --- the two ways to write


def _failure(err: BaseException, target, folder) -> WriteError | None:
    """A one-line WriteError naming `target` for a full disk, a file too large or a folder one cannot write in;
    None for any other error."""
    code = getattr(err, "errno", None)
    if code is None:  # safetensors reports the system's error in its message, torch.save only that it failed
        found = re.search(r"os error (\d+)|code: (\d+)", str(err))
        code = int(found[1] or found[2]) if found else None
        if code is None and re.search(r"file write failed|PytorchStreamWriter|inline_container", str(err)):
            code = errno.ENOSPC if free_bytes(_existing_ancestor(Path(folder))) < ROOM_MARGIN else errno.EIO
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG):
        reason = "the file grew past the size this process may write" if code == errno.EFBIG else "no space left"
        return WriteError(
            code, f"could not write {target} ({reason} on the device of {folder}): free some space, then run it again"
        )
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason = "a read-only file system" if code == errno.EROFS else "permission denied"
        return NotWritableError(code, f"cannot write {target} in {folder} ({reason}): give a folder you can write to")
    if code == errno.EIO:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return WriteError(code, f"could not write {target} in {folder}: {first}; check the disk, then run it again")
    return None


def _renamed(err: BaseException, staging: Path, target) -> BaseException:
    """`err` with the staging folder's path in its message replaced by the user's path (the same type), when it can."""
    text = str(err)
    if str(staging) not in text:
        return err
    try:
        return type(err)(text.replace(str(staging), str(target)))
    except Exception:  # noqa: BLE001 — an exception type that takes other arguments: kept as it was
        return err


@contextmanager
def writing_folder(  # noqa: PLR0913 — each writer's rule for what it may replace, one argument each
    target,
    name: str,
    *,
    overwrite: bool = False,
    need_bytes: int = 0,
    parents: bool = False,
    allow=None,
    made=None,
    also=(),
):
    """Write the folder `target` as writer `name`: checked first (check_destination), the block fills the staging
    folder it is given, which then replaces `target` by renames. An earlier folder there (replaced only with
    overwrite=True) loses the files the package made (`made(folder)`, default: its mark's list; `also`: files its runs
    add later); anything else in it is kept, moved to NAME.kept-<date> with a warning. On any error the staging folder
    is removed and `target` is as it was."""
    dest = check_destination(
        target, name, folder=True, overwrite=overwrite, need_bytes=need_bytes, parents=parents, allow=allow, probe=False
    )
    staging = _staging(dest, name, parents, target)
    try:
        yield staging
        _seal(staging, name, dest)
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        if dest.exists() or dest.is_symlink():
            aside = dest.parent / f".{dest.name[:64]}.{secrets.token_hex(4)}.tmp"
            listed = (made or made_files)(dest)
            os.replace(dest, aside)
            os.replace(staging, dest)
            _release(staging)
            _sync(dest.parent)
            remove_made(aside, listed if listed is not None else {}, also, report=dest)
        else:
            os.replace(staging, dest)
            _release(staging)
            _sync(dest.parent)
    except BaseException as err:
        _discard(staging)
        if isinstance(err, OSError) and err.errno in (errno.ENOTEMPTY, errno.EEXIST) and dest.exists():
            raise FileExistsError(f"{target} appeared while it was being written: nothing was replaced") from None
        failure = _failure(err, target, dest.parent)
        if failure is not None:
            raise failure from None
        raise _renamed(err, staging, target) from None
    return dest


@contextmanager
def writing_file(target, name: str, *, overwrite: bool = False, need_bytes: int = 0, parents: bool = False, made=None):
    """Write the file `target` as writer `name`: checked first (check_destination), the block writes the path it is
    given (inside a staging folder beside `target`), which is then put in `target`'s place — by a new link when nothing
    may be replaced (so a file that appeared meanwhile is never written over), by a rename with overwrite=True. Files
    the block writes beside that path (an ONNX file's external weights) go beside `target` first, by the same rule.
    `made(path)`: True for a file this writer made, which is replaced without asking. On any error `target` is as it
    was."""
    dest = check_destination(
        target, name, folder=False, overwrite=overwrite, need_bytes=need_bytes, parents=parents, made=made, probe=False
    )
    replace = overwrite or (made is not None and dest.is_file() and made(dest))
    staging = _staging(dest, name, parents, target)
    part = staging / dest.name
    try:
        yield part
        if not part.is_file():
            raise FileNotFoundError(f"the writer {name!r} wrote no {target}")
        _seal(staging, name, dest)
        companions = [p for p in staging.iterdir() if p.name not in (MARK, dest.name) and p.is_file()]
        for path in [*companions, part]:
            _put_file(path, dest.parent / path.name, replace, target)
        _sync(dest.parent)
    except BaseException as err:
        _discard(staging)
        failure = _failure(err, target, dest.parent)
        if failure is not None:
            raise failure from None
        raise _renamed(err, staging, target) from None
    _discard(staging)
    return dest


def _put_file(path: Path, dest: Path, overwrite: bool, target) -> None:
    """Move the finished file `path` to `dest`: a rename over it with `overwrite`, else a new link (never over a file
    that appeared meanwhile; a rename where the file system has no links)."""
    if overwrite:
        if dest.is_symlink() or dest.is_dir():
            raise FileExistsError(f"{dest} appeared while {target} was being written: nothing was replaced")
        os.replace(path, dest)
        return
    try:
        os.link(path, dest)
    except FileExistsError:
        raise FileExistsError(f"{dest} appeared while {target} was being written: nothing was replaced") from None
    except OSError:
        if dest.exists() or dest.is_symlink():
            raise FileExistsError(f"{dest} appeared while {target} was being written: nothing was replaced") from None
        os.replace(path, dest)


def write_text(target, text: str, name: str, **options) -> Path:
    """Write `text` (UTF-8) as the file `target` through writing_file (options as there)."""
    data = text.encode("utf-8")
    with writing_file(target, name, need_bytes=len(data), **options) as part:
        part.write_bytes(data)
    return Path(target)


# --- folders, links and backups


def make_folder(path, parents: bool = False) -> Path:
    """Make the (empty) folder `path` unless it is one already; a file there, or a link to nothing, is refused."""
    path = check_path("folder", path)
    if path.is_dir():
        return path
    if path.exists() or path.is_symlink():
        raise NotADirectoryError(f"{path} is a file (or a link to nothing), not a folder: give a folder")
    try:
        path.mkdir(parents=parents, exist_ok=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"the folder {path.parent} does not exist: create it first") from None
    except OSError as err:
        raise _failure(err, path, path.parent) or err from None
    return path


def make_link(link, points_to) -> bool:
    """Make the symbolic link `link` to the folder `points_to`, never over anything already there; False when
    something was."""
    link = check_path("link", link)
    if link.exists() or link.is_symlink():
        return False
    try:
        os.symlink(points_to, link, target_is_directory=True)
    except FileExistsError:
        return False
    return True


def move_to_backup(path, backup) -> Path:
    """Move the file or folder `path` to `backup` (whose folder is made), never over anything already there."""
    path, backup = check_path("path", path), check_path("backup", backup)
    make_folder(backup.parent, parents=True)
    if backup.exists() or backup.is_symlink():
        raise FileExistsError(f"{backup} already exists; wait a second and try again")
    os.replace(path, backup)
    return backup


def backup_name(path, stamp: str | None = None) -> Path:
    """A dated name beside `path` for a backup of it: NAME.backup-YYYYmmdd-HHMMSS (or with `stamp`)."""
    path = Path(path)
    return path.with_name(f"{path.name}.backup-{stamp or _stamp()}")
