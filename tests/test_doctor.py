"""`python -m qwenvl_lab.course.doctor`: each check finds what is there, names what is broken and says how to fix it; the
first stage runs on any Python 3.6+ with the standard library alone."""

import ast
import glob
import http.server
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
from collections import namedtuple
from importlib import metadata
from pathlib import Path

import pytest
import torch
from conftest import pythonpath

import qwenvl_lab
from qwenvl_lab import fonts, resources
from qwenvl_lab.course import doctor
from qwenvl_lab.course.doctor import FAIL, OK, WARN, Check
from qwenvl_lab.toy import course as toy


def installed(name: str) -> bool:
    """Whether distribution `name` is installed."""
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(autouse=True)
def outputs_in_tmp(monkeypatch, tmp_path):
    """Course outputs (the disk check's folder) go to a temporary folder."""
    monkeypatch.setenv(resources.OUTPUT_ENV, str(tmp_path / "out"))


REPO = Path(qwenvl_lab.__file__).resolve().parents[1]


def test_python_versions():
    assert doctor.check_python().status == OK
    for version in ((3, 10, 12), (3, 14, 0)):
        found = doctor.check_python(version, runs=lambda name, version: False)
        assert found.status == FAIL and "3.11–3.13" in found.detail and ".".join(map(str, version)) in found.detail
        assert "get Python 3.11–3.13" in found.fix
    on_path = doctor.check_python(
        (3, 10, 12), runs=lambda name, version: name == "python3.12" == f"python3.{version[1]}"
    )
    assert on_path.fix == "this machine has python3.12: make lab PYTHON=python3.12"
    assert doctor.runs_as(sys.executable, sys.version_info[:2])
    assert not doctor.runs_as("no-such-python3.99", (3, 99))


@pytest.mark.parametrize(
    "system, release, advice",
    [
        (
            "Linux",
            {"ID": "ubuntu", "VERSION_ID": "22.04"},
            "ppa:deadsnakes/ppa && sudo apt install python3.12 python3.12-venv",
        ),
        ("Linux", {"ID": "linuxmint", "ID_LIKE": "ubuntu debian"}, "deadsnakes"),
        ("Linux", {"ID": "debian"}, "uv python install 3.12, then: make lab PYTHON=$(uv python find 3.12)"),
        ("Darwin", {}, "brew install python@3.12"),
        ("Windows", {}, "py install 3.12"),
    ],
)
def test_how_to_get_a_supported_python(system, release, advice):
    found = doctor.get_python_advice(system, release)
    assert advice in found
    assert ("deadsnakes" in found) == ("ubuntu" in str(release))


def test_venv_and_ensurepip():
    assert doctor.check_venv().status == OK  # this machine's Python has both
    minor = "python{}.{}".format(*sys.version_info[:2])
    debian = doctor.check_venv(find_spec=lambda name: None if name == "ensurepip" else object())
    assert debian.status == FAIL and "ensurepip missing" in debian.detail
    assert debian.fix.startswith(f"Debian/Ubuntu: sudo apt install {minor}-venv")


@pytest.mark.parametrize("system, fix", [("Darwin", "xcode-select"), ("Windows", "docs/install.md"), ("Linux", "apt")])
def test_make_missing_is_a_warning_with_the_way_round(system, fix):
    found = doctor.check_make(which=lambda name: None, system=system)
    assert found.status == WARN and fix in found.fix
    assert doctor.check_make(which=lambda name: "/usr/bin/make").status == OK


def test_install_disk_needs_room_for_the_venv(tmp_path):
    usage = namedtuple("usage", "total used free")
    for free_gib, torch_index, status in ((4.0, "https://download.pytorch.org/whl/cpu", FAIL), (5.0, "cpu", OK)):
        found = doctor.check_install_disk(
            tmp_path, torch_index, disk_usage=lambda path, f=free_gib: usage(0, 0, int(f * 2**30))
        )
        assert found.status == status and str(tmp_path) in found.detail
    if sys.platform.startswith("linux"):  # PyPI's CUDA build of torch needs more
        found = doctor.check_install_disk(tmp_path, "", disk_usage=lambda path: usage(0, 0, 5 * 2**30))
        assert found.status == FAIL and "7.5 GiB" in found.detail


