"""Binder (repo2docker): environment.yml installs the course, postBuild checks it and builds the course engine, start
opens it as `make lab` does. The scripts run here in a copy of the repository; Binder itself is not reachable."""

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import pythonpath

REPO = Path(__file__).resolve().parents[1]
COPIED = (
    "pyproject.toml",
    "README.md",
    "environment.yml",
    "constraints.txt",
    "postBuild",
    "start",
    ".jupyter",
    "qwenvl_lab",
    "data",
    "notebooks",
)
SERVER = "import json, os; print(json.dumps([os.getcwd(), os.environ['QWENVL_LAB_OUTPUT'], os.environ['JUPYTER_CONFIG_PATH']]))"


def test_environment_installs_the_course_with_the_cpu_torch():
    text = (REPO / "environment.yml").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text and "torch==2.13.0" in text
    assert "- -e .[course]" in text and not (REPO / "binder").exists()  # a binder/ folder would hide these files
    assert "- -c constraints.txt" in text  # the tested versions, as make installs them


@pytest.mark.parametrize("name", ["postBuild", "start"])
def test_scripts_are_executable(name):
    assert (REPO / name).stat().st_mode & stat.S_IXUSR
    listed = subprocess.run(["git", "ls-files", "-s", name], cwd=REPO, capture_output=True, text=True).stdout
    assert not listed or listed.startswith("100755"), listed


@pytest.fixture
def binder_repo(tmp_path):
    """A copy of the repository as repo2docker lays it out (the learner's home), and a PATH whose python is ours."""
    repo = tmp_path / "repo"
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        else:
            repo.mkdir(exist_ok=True)
            shutil.copy2(source, repo / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a link would lose the venv
    (bin_dir / "python").chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("QWENVL_LAB_OUTPUT", "QWENVL_LAB_WORKDIR", "QWENVL_LAB_CHECKPOINT")
    }
    env.update(
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
        PYTHONPATH=pythonpath(repo, env=env),  # the copy first, then ours
        HOME=str(tmp_path / "home"),
    )
    return repo, env


@pytest.mark.slow
def test_post_build_checks_the_course_and_builds_its_engine(binder_repo):
    pytest.importorskip("jupyterlab", reason="postBuild's doctor needs JupyterLab (the course extra), as Binder has")
    repo, env = binder_repo
    done = subprocess.run(["bash", "postBuild"], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ready for the course" in done.stdout
    (engine,) = (p for p in (repo / "course-output" / "engines").iterdir() if p.is_dir())  # beside it: its lock file
    assert (engine / "manifest.json").is_file() and f"course engine: {engine}" in done.stdout


def test_start_opens_the_learners_copies_with_the_course_settings(binder_repo):
    repo, env = binder_repo
    done = subprocess.run(["bash", "start", "python", "-c", SERVER], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cwd, output, config = json.loads(done.stdout.splitlines()[-1])
    assert (Path(cwd), Path(output)) == (repo, repo / "course-output")
    assert config.split(os.pathsep)[0] == str(repo / ".jupyter")
    copies = sorted(p.name for p in (repo / "my-notebooks").iterdir())
    assert copies == sorted([*(p.name for p in (repo / "notebooks").glob("*.ipynb")), "solutions"])
    assert "00_welcome.ipynb" in copies and (repo / "my-notebooks" / "solutions" / "01_solutions.ipynb").is_file()
    assert not (repo / "data" / "data").exists()  # the repository is the learner's folder: nothing linked into it
