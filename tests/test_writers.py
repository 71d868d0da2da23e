"""Every writer of the package, walked through the faults a user's machine has: one way to write (qwenvl_lab/files.py).

The writers are found two ways: the registry they write through (files.WRITERS: each must have a driver here, so a new
writer is walked unasked), and a scan of the package's and tools' source for any call that writes, makes or removes a
file or folder (a new writer that bypasses files.py fails `test_nothing_writes_but_through_files`).

Each writer is driven, into a folder that also holds a file of the user's, through:
  a full disk before the work (its room checked first: the work never starts),
  a full disk during the write (a real one: the child process may write no more than half the output),
  a read-only folder, a dangling symbolic link in the way, the user's file or folder in the way,
  and a kill (SIGKILL) at fixed moments: before and after each of its file-system operations' quarters and renames,
and must leave the user's files as they were, no partial file under the name of a complete one, and a next run that
repairs (its output complete, no leftover beside it) or refuses with a clear message.
"""

import ast
import contextlib
import importlib
import io
import json
import os
import pickle
import pkgutil
import resource
import shutil
import signal
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import refuse_writes_in
from fontTools.subset import Subsetter
from PIL import Image

import qwenvl_lab
from qwenvl_lab import bench, dump, files
from qwenvl_lab.checkpoint import save_checkpoint
from qwenvl_lab.cli import save_new_picture
from qwenvl_lab.course.lab import copy_course_notebooks
from qwenvl_lab.engine import build as build_module
from qwenvl_lab.engine.build import build_engine
from qwenvl_lab.engine.decode import triton_linear
from qwenvl_lab.engine.decode.triton_step import TritonDecode
from qwenvl_lab.fonts import make_subset
from qwenvl_lab.limits import BuildConfig
from qwenvl_lab.modeling import QWenLMHeadModel
from qwenvl_lab.resources import checkout_dir, data_dir
from qwenvl_lab.toy import evaluate, make_samples, train
from qwenvl_lab.toy.shapes import Scene
from qwenvl_lab.trtllm import onnx_export, pipeline, visual_plan
from qwenvl_lab.unified_checkpoint import convert_to_trtllm_checkpoint
from tools import classload, decode_profile, stage_drift, website

REPO = Path(__file__).resolve().parents[1]
SMALL = BuildConfig(max_batch_size=1, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=256)
USER = "notes.txt"  # the user's file beside every destination
USERS = b"the user's own words"


class Refused(Exception):
    """A command's refusal (argparse's exit status 2 with its message), as a driver reports it."""


@dataclass
class Driver:
    """How to run one writer: `run(dest, overwrite)` writes `dest` (a file, or a folder when `folder`); `work` is
    (object, attribute) of the work a refusal must come before; `gpu`: its write needs TensorRT (only its checks run
    here); `kills`: how many fixed kill points to try."""

    name: str
    target: str
    run: object
    folder: bool = False
    work: tuple | None = None
    overwrite: bool = True
    gpu: bool = False
    kills: int = 6
    skips_what_is_there: bool = False  # a copier or a numbering writer: what is in the way is left and not written
    per_file: bool = False  # it writes several outputs, each whole on its own (not one folder)
    setup: dict = field(default_factory=dict)


def _no_log(*args, **kwargs):
    pass


def bench_json(dest, overwrite):
    argv = ["--model", "tiny", "--json", str(dest), *(["--overwrite"] if overwrite else [])]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            bench.main(argv)
    except SystemExit:
        raise Refused(stderr.getvalue().strip().splitlines()[-1]) from None


def evaluate_json(dest, overwrite):
    argv = ["--n", "1", "--skip-controls", "--json", str(dest), *(["--overwrite"] if overwrite else [])]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            evaluate.main(argv)
    except SystemExit:
        raise Refused(stderr.getvalue().strip().splitlines()[-1]) from None


def site(dest, overwrite):
    website.build(checkout_dir(), None, output=dest)