def test_install_memory_from_meminfo():
    assert doctor.check_install_memory().status in (OK, WARN)
    low = doctor.check_install_memory({"MemAvailable": 2**30, "MemTotal": 8 * 2**30})
    assert low.status == WARN and "1.0 GiB available of 8.0 GiB" in low.detail
    assert doctor.check_install_memory({"MemAvailable": 6 * 2**30, "MemTotal": 8 * 2**30}).status == OK


def test_pip_settings_from_files_then_environment(tmp_path):
    (tmp_path / "a.conf").write_text("[global]\nindex-url = https://mirror.example/simple\nfind-links = /one /two\n")
    (tmp_path / "b.conf").write_text("[install]\nfind-links = /three\n")
    (tmp_path / "broken.conf").write_text("no section header\n")
    files = [tmp_path / "a.conf", tmp_path / "broken.conf", tmp_path / "b.conf", tmp_path / "missing.conf"]
    assert doctor.pip_settings({}, files) == {"index-url": "https://mirror.example/simple", "find-links": ["/three"]}
    env = {"PIP_FIND_LINKS": "/x /y", "PIP_INDEX_URL": "https://other.example/simple"}
    assert doctor.pip_settings(env, files) == {"index-url": "https://other.example/simple", "find-links": ["/x", "/y"]}


def test_local_torch_wheel_matches_build_python_and_machine(tmp_path):
    for name in (
        "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_aarch64.whl",
    ):
        (tmp_path / name).write_bytes(b"")
    links = ["/nowhere", f"file://{tmp_path}"]
    found = doctor.local_torch_wheel("cpu", links, (3, 12), "x86_64")
    assert found == tmp_path / "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl"
    assert doctor.local_torch_wheel("cpu", links, (3, 11), "x86_64") is None
    assert doctor.local_torch_wheel("cpu", links, (3, 11), "aarch64").name.endswith("aarch64.whl")
    assert doctor.local_torch_wheel("cu130", [str(tmp_path)], (3, 11), "x86_64") is not None


CPU = "https://download.pytorch.org/whl/cpu"
NO_LINKS = {"index-url": "", "find-links": []}


@pytest.mark.parametrize(
    "kwargs, status, says",
    [
        (dict(installed=True), OK, "not needed: torch is installed"),
        (dict(system="Darwin"), OK, "CPU build"),
        (dict(torch_index=""), OK, "2.7 GB of downloads"),
        (dict(probe=lambda url: None), OK, f"{CPU} answers"),
        (dict(probe=lambda url: "Name or service not known"), FAIL, "does not answer (Name or service not known)"),
    ],
)
def test_torch_index(kwargs, status, says, monkeypatch):
    monkeypatch.delenv(doctor.WHEELHOUSE_ENV, raising=False)
    monkeypatch.setattr(doctor, "CLONE", Path("/nonexistent"))
    args = dict(probe=lambda url: "unreachable", settings=NO_LINKS, torch_index=CPU, system="Linux", installed=False)
    found = doctor.check_torch_index(**{**args, **kwargs})
    assert found.status == status and says in found.detail
    if status == FAIL:
        assert found.fix.startswith("make lab WHEELHOUSE=/path installs from a wheelhouse")
        assert "make lab TORCH_INDEX= installs PyPI's torch instead (a CUDA build: 2.7 GB" in found.fix


def test_torch_index_unreachable_but_the_wheel_is_in_find_links(tmp_path):
    tag = "cp{}{}".format(*sys.version_info[:2])

    wheel = tmp_path / f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_{platform.machine()}.whl"
    wheel.write_bytes(b"")
    found = doctor.check_torch_index(
        probe=lambda url: "unreachable",
        settings={"index-url": "", "find-links": [str(tmp_path)]},
        torch_index=CPU,
        system="Linux",
        installed=False,
    )
    assert found.status == OK and str(wheel) in found.detail


