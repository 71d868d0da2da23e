"""`make clean` and `make clean-all` never delete a trained model, a training state or the learner's notebooks: they
move them to a dated backup first (tools/clean.py), then remove what the course makes again."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path):
    """A checkout's top level with the Makefile, tools/clean.py, a .venv, course outputs and the learner's notebooks."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "clean.py", tmp_path / "tools" / "clean.py")
    files = {
        "course-output/engines/toy-qwen-vl-abc/manifest.json": json.dumps({"format": "qwenvl-lab-engine/2"}),
        "course-output/engines/toy-qwen-vl-abc/config.json": json.dumps({"visual": {}}),
        "course-output/engines/toy-qwen-vl-abc/llm/rank0.safetensors": "weights",
        "course-output/toy-qwen-vl/config.json": json.dumps({"visual": {"layers": 3}}),
        "course-output/toy-qwen-vl/model.safetensors": "trained for an hour",
        "course-output/runs/mine/state.pt": "a paused training",
        "course-output/notebook-08/visual.onnx": "made again by notebook 08",
        "build/site/_build/html/index.html": "<html>",
        "qwenvl_lab.egg-info/PKG-INFO": "Name: qwenvl_lab",
        "my-notebooks/00_welcome.ipynb": "my answers",
        ".venv/pyvenv.cfg": "home = /usr/bin",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def make(checkout, target):
    done = subprocess.run(["make", "--no-print-directory", target], cwd=checkout, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def backed_up(checkout) -> dict:
    return {
        p.relative_to(checkout / "backups").as_posix().split("/", 1)[1]: p.read_text()
        for p in (checkout / "backups").rglob("*")
        if p.is_file()
    }


def test_make_clean_moves_trained_models_and_states_to_a_dated_backup_first(checkout):
    out = make(checkout, "clean")
    assert backed_up(checkout) == {
        "course-output/toy-qwen-vl/config.json": json.dumps({"visual": {"layers": 3}}),
        "course-output/toy-qwen-vl/model.safetensors": "trained for an hour",
        "course-output/runs/mine/state.pt": "a paused training",
    }
    assert "moved course-output/toy-qwen-vl to backups/" in out and "are in backups/" in out
    for gone in ("course-output", "build", "qwenvl_lab.egg-info"):
        assert not (checkout / gone).exists()
    assert (checkout / "my-notebooks" / "00_welcome.ipynb").read_text() == "my answers"  # stays
    assert (checkout / ".venv").is_dir()


def test_make_clean_all_moves_the_learners_notebooks_never_deletes_them(checkout):
    make(checkout, "clean-all")
    kept = backed_up(checkout)
    assert kept["my-notebooks/00_welcome.ipynb"] == "my answers"
    assert kept["course-output/toy-qwen-vl/model.safetensors"] == "trained for an hour"
    assert not (checkout / "my-notebooks").exists() and not (checkout / ".venv").exists()
    make(checkout, "clean-all")  # again, with nothing left to keep: a second dated folder is never needed
    assert len(list((checkout / "backups").iterdir())) == 1