def fake_jupyter_book(command, check):
    """Jupyter Book's build, stood in for: a page written under --path-output."""
    html = Path(command[command.index("--path-output") + 1]) / "_build" / "html"
    html.mkdir(parents=True)
    (html / "index.html").write_text('<a href="#notebooks/solutions/">solutions</a>')


def stage_dump(dest, overwrite):
    """A recorded stage written as a dump (an earlier dump replaced only with overwrite; any other file never)."""
    recorder = dump.DumpRecorder("test", "float32")
    recorder.record("input_ids", torch.arange(4096))
    recorder.save(dest, overwrite=overwrite)


def tuning(dest, overwrite):
    """The runner's save of its tuned choices (it warns, and goes on, where it cannot save: a refusal here)."""
    runner = types.SimpleNamespace(tuning_file=dest, tuning_key="GPU 0|triton 3")
    runner._saved = lambda: TritonDecode._saved(runner)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        TritonDecode.save_tuning(runner)
    if said:
        raise Refused(str(said[0].message))


@pytest.fixture(scope="module")
def drivers(tiny_checkpoint, tiny_model, tmp_path_factory):
    """A driver for every writer the package registers."""
    onnx_file = onnx_export.export_visual_onnx(
        tiny_model.transformer.visual, tmp_path_factory.mktemp("onnx") / "v.onnx"
    )
    picture = Image.new("RGB", (40, 30), (220, 20, 60))
    course = checkout_dir() / "notebooks"
    font = data_dir() / "fonts" / "qwenvl-lab-cjk.ttf"
    small_prepare = BuildConfig(
        max_batch_size=1, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=256
    )
    listed = [
        Driver(
            "engine",
            "engine",
            lambda d, o: build_engine(tiny_checkpoint, d, SMALL, overwrite=o),
            folder=True,
            work=(build_module, "convert_to_trtllm_checkpoint"),
        ),
        Driver(
            "checkpoint",
            "ckpt",
            lambda d, o: save_checkpoint(tiny_model, d, max_shard_size="60MB", overwrite=o),
            folder=True,
            work=(QWenLMHeadModel, "save_pretrained"),
        ),
        Driver(
            "training state",
            "state/state.pt",
            lambda d, o: train.save_state(d.parent, {"recipe": {}, "stage": 0, "step": 1, "w": torch.ones(4096)}),
            work=(torch, "save"),
            overwrite=False,
        ),
        Driver(
            "chat picture",
            "chat/turn-1.png",
            lambda d, o: save_new_picture(d.parent, picture),
            overwrite=False,
            skips_what_is_there=True,
            per_file=True,
        ),
        Driver("bench --json", "bench.json", bench_json, work=(bench, "run_benchmark")),
        Driver(
            "notebook copy",
            f"mine/{sorted(course.glob('*.ipynb'))[0].name}",
            lambda d, o: copy_course_notebooks(course, d.parent),
            overwrite=False,
            skips_what_is_there=True,
            per_file=True,
            kills=4,
        ),
        Driver(
            "TensorRT-LLM checkpoint",
            "trt",
            lambda d, o: convert_to_trtllm_checkpoint(tiny_checkpoint, d, "float32", overwrite=o),
            folder=True,
            work=(qwenvl_lab.unified_checkpoint, "iter_weights"),
        ),
        Driver(
            "trtllm prepare",
            f"work/{pipeline.COMMAND_FILE}",
            lambda d, o: pipeline.prepare(tiny_checkpoint, d.parent, small_prepare, log=_no_log, overwrite=o),
            work=(onnx_export, "export_visual_onnx"),
            per_file=True,
            kills=3,
        ),
        Driver(
            "trtllm plan folder",
            "plan",
            lambda d, o: pipeline.write_plan(onnx_file, d.parent),
            folder=True,
            work=(pipeline, "build_visual_plan"),
            setup={(pipeline, "build_visual_plan"): lambda onnx, path, strongly_typed: Path(path).write_bytes(b"plan")},
        ),
        Driver(
            "ONNX graph",
            "v.onnx",
            lambda d, o: onnx_export.export_visual_onnx(tiny_model.transformer.visual, d, overwrite=o),
            work=(onnx_export, "_export"),
            kills=4,
        ),
        Driver(
            "vision plan",
            "v.plan",
            lambda d, o: visual_plan.build_visual_plan(onnx_file, d, overwrite=o),
            work=(visual_plan, "require_gpu_stack"),
            gpu=True,
        ),
        Driver(
            "font subset",
            "f.ttf",
            lambda d, o: make_subset(font, ["a", "b"], d, overwrite=o),
            work=(Subsetter, "populate"),  # (a class's method: a module's name would stay patched in what imports it)
        ),
        Driver(
            "sample pictures",
            f"images/{next(iter(make_samples.SAMPLES))}",
            lambda d, o: make_samples.write_samples(d.parent, overwrite=o),
            work=(Scene, "render"),
            per_file=True,
            kills=4,
        ),
        Driver("decode tuning", "tuning.json", tuning, overwrite=False),
        Driver(
            "site",
            "site",
            site,
            folder=True,
            work=(website.subprocess, "run"),
            setup={(website, "subprocess"): types.SimpleNamespace(run=fake_jupyter_book, CalledProcessError=OSError)},
        ),
        Driver("class-load --json", "load.json", lambda d, o: classload.save_result(d, {"class": {}}, o)),
        Driver("stage dump", "run.safetensors", stage_dump, work=(dump, "safetensors_bytes")),
        Driver("evaluate --json", "evaluate.json", evaluate_json, work=(evaluate, "report")),
        Driver("decode profile --json", "profile.json", lambda d, o: decode_profile.save_report(d, {"steps": []}, o)),
        Driver(
            "stage drift --json",
            "drift/stage_drift-toy.json",
            lambda d, o: stage_drift.write(types.SimpleNamespace(out=d.parent, model="toy"), {"runs": []}, o),
        ),
    ]
    return {d.name: d for d in listed}