def wheel_name(version_info=sys.version_info, machine=None) -> str:
    tag = "cp{}{}".format(*version_info[:2])
    return f"torch-2.13.0+cpu-{tag}-{tag}-manylinux_2_28_{machine or platform.machine()}.whl"


def test_a_wheelhouse_is_found_checked_and_makes_the_indexes_optional(tmp_path, monkeypatch):
    monkeypatch.delenv(doctor.WHEELHOUSE_ENV, raising=False)
    assert doctor.wheelhouse({}, tmp_path) is None
    (tmp_path / "wheelhouse").mkdir()
    assert doctor.wheelhouse({}, tmp_path) == tmp_path / "wheelhouse"  # in the clone, found by itself
    assert doctor.wheelhouse({"WHEELHOUSE": str(tmp_path / "usb")}, tmp_path) == tmp_path / "usb"  # named: wins
    assert doctor.check_wheelhouse(tmp_path / "usb").status == FAIL  # named, but not there
    house = tmp_path / "wheelhouse"
    (house / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    lacking = doctor.check_wheelhouse(house, (3, 11), "x86_64", "Linux")
    assert lacking.status == WARN and "none of them torch 2.13.0 for Python 3.11 on Linux x86_64" in lacking.detail
    (house / wheel_name((3, 11), "x86_64")).write_bytes(b"")
    found = doctor.check_wheelhouse(house, (3, 11), "x86_64", "Linux")
    assert found.status == OK and "2 wheels" in found.detail and wheel_name((3, 11), "x86_64") in found.detail
    assert doctor.check_wheelhouse(house, (3, 12), "x86_64", "Linux").status == WARN  # another Python's torch
    offline = doctor.check_package_index(lambda url: "unreachable", NO_LINKS, folder=house)
    assert offline.status == WARN and f"make installs from the wheelhouse {house} first" in offline.detail
    (house / wheel_name()).write_bytes(b"")
    monkeypatch.setenv(doctor.WHEELHOUSE_ENV, str(house))  # as make passes it
    torch = doctor.check_torch_index(lambda url: "unreachable", NO_LINKS, CPU, "Linux", installed=False)
    assert torch.status == OK and str(house / wheel_name()) in torch.detail


def test_package_index_is_pips():
    asked = []
    found = doctor.check_package_index(lambda url: asked.append(url), {"index-url": "", "find-links": []})
    assert found.status == OK and asked == [doctor.PYPI]
    mirror = {"index-url": "https://mirror.example/simple", "find-links": []}
    found = doctor.check_package_index(lambda url: "timed out", mirror, folder=Path("/nonexistent"))
    assert found.status == FAIL and "https://mirror.example/simple does not answer (timed out)" in found.detail
    assert "make lab WHEELHOUSE=/path" in found.fix


def test_answers_on_loopback():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert doctor.answers(f"http://127.0.0.1:{server.server_port}/torch/", timeout=5) is None  # a 404 answers
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]  # bound, not listening: connections are refused
        assert "refused" in doctor.answers(f"http://127.0.0.1:{closed}/", timeout=5).lower()


def test_torch_and_gpu_describe_this_machine():

    found = doctor.check_torch()
    assert found.status == OK and found.detail.startswith(torch.__version__)
    assert ("CUDA" in found.detail) == (torch.version.cuda is not None)


class FakePath:
    """pathlib.Path with every file present or none (the NVIDIA driver's /proc file, here)."""

    present = False

    def __init__(self, *parts):
        self.parts = parts

    def exists(self):
        return self.present


def test_the_gpu_line_for_each_machine(monkeypatch):

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(doctor, "Path", FakePath)
    assert doctor.check_gpu() == Check("gpu", OK, "none: the course runs on the CPU (the GPU parts are skipped)")
    monkeypatch.setattr(FakePath, "present", True)  # a driver, and a CPU build of torch
    monkeypatch.setattr(torch.version, "cuda", None)
    found = doctor.check_gpu()
    assert found.status == WARN and "torch is a CPU build" in found.detail and "CUDA build of torch" in found.fix
    card = namedtuple("props", "name total_memory major minor")("NVIDIA H200", 141 * 2**30, 9, 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: card)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert doctor.check_gpu() == Check("gpu", OK, "NVIDIA H200 (141.0 GiB, compute 9.0) and 1 more")


