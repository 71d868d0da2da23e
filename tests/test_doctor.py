"""`python -m qwenvl_lab.doctor`: each check finds what is there, names what is broken and says how to fix it."""

import os
import subprocess
import sys
from collections import namedtuple
from importlib import metadata
from pathlib import Path

import pytest

import qwenvl_lab
from qwenvl_lab import doctor, resources, toy
from qwenvl_lab.doctor import FAIL, OK, WARN, Check


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
    import torch

    found = doctor.check_torch()
    assert found.status == OK and found.detail.startswith(torch.__version__)
    assert ("CUDA" in found.detail) == (torch.version.cuda is not None)
    gpu = doctor.check_gpu()
    assert gpu.status in (OK, WARN)
    if torch.cuda.is_available():
        assert torch.cuda.get_device_name(0) in gpu.detail


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
    assert doctor.check_widgets().status in (OK, WARN)

    def missing(name):
        raise doctor.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(doctor.metadata, "version", missing)
    lab = doctor.check_jupyterlab()
    assert lab.status == FAIL and 'pip install -e ".[course]"' in lab.fix
    assert doctor.check_widgets().status == WARN


def test_disk_space_thresholds(monkeypatch, tmp_path):
    usage = namedtuple("usage", "total used free")
    for free_gib, status in ((0.5, FAIL), (2.0, WARN), (50.0, OK)):
        monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path, f=free_gib: usage(100 * 2**30, 0, int(f * 2**30)))
        found = doctor.check_disk()
        assert found.status == status and str(tmp_path / "out") in found.detail
        assert (resources.OUTPUT_ENV in found.fix) == (status != OK)


def test_memory_and_tensorrt_lines():
    assert doctor.check_memory().status in (OK, WARN)
    found = doctor.check_tensorrt()
    assert found.status == OK  # optional either way
    assert ("not installed" in found.detail) == (not any(map(installed, ("tensorrt", "tensorrt_llm"))))


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


# The CJK font check and the notebook's report


def test_the_font_line_says_whether_the_machine_has_a_cjk_font_and_how_to_get_one(monkeypatch):
    from qwenvl_lab import fonts

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