@pytest.fixture
def stand_ins(monkeypatch):
    """What the drivers stand in for: the benchmark's measurements, the autotuner's choices."""
    _stand_ins(monkeypatch)
    return monkeypatch


def _stand_ins(monkeypatch):
    monkeypatch.setattr(bench, "run_benchmark", lambda *args: {"results": []})
    monkeypatch.setattr(bench, "format_table", lambda report: "")
    monkeypatch.setattr(evaluate, "report", lambda *args: {"kinds": {}})
    monkeypatch.setattr(evaluate, "summary", lambda *args: "")
    monkeypatch.setattr(triton_linear, "tuned_choices", lambda: [{"key": [1], "config": 0}])


def prepared(driver, monkeypatch, tmp_path) -> Path:
    """The test's folder with the user's file in it; the driver's stand-ins set; its destination."""
    for (owner, name), value in driver.setup.items():
        monkeypatch.setattr(owner, name, value)
    (tmp_path / USER).write_bytes(USERS)
    return tmp_path / driver.target


def snapshot(folder: Path) -> dict:
    """Every file under `folder` but the package's marks: {relative path: bytes} (a link: its target), the folder's
    own path in a file written as <dir> (a benchmark's command names its --json file, with --overwrite or not)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_file() and path.name != files.MARK:
            data = path.read_bytes().replace(str(folder).encode(), b"<dir>").replace(b" --overwrite", b"")
            found[rel] = sorted_header(data) if path.suffix == ".safetensors" else data
    return found


def sorted_header(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys sorted: the library writes its metadata in hash order, which
    differs from one save to the next; a partial file stays as it is."""
    size = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8 : 8 + size])
    except (ValueError, UnicodeDecodeError):
        return data
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return len(text).to_bytes(8, "little") + text + data[8 + size :]


def visible(snap: dict) -> dict:
    """A snapshot without what lies in hidden staging folders beside the destination (`.NAME.<random>.tmp`)."""
    return {k: v for k, v in snap.items() if not any(p.startswith(".") and p.endswith(".tmp") for p in k.split("/"))}