def test_shipped_vocabulary_passes():
    found = doctor.check_vocabulary()
    assert found.status == OK and str(resources.vocab_file().resolve()) in found.detail


def test_corrupted_vocabulary_fails_with_the_restore_command(monkeypatch, tmp_path):
    bad = tmp_path / "qwen.tiktoken"
    bad.write_bytes(resources.vocab_file().read_bytes()[:-100])
    monkeypatch.setattr(resources, "vocab_file", lambda: bad)
    found = doctor.check_vocabulary()
    assert found.status == FAIL and "sha256" in found.detail and str(bad) in found.detail
    assert found.fix.startswith("`git checkout -- data/qwen.tiktoken`")


def test_missing_vocabulary_fails(monkeypatch, tmp_path):
    monkeypatch.setattr(resources, "vocab_file", lambda: tmp_path / "qwen.tiktoken")
    found = doctor.check_vocabulary()
    assert found.status == FAIL and "missing" in found.detail and "git checkout" in found.fix


@pytest.mark.slow
def test_toy_model_loads_and_answers():
    found = doctor.check_model()
    assert found.status == OK, found
    assert "4 layers" in found.detail and "'A red circle.'" in found.detail


def test_missing_toy_checkpoint_fails_with_its_fix(monkeypatch, tmp_path):
    monkeypatch.delenv(toy.CHECKPOINT_ENV, raising=False)
    monkeypatch.setattr(toy, "TOY_DIR", tmp_path / "toy-qwen-vl")
    found = doctor.check_model()
    assert found.status == FAIL and "no checkpoint at" in found.detail
    assert found.fix == doctor.TOY_RESTORE and "git checkout -- data/toy-qwen-vl" in found.fix


def test_checkpoint_from_the_environment_is_read_not_loaded(monkeypatch, tmp_path):
    monkeypatch.setenv(toy.CHECKPOINT_ENV, str(resources.toy_checkpoint_dir()))
    monkeypatch.setattr(toy, "TOY_DIR", tmp_path / "elsewhere")  # so the directory counts as another checkpoint
    found = doctor.check_model()
    assert found.status == OK and "4 layers" in found.detail and "not loaded" in found.detail
    monkeypatch.setenv(toy.CHECKPOINT_ENV, str(tmp_path / "missing"))
    found = doctor.check_model()
    assert found.status == FAIL and f"unset {toy.CHECKPOINT_ENV}" in found.fix


def test_jupyterlab_and_widgets(monkeypatch):
    # what this machine has: the course extra (a learner's machine) or not (the GPU machine's unit-test run)
    assert doctor.check_jupyterlab().status == (OK if installed("jupyterlab") else FAIL)

    def missing(name):
        raise doctor.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(doctor.metadata, "version", missing)
    lab = doctor.check_jupyterlab()
    assert lab.status == FAIL and 'pip install -e ".[course]"' in lab.fix
    widgets = doctor.check_widgets()
    assert widgets.status == WARN and "ipywidgets is not installed" in widgets.detail


@pytest.mark.skipif(not installed("jupyter_core"), reason="the widgets' extension is looked for with jupyter_core")
def test_the_widgets_line_finds_their_jupyterlab_extension(monkeypatch, tmp_path):
    import jupyter_core.paths  # noqa: PLC0415 — jupyter_core: the course extra's

    monkeypatch.setattr(doctor.metadata, "version", lambda name: "8.1.5")
    monkeypatch.setattr(jupyter_core.paths, "jupyter_path", lambda *parts: [str(tmp_path)])
    found = doctor.check_widgets()
    assert found.status == WARN and "its JupyterLab extension" in found.detail and "jupyterlab_widgets" in found.fix
    extension = tmp_path / doctor.WIDGETS_EXTENSION
    extension.mkdir(parents=True)
    (extension / "package.json").write_text('{"version": "5.0.13"}')
    assert doctor.check_widgets() == Check("ipywidgets", OK, "8.1.5, JupyterLab extension 5.0.13")


