"""`python -m qwenvl_lab.doctor`: each check finds what is there, names what is broken and says how to fix it."""

import os
import subprocess
import sys
from collections import namedtuple
from importlib import metadata
from pathlib import Path

import pytest
import torch

import qwenvl_lab
from qwenvl_lab import doctor, resources
from qwenvl_lab.doctor import FAIL, OK, WARN, Check
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


def test_python_versions():
    assert doctor.check_python().status == OK
    old = doctor.check_python((3, 9, 18))
    assert old.status == FAIL and "3.9.18" in old.detail and "3.10–3.13" in old.detail
    assert "delete .venv, then: make lab PYTHON=python3.13" in old.fix
    new = doctor.check_python((3, 14, 0))
    assert new.status == WARN and "PYTHON=python3.13" in new.fix


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


@pytest.mark.slow
def test_command_line_exits_non_zero_when_the_model_is_missing(tmp_path):
    env = {**os.environ, toy.CHECKPOINT_ENV: str(tmp_path / "missing"), resources.OUTPUT_ENV: str(tmp_path / "out")}
    # the package under test, installed or not (run from a checkout with PYTHONPATH, as on the GPU machine)
    package_root = str(Path(qwenvl_lab.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "qwenvl_lab.doctor"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("fail  model") for line in lines)
    assert any(line.startswith("ok    vocabulary") for line in lines)
    assert f"fix: unset {toy.CHECKPOINT_ENV}" in result.stdout