def leftovers(folder: Path) -> list[str]:
    """Staging folders (marked as the package's) left anywhere under `folder`."""
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_dir() and (files.read_mark(p) or {}).get("staging")
    )


def one_line_naming(err: BaseException, driver: Driver, tmp_path: Path) -> None:
    """A refusal: one line of the package's words, naming the user's path, never a staging one."""
    text = str(err)
    assert "\n" not in text.strip(), f"{driver.name}: {text!r}"
    assert ".tmp" not in text, f"{driver.name}: names a staging path: {text}"
    top = driver.target.split("/")[0]
    assert top in text or str(tmp_path) in text, f"{driver.name}: does not name {top}: {text}"


@pytest.fixture(scope="module")
def reference(drivers, tmp_path_factory):
    """Each writer's complete output, written once into a folder of its own."""
    outputs = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        _stand_ins(monkeypatch)
        for name, driver in drivers.items():
            if driver.gpu:
                continue
            folder = tmp_path_factory.mktemp("reference")
            with pytest.MonkeyPatch.context() as patch:
                dest = prepared(driver, patch, folder)
                driver.run(dest, False)
            outputs[name] = visible(snapshot(folder))
    return outputs


def test_every_registered_writer_has_a_driver(drivers):
    assert sorted(files.WRITERS) == sorted(drivers)


# --- the faults


def run_refused(driver, dest, overwrite=False):
    """Run the writer expecting a refusal; the error."""
    with pytest.raises((OSError, ValueError, Refused)) as err:
        driver.run(dest, overwrite)
    return err.value


FAULTS = ("full disk before the work", "read-only folder", "dangling link in the way", "the user's file in the way")


def _writer_names():
    """Every writer the package and its tools register: each of their modules imported, so none is missed."""
    for info in pkgutil.walk_packages(qwenvl_lab.__path__, "qwenvl_lab."):
        with contextlib.suppress(ImportError):  # an optional GPU stack
            importlib.import_module(info.name)
    for path in (REPO / "tools").glob("*.py"):
        importlib.import_module(f"tools.{path.stem}")
    return sorted(files.WRITERS)


WRITER_NAMES = _writer_names()


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", WRITER_NAMES)
def test_a_fault_changes_nothing_of_the_users(name, fault, drivers, stand_ins, tmp_path):
    driver = drivers[name]
    monkeypatch = stand_ins
    dest = prepared(driver, monkeypatch, tmp_path)
    started = []
    if driver.work is not None:
        owner, attribute = driver.work
        real = getattr(owner, attribute)
        monkeypatch.setattr(owner, attribute, lambda *a, **k: started.append(1) or real(*a, **k))
    if fault == "full disk before the work":
        monkeypatch.setattr(files, "free_bytes", lambda folder: 0)
        err = run_refused(driver, dest)
        assert "no room for" in str(err), f"{name}: {err}"
        one_line_naming(err, driver, tmp_path)
        assert not started, f"{name}: the work started before the room was checked"
    elif fault == "read-only folder":
        refuse_writes_in(monkeypatch, tmp_path)
        err = run_refused(driver, dest)
        assert isinstance(err, PermissionError) or "permission denied" in str(err), f"{name}: {err!r}"
        one_line_naming(err, driver, tmp_path)
        assert not started, f"{name}: the work started in a folder that takes no files"
    elif fault == "dangling link in the way":
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(tmp_path / "elsewhere" / "x", target_is_directory=driver.folder)
        if driver.skips_what_is_there:
            with pytest.warns(UserWarning, match="does not exist") if "notebook" in name else contextlib.nullcontext():
                driver.run(dest, False)
        else:
            err = run_refused(driver, dest, overwrite=driver.overwrite)
            assert "symbolic link" in str(err), f"{name}: {err}"
            one_line_naming(err, driver, tmp_path)
        assert os.readlink(dest) == str(tmp_path / "elsewhere" / "x") and not (tmp_path / "elsewhere").exists()
    else:  # the user's file (or folder) in the way
        dest.parent.mkdir(parents=True, exist_ok=True)
        if driver.folder:
            dest.mkdir()
            (dest / "mine.txt").write_bytes(USERS)
        else:
            dest.write_bytes(USERS)
        before = snapshot(tmp_path)
        if driver.skips_what_is_there:
            driver.run(dest, False)
        else:
            err = run_refused(driver, dest)
            one_line_naming(err, driver, tmp_path)
            if driver.folder and driver.overwrite:  # asked to overwrite, a folder it did not make is still refused
                one_line_naming(run_refused(driver, dest, overwrite=True), driver, tmp_path)
        after = snapshot(tmp_path)
        assert {k: after.get(k) for k in before} == before, f"{name}: the user's file changed"
        assert not started or driver.skips_what_is_there, f"{name}: the work started though the answer was no"
    assert (tmp_path / USER).read_bytes() == USERS
    assert leftovers(tmp_path) == [], f"{name}: staging left behind"