def test_disk_space_thresholds(monkeypatch, tmp_path):
    usage = namedtuple("usage", "total used free")
    for free_gib, status in ((0.5, FAIL), (2.0, WARN), (50.0, OK)):
        monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path, f=free_gib: usage(100 * 2**30, 0, int(f * 2**30)))
        found = doctor.check_disk()
        assert found.status == status and str(tmp_path / "out") in found.detail
        assert (resources.OUTPUT_ENV in found.fix) == (status != OK)


@pytest.mark.skipif(not installed("psutil"), reason="the memory line reads psutil")
def test_the_memory_line_warns_when_memory_is_tight(monkeypatch):
    import psutil  # noqa: PLC0415 — psutil: the course extra's

    memory = namedtuple("memory", "available total")
    for available_gib, status in ((1.0, WARN), (20.0, OK)):
        monkeypatch.setattr(psutil, "virtual_memory", lambda a=available_gib: memory(int(a * 2**30), 24 * 2**30))
        found = doctor.check_memory()
        assert found.status == status and found.detail.startswith(f"{available_gib:.1f} GiB available of 24.0 GiB")


@pytest.mark.parametrize(
    "versions, status, words",
    [
        ({}, OK, "not installed (optional"),
        ({"tensorrt": "10.14.1.48", "tensorrt_llm": "1.2.1"}, OK, "tensorrt 10.14.1.48, tensorrt_llm 1.2.1"),
        ({"tensorrt": "10.9.0"}, WARN, "a vision plan loads only in the TensorRT that built it"),
    ],
)
def test_the_tensorrt_line_names_a_tensorrt_that_cannot_load_the_plans(monkeypatch, versions, status, words):
    def version(name):
        if name not in versions:
            raise doctor.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(doctor.metadata, "version", version)
    found = doctor.check_tensorrt()
    assert found.status == status and words in found.detail


def test_a_failed_check_sets_the_exit_status_and_prints_its_fix(monkeypatch, capsys):
    def fine():
        return Check("fine", OK, "all good")

    def broken():
        return Check("broken", FAIL, "it is broken", "mend it")

    def raising():
        raise KeyError("oops")

    monkeypatch.setattr(doctor, "PREFLIGHT", ())
    monkeypatch.setattr(doctor, "NETWORK", ())
    monkeypatch.setattr(doctor, "course_installed", lambda: True)
    monkeypatch.setattr(doctor, "CHECKS", (fine, broken, raising))
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "ok    fine        all good" in out
    assert "fail  broken      it is broken\n" in out and "fix: mend it" in out
    assert "fail  raising     the check itself failed: KeyError: 'oops'" in out
    assert "the course cannot run: fix broken, raising" in out

    monkeypatch.setattr(doctor, "CHECKS", (fine, lambda: Check("meh", WARN, "so-so", "tweak")))
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "fix: tweak" in out and "ready for the course (warnings: meh)" in out


def test_before_install_runs_the_first_stage_only(monkeypatch, capsys):
    def installed_check():
        raise AssertionError("the second stage ran")

    monkeypatch.setattr(doctor, "CHECKS", (installed_check,))
    monkeypatch.setattr(doctor, "PREFLIGHT", (lambda: Check("first", OK, "fine"),))
    monkeypatch.setattr(doctor, "NETWORK", (lambda: Check("net", FAIL, "down", "reconnect"),))
    assert doctor.main(["--before-install"]) == 1
    assert "fail  net         down" in capsys.readouterr().out
    assert doctor.main(["--before-install", "--no-network"]) == 0
    out = capsys.readouterr().out
    assert "ok    first" in out and "net" not in out and "ready to install" in out
    monkeypatch.setattr(doctor, "course_installed", lambda: False)  # a bare interpreter: the same without the flag
    assert doctor.main(["--no-network"]) == 0


