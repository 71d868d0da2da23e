"""qwenvl_lab/files.py: the one way to write (checked first, staged beside, renamed into place) and the one way to
delete (only what the package's mark lists; leftovers recognised by their mark, never by their name)."""

import errno
import json
import os

import pytest

from qwenvl_lab import files

WRITER = "test writer"  # registered by the fixture below for each test, so that the registry holds only real writers


@pytest.fixture(autouse=True)
def registered():
    """The test writer in files.WRITERS for the test's length (tests/test_writers.py checks every one has a driver)."""
    files.writer(WRITER, "a test's output")
    yield
    del files.WRITERS[WRITER]


def mark(folder, **content):
    """Write a mark as a writer of the package writes it (its writer gone: nothing holds it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / files.MARK).write_text(json.dumps({"made_by": "qwenvl-lab", "writer": WRITER, **content}))


def test_leftovers_are_recognised_by_their_mark_not_their_name(tmp_path):
    dest = tmp_path / "out"
    mark(tmp_path / ".out.dead1.tmp", staging=True, target="out")  # a killed writer's staging folder
    (tmp_path / ".out.dead1.tmp" / "half.bin").write_bytes(b"half")
    for name in (".out.old.tmp", ".out.backup-2024.tmp"):  # the user's, named alike
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text("mine")
    mark(tmp_path / ".other.x.tmp", staging=True, target="other")  # another destination's, another writer's
    (tmp_path / ".other.x.tmp" / files.MARK).write_text(
        json.dumps({"made_by": "qwenvl-lab", "writer": "engine", "staging": True, "target": "other"})
    )
    alive = tmp_path / ".out.live.tmp"
    alive.mkdir()
    held = files._write_mark(alive, {"writer": WRITER, "staging": True, "target": "out"})  # its writer runs
    try:
        assert files.remove_leftovers(dest) == [tmp_path / ".out.dead1.tmp"]
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.x.tmp",
        ".out.backup-2024.tmp",
        ".out.live.tmp",
        ".out.old.tmp",
    ]
    assert files.remove_leftovers(dest) == [alive]  # its writer gone now


def test_only_the_files_a_mark_lists_are_deleted_and_what_changed_is_kept(tmp_path):
    folder = tmp_path / "made"
    with files.writing_folder(folder, WRITER) as staging:
        (staging / "a.bin").write_bytes(b"a")
        (staging / "sub").mkdir()
        (staging / "sub" / "b.bin").write_bytes(b"b")
    assert set(files.made_files(folder)) == {"a.bin", "sub/b.bin"}
    (folder / "sub" / "b.bin").write_bytes(b"changed by the user")
    (folder / "notes.txt").write_text("mine")
    (folder / ".DS_Store").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"made: kept notes.txt, sub/b.bin, which the package did not write"):
        kept = files.remove_made(folder)
    assert kept == ["notes.txt", "sub/b.bin"] and not folder.exists()
    [moved] = [p for p in tmp_path.iterdir() if p.name.startswith("made.kept-")]
    assert (moved / "notes.txt").read_text() == "mine" and (
        moved / "sub" / "b.bin"
    ).read_bytes() == b"changed by the user"
    assert not (moved / "a.bin").exists() and not (moved / files.MARK).exists()


def test_a_file_that_appears_meanwhile_is_never_written_over(tmp_path):
    target = tmp_path / "result.json"
    with pytest.raises(FileExistsError, match="appeared while .*result.json was being written: nothing was replaced"):
        with files.writing_file(target, WRITER) as part:
            part.write_text("new")
            target.write_text("the user's, written meanwhile")
    assert target.read_text() == "the user's, written meanwhile"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # the staging folder is gone


def test_a_failure_names_the_users_path_never_the_staging_one(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(OSError) as err:
        with files.writing_file(target, WRITER) as part:
            raise OSError(errno.ENOSPC, "No space left on device", str(part))
    assert (
        str(err.value)
        == f"could not write {target} (no space left on the device of {tmp_path}): free some space, then run it again"
    )
    with pytest.raises(
        OSError, match=rf"cannot write {tmp_path / 'out.bin'} in {tmp_path} \(a read-only file system\)"
    ):
        with files.writing_file(target, WRITER) as part:
            raise OSError(errno.EROFS, "Read-only file system", str(part))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "make, options, error, message",
    [
        (lambda t: t.write_text("x"), {}, FileExistsError, "already exists: pass overwrite=True"),
        (lambda t: t.mkdir(), {}, IsADirectoryError, "is a folder: give a file name"),
        (
            lambda t: t.symlink_to(t.parent / "nowhere"),
            {"overwrite": True},
            FileNotFoundError,
            "symbolic link to .*nowhere, which does not exist",
        ),
        (
            lambda t: ((t.parent / "real").write_text("x"), t.symlink_to(t.parent / "real")),
            {"overwrite": True},
            FileExistsError,
            "refusing to write a test's output through it",
        ),
        (lambda t: None, {"need_bytes": 10**18}, OSError, r"no room for .*: it needs about 1e\+09 GB"),
        (lambda t: None, {"name": "no such writer"}, KeyError, "no such writer"),
    ],
)
def test_what_a_file_writer_refuses_before_the_work(tmp_path, make, options, error, message):
    target = tmp_path / "t.json"
    make(target)
    options = {"name": WRITER, **options}
    with pytest.raises(error, match=message):
        files.check_destination(target, options.pop("name"), folder=False, **options)
    with pytest.raises(FileNotFoundError, match="the folder .*missing does not exist: create it first"):
        files.check_destination(tmp_path / "missing" / "t.json", WRITER, folder=False)


def test_a_folder_is_replaced_only_when_asked_and_made_by_the_package(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "mine.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match=r"not empty and holds nothing this package wrote \(mine.txt\)"):
            files.check_destination(folder, WRITER, folder=True, overwrite=overwrite)
    (folder / "mine.txt").unlink()
    with files.writing_folder(folder, WRITER) as staging:  # an empty folder is taken
        (staging / "a").write_text("1")
    with pytest.raises(FileExistsError, match="already holds a test's output: pass overwrite=True"):
        files.check_destination(folder, WRITER, folder=True)
    with files.writing_folder(folder, WRITER, overwrite=True) as staging:
        (staging / "b").write_text("2")
    assert sorted(p.name for p in folder.iterdir()) == [files.MARK, "b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