# --- in a child process: a real full disk, a kill


def in_child(run, limit_bytes: int | None = None, kill_at: int | None = None, watch: str = ""):
    """Run `run()` in a forked child; with `limit_bytes` the child may write files no larger (RLIMIT_FSIZE: a full
    disk that no write can pass), with `kill_at` it is killed (SIGKILL) at its kill_at-th file-system operation under
    `watch`. Returns (exit status or -signal, the exception it raised as (type name, message) or None, the number of
    operations it made)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(reader)
        count = [0]

        def hook(event, args):
            if event in WRITE_EVENTS and any(str(a).startswith(watch) for a in args if isinstance(a, (str, Path))):
                if event == "open" and not _writes(args):
                    return
                count[0] += 1
                if kill_at is not None and count[0] >= kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

        sys.addaudithook(hook)
        if limit_bytes is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        raised = None
        try:
            run()
        except BaseException as err:  # noqa: BLE001 — reported to the parent
            raised = (type(err).__name__, str(err), isinstance(err, (OSError, ValueError, Refused)))
        os.write(writer, pickle.dumps((raised, count[0])))
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    raised, count = pickle.loads(data) if data else (None, None)
    return (-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), raised, count


WRITE_EVENTS = {
    "open",
    "os.mkdir",
    "os.rename",
    "os.link",
    "os.remove",
    "os.rmdir",
    "os.symlink",
    "os.chmod",
    "shutil.rmtree",
    "shutil.copyfile",
}


def _writes(args) -> bool:
    """True for an `open` audit event that opens for writing."""
    mode, flags = args[1], args[2]
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))


def complete_or_absent(driver, snap: dict, reference: dict, before: dict) -> None:
    """Under the destination's name: nothing, what was there before, or the complete output."""
    top = driver.target.split("/")[0]
    mine = {k: v for k, v in visible(snap).items() if k.split("/")[0] == top}
    earlier = {k: v for k, v in before.items() if k.split("/")[0] == top}
    expected = {k: v for k, v in reference.items() if k.split("/")[0] == top}
    if driver.per_file:  # file by file: each one there is what was there or complete (a numbering writer's by content)
        complete = set(expected.values()) if driver.skips_what_is_there else None
        assert all(
            v in (expected.get(k), earlier.get(k)) or (complete is not None and v in complete) for k, v in mine.items()
        ), f"{driver.name}: a partial file"
        return
    assert mine in ({}, earlier, expected), f"{driver.name}: {sorted(mine)} is neither absent nor complete"