def bare_interpreters() -> dict:
    """(major, minor) → a Python 3 interpreter other than this one, from PATH or pyenv's versions."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = {}
    for minor in range(6, 15):
        candidates = sorted(glob.glob(str(root / "versions" / f"3.{minor}.*" / "bin" / f"python3.{minor}")))
        candidates += [p for p in [shutil.which(f"python3.{minor}")] if p]
        for path in candidates:
            probe = subprocess.run(
                [path, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
            )
            if probe.returncode == 0 and probe.stdout.strip() == str((3, minor)):
                found[(3, minor)] = path
                break
    return found


@pytest.mark.slow
def test_first_stage_runs_on_every_python_3_in_a_bare_clone(tmp_path):
    found = bare_interpreters()
    if len(found) < 2:
        pytest.skip("needs other Python 3 interpreters (PATH or pyenv); found " + ", ".join(map(str, found)))
    assert ast.parse((REPO / "qwenvl_lab" / "course" / "doctor.py").read_text(), feature_version=(3, 6))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for version, python in sorted(found.items()):
        result = subprocess.run(
            [python, "-s", "-m", "qwenvl_lab.course.doctor", "--before-install", "--no-network"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        supported = doctor.PYTHON_RANGE[0] <= version <= doctor.PYTHON_RANGE[1]
        assert result.stderr == "", (python, result.stderr)
        assert result.returncode == (0 if supported else 1), (python, result.stdout)
        assert ("ok    python" if supported else "fail  python") in result.stdout, result.stdout
        assert "ok    venv" in result.stdout and "the installed course:" not in result.stdout


@pytest.mark.slow
def test_command_line_exits_non_zero_when_the_model_is_missing(tmp_path):
    env = {**os.environ, toy.CHECKPOINT_ENV: str(tmp_path / "missing"), resources.OUTPUT_ENV: str(tmp_path / "out")}
    # the package under test, installed or not (run from a checkout with PYTHONPATH, as on the GPU machine)
    package_root = str(Path(qwenvl_lab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pythonpath(package_root, env=env)
    result = subprocess.run(
        [sys.executable, "-m", "qwenvl_lab.course.doctor"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("fail  model") for line in lines)
    assert any(line.startswith("ok    vocabulary") for line in lines)
    assert f"fix: unset {toy.CHECKPOINT_ENV}" in result.stdout


# The CJK font check and the notebook's report


def test_the_font_line_says_whether_the_machine_has_a_cjk_font_and_how_to_get_one(monkeypatch):

    monkeypatch.setattr(fonts, "system_cjk_font", lambda: None)
    found = doctor.check_cjk_font()
    assert found.status == WARN and "no CJK font on this machine" in found.detail
    assert "fonts-noto-cjk" in doctor.format_check(found)  # the fix line says how to get one
    monkeypatch.setattr(fonts, "system_cjk_font", lambda: ("Noto Sans CJK SC", "/fonts/NotoSansCJK-Regular.ttc"))
    found = doctor.check_cjk_font()
    assert found.status == OK and "Noto Sans CJK SC" in found.detail
    monkeypatch.setattr(fonts, "shipped_font", lambda: Path("/nowhere/qwenvl-lab-cjk.ttf"))
    assert doctor.check_cjk_font().status == WARN


def test_the_notebook_report_shows_the_terminals_detail_without_machine_paths(monkeypatch, tmp_path):
    checks = [
        Check("gpu", OK, "none: the course runs on the CPU (the GPU parts are skipped)"),
        Check("python", OK, f"3.12.1 ({sys.executable})"),
        Check("vocabulary", OK, f"{resources.vocab_file()} (sha256 …)"),
        Check("disk", WARN, f"1.0 GiB free at {Path.home() / 'x'}", "free some space"),
    ]
    monkeypatch.chdir(resources.PACKAGE_DIR.parent / "notebooks")
    report = doctor.format_for_notebook(checks)
    assert report.splitlines()[0] == doctor.format_check(checks[0])  # "ok gpu none: …", as in the terminal
    assert "../data/qwen.tiktoken" in report and "<python env>" in report and "~/x" in report
    assert "fix: free some space" in report
    assert str(resources.PACKAGE_DIR.parent) not in report and sys.prefix not in report