NOT_IN_A_CHILD = {"vision plan"}  # its write needs TensorRT


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in WRITER_NAMES if n not in NOT_IN_A_CHILD])
def test_a_full_disk_during_the_write_leaves_no_partial_file(name, drivers, reference, stand_ins, tmp_path):
    driver = drivers[name]
    dest = prepared(driver, stand_ins, tmp_path)
    largest = max(len(v) for v in reference[name].values() if isinstance(v, bytes))
    status, raised, _ = in_child(lambda: driver.run(dest, False), limit_bytes=max(16, largest // 2))
    assert status == 0
    if raised is not None:  # the tuning writer warns instead: it runs beside a read-only engine too
        kind, message, deliberate = raised
        assert deliberate, f"{name}: {kind}: {message}"
        assert ".tmp" not in message and "\n" not in message.strip(), f"{name}: {message}"
    snap = snapshot(tmp_path)
    assert snap[USER] == USERS
    complete_or_absent(driver, snap, reference[name], {})
    assert leftovers(tmp_path) == []


def kill_points(count: int, kills: int) -> list[int]:
    """`kills` fixed moments among `count` file-system operations: the first, the last and evenly between."""
    if count <= kills:
        return list(range(1, count + 1))
    return sorted({1, count, *(1 + round(i * (count - 1) / (kills - 1)) for i in range(kills))})


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in WRITER_NAMES if n not in NOT_IN_A_CHILD])
def test_a_kill_at_any_moment_leaves_the_old_or_the_new_and_the_next_run_repairs(
    name, drivers, reference, stand_ins, tmp_path
):
    driver = drivers[name]
    dest = prepared(driver, stand_ins, tmp_path)
    if driver.overwrite:  # an earlier output of the writer there, to be replaced
        driver.run(dest, False)
    before = visible(snapshot(tmp_path))
    pristine = tmp_path.parent / f"{tmp_path.name}-pristine"  # every run below starts from this same folder
    shutil.copytree(tmp_path, pristine, symlinks=True)
    status, raised, count = in_child(lambda: driver.run(dest, driver.overwrite), watch=str(tmp_path))
    assert status == 0 and raised is None and count, f"{name}: a whole run in a child: {raised}"
    points = kill_points(count, driver.kills)
    for at in points:
        shutil.rmtree(tmp_path)
        shutil.copytree(pristine, tmp_path, symlinks=True)
        status, raised, _ = in_child(lambda: driver.run(dest, driver.overwrite), kill_at=at, watch=str(tmp_path))
        assert status == -signal.SIGKILL, f"{name}: not killed at operation {at} of {count} ({raised})"
        snap = snapshot(tmp_path)
        assert snap[USER] == USERS, f"{name}, killed at {at}: the user's file changed"
        complete_or_absent(driver, snap, reference[name], before)
        try:  # the next run: repairs, or refuses clearly (an output is there already: then asked to replace it)
            driver.run(dest, False)
        except (FileExistsError, Refused) as err:
            assert driver.overwrite and "overwrite" in str(err), f"{name}, after a kill at {at}: {err}"
            driver.run(dest, True)
        repaired = visible(snapshot(tmp_path))
        top = driver.target.split("/")[0]
        mine = {k: v for k, v in repaired.items() if k.split("/")[0] == top}
        expected = {k: v for k, v in reference[name].items() if k.split("/")[0] == top}
        if driver.per_file and driver.skips_what_is_there:  # a numbering writer adds a picture a run
            assert set(mine.values()) <= set(expected.values()), f"{name}, after a kill at {at}: a partial file"
        else:
            assert mine == expected, f"{name}, after a kill at {at}: the next run did not leave a complete output"
        assert leftovers(tmp_path) == [], f"{name}, after a kill at {at}: staging left behind"
        assert [p for p in snapshot(tmp_path) if ".tmp" in p] == [], f"{name}: a moved-aside folder left behind"
    shutil.rmtree(pristine)
    print(f"{name}: {count} file-system operations, killed at {points}")


# --- the source: nothing writes but through files.py


WRITE_METHODS = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "symlink_to", "hardlink_to", "touch", "chmod"}
WRITE_FUNCTIONS = {
    ("os", name)
    for name in ("open", "mkdir", "makedirs", "replace", "rename", "remove", "unlink", "rmdir", "link", "symlink")
} | {("shutil", n) for n in ("copy", "copy2", "copyfile", "copytree", "move", "rmtree")}
WRITE_FUNCTIONS |= {("torch", "save"), ("onnx", "save"), ("onnx", "save_model"), ("np", "save"), ("json", "dump")}
STAGED = {"staging", "part"}  # the names writing_folder and writing_file hand out, by the project's convention
# writes that go elsewhere than a user's destination, each with its reason: (file, function, call)
ALLOWED = {
    ("qwenvl_lab/resources.py", "output_dir", ".mkdir"): "the course-output folder itself, empty; writers write in it",
    ("qwenvl_lab/bench.py", "__enter__", ".write_text"): "Linux's /proc/self/clear_refs: resets the peak RSS",
    ("tools/classload.py", "hub_config", ".write_text"): "the load test's own temporary folder (tempfile.mkdtemp)",
    ("tools/classload.py", "start_hub", "open"): "the hub's log in the load test's own temporary folder",
    ("tools/classload.py", "main", ".chmod"): "the load test's own temporary folder, made by tempfile.mkdtemp",
    ("tools/classload.py", "main", ".mkdir"): "a folder inside the load test's own temporary folder",
    ("tools/classload.py", "main", "shutil.rmtree"): "removes the load test's own temporary folder",
    ("tools/classload.py", "make_upstream", ".mkdir"): "the stand-in upstream, in the load test's temporary folder",
    ("tools/classload.py", "make_upstream", "shutil.copy2"): "the stand-in upstream's working copy of the clone",
    ("tools/classload.py", "make_upstream", ".chmod"): "the stand-in upstream, readable by the test's learners",
    ("tools/classload.py", "change_upstream", ".chmod"): "the objects a push added to the stand-in upstream",
    ("tools/classload.py", "trust_upstream", ".write_text"): "a test learner's ~/.gitconfig (a user made for the run)",
    (
        "tools/workshop_figures.py",
        "write_text",
        ".write_text",
    ): "a tracked file of the clone (docs/workshop.md, the Z2JH values), written whole beside it…",
    ("tools/workshop_figures.py", "write_text", "os.replace"): "…then renamed over it",
    ("tools/wheelhouse.py", "gather", ".mkdir"): "the wheelhouse folder, into which pip writes each wheel itself",
    ("qwenvl_lab/cli.py", "dump_main", ".save"): "DumpRecorder.save, the stage dump writer",
    ("qwenvl_lab/trtllm/pipeline.py", "dumped_answer", ".save"): "DumpRecorder.save, the stage dump writer",
    ("tools/stage_drift.py", "record", ".save"): "DumpRecorder.save, the stage dump writer",
    (
        "qwenvl_lab/course/exercises/nb08.py",
        "mystery_dumps",
        ".save",
    ): "DumpRecorder.save, the stage dump writer",
    # make clean runs with any Python, before .venv exists or as it goes: it backs up trained models, training states
    # and the learner's notebooks, then removes the course's outputs (tests/test_clean.py)
    ("tools/clean.py", "clean", ".mkdir"): "the dated backup folder",
    ("tools/clean.py", "clean", "shutil.move"): "a trained model, a state or my-notebooks/ into the backup",
    ("tools/clean.py", "clean", "shutil.rmtree"): "course-output/, build/, the egg-info",
    ("tools/clean.py", "clean", ".unlink"): "course-output or build when it is a file or a link",
}


def _mentions(node, names) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def unstaged_writes(path: Path) -> list[tuple[str, str, int, str]]:
    """(function, call, line, source) of each call in `path` that writes, makes or removes a file or folder other than
    through files.py or into a staging path it handed out (or a buffer in memory, or a name derived from those)."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(function: str, body_owner, staged: set):
        staged = set(staged)
        for node in ast.walk(body_owner):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.For, ast.withitem)):
                value = {ast.Assign: "value", ast.AnnAssign: "value", ast.For: "iter", ast.withitem: "context_expr"}
                expr = getattr(node, value[type(node)])
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.optional_vars]
                    if isinstance(node, ast.withitem)
                    else [node.target]
                )
                derived = expr is not None and (
                    _mentions(expr, staged)
                    or ast.unparse(expr).startswith(("io.BytesIO", "files.writing", "tempfile."))
                )
                if derived:
                    staged |= {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
        for node in ast.walk(body_owner):
            if not isinstance(node, ast.Call):
                continue
            call, target = _write_call(node)
            if call is None or _mentions(target, staged):
                continue
            found.append((function, call, node.lineno, ast.unparse(node)[:90]))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
            visit(node.name, node, STAGED | (params & STAGED))
    return sorted(set(found))


def _write_call(node: ast.Call):
    """(what the call is, the expression it writes to) for a call that writes, else (None, None)."""
    f = node.func
    first = node.args[0] if node.args else None
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in WRITE_FUNCTIONS:
        if f.attr == "open" and len(node.args) > 1 and "O_RDONLY" in ast.unparse(node.args[1]):
            if not any(w in ast.unparse(node.args[1]) for w in ("O_WRONLY", "O_RDWR", "O_CREAT")):
                return None, None
        second = f.attr in ("save", "save_model", "dump", "copy", "copy2", "copyfile", "copytree", "move", "replace")
        second |= f.attr in ("rename", "link", "symlink")  # the new name is the second argument
        return f"{f.value.id}.{f.attr}", node.args[1] if second and len(node.args) > 1 else first
    if isinstance(f, ast.Attribute) and f.attr in WRITE_METHODS:
        if isinstance(f.value, ast.Name) and f.value.id in ("files", "qfiles"):
            return None, None
        return f".{f.attr}", f.value
    if isinstance(f, ast.Attribute) and f.attr in ("rename", "replace") and len(node.args) == 1:
        return f".{f.attr}", f.value  # Path.rename / Path.replace (str.replace takes two arguments)
    if isinstance(f, ast.Attribute) and f.attr == "save" and first is not None:
        return ".save", first
    if isinstance(f, ast.Name) and f.id == "save_file":
        return "save_file", node.args[1] if len(node.args) > 1 else None
    if isinstance(f, ast.Name) and f.id == "open" and len(node.args) > 1:
        mode = node.args[1]
        if isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+"):
            return "open", first
    return None, None


SOURCES = sorted(
    p
    for p in [*(REPO / "qwenvl_lab").rglob("*.py"), *(REPO / "tools").glob("*.py")]
    if p != REPO / "qwenvl_lab/files.py"
)


def test_nothing_writes_but_through_files():
    found, used = [], set()
    for path in SOURCES:
        rel = path.relative_to(REPO).as_posix()
        for function, call, line, source in unstaged_writes(path):
            if (rel, function, call) in ALLOWED:
                used.add((rel, function, call))
                continue
            found.append(f"{rel}:{line} in {function}: {source}")
    assert found == [], "writes that bypass qwenvl_lab/files.py (write through writing_file/writing_folder):\n" + (
        "\n".join(found)
    )
    assert sorted(set(ALLOWED) - used) == [], "ALLOWED lists a write that is no longer there"


def test_the_scan_sees_a_writer_that_bypasses_files(tmp_path):
    source = tmp_path / "new_writer.py"
    source.write_text(
        "import shutil, torch\n"
        "def export(model, out):\n"
        "    torch.save(model, out)\n"
        "    (out.parent / 'notes.json').write_text('{}')\n"
        "    shutil.rmtree(out.parent / 'old')\n"
        "def fine(files, out):\n"
        "    with files.writing_file(out, 'x') as part:\n"
        "        torch.save(1, part)\n"
        "    'a b'.replace(' ', '-')\n"
    )
    assert [(f, c) for f, c, _, _ in unstaged_writes(source)] == [
        ("export", ".write_text"),
        ("export", "shutil.rmtree"),
        ("export", "torch.save"),
    ]
