"""The package as installed: pyproject.toml's extras and wheel contents, where resources.py finds the data, and a
non-editable wheel that loads the toy model and answers from a fresh virtual environment."""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import platformdirs
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from qwenvl_lab import resources
from qwenvl_lab.course import doctor
from qwenvl_lab.course.doctor import PYTHON_RANGE

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PLATFORMS = {  # marker environments: (platform_system, platform_machine)
    "linux-x86_64": ("Linux", "x86_64"),
    "linux-aarch64": ("Linux", "aarch64"),
    "macos-arm64": ("Darwin", "arm64"),
    "macos-x86_64": ("Darwin", "x86_64"),
    "windows": ("Windows", "AMD64"),
}


def requirement(extra: str, name: str) -> Requirement:
    """The requirement on `name` in optional-dependencies[extra]."""
    found = [
        Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"][extra] if Requirement(r).name == name
    ]
    assert len(found) == 1, f"{extra} lists {name} {len(found)} times"
    return found[0]


# pyproject.toml


@pytest.mark.parametrize("platform_name", sorted(PLATFORMS))
def test_triton_is_required_only_where_it_has_wheels(platform_name):
    triton = requirement("test", "triton")
    assert triton.marker is not None, "triton has no wheels for macOS or Windows: it needs a platform marker"
    system, machine = PLATFORMS[platform_name]
    assert triton.marker.evaluate({"platform_system": system, "platform_machine": machine}) == (system == "Linux")


TEST_TOOLS = {"pytest", "nbval", "nbclient", "coverage", "hypothesis", "ruff", "nbdime", "triton"}


def test_the_learners_extra_holds_no_test_tools_and_nothing_installs_dashscope():
    course = {Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["course"]}
    core = {Requirement(r).name for r in PYPROJECT["project"]["dependencies"]}
    assert {"jupyterlab", "ipywidgets"} <= course and not (course | core) & TEST_TOOLS
    assert {"onnx", "onnxruntime"} <= course and not core & {"onnx", "onnxruntime"}  # notebooks 05 and 08 use them
    installers = [
        REPO / "Makefile",
        REPO / "environment.yml",
        REPO / "requirements-trtllm.txt",
        REPO / "pyproject.toml",
    ]
    assert [p.name for p in installers if "dashscope" in p.read_text(encoding="utf-8")] == []


def installed_closure(extras: set[str]) -> set[str]:
    """The installed distributions `qwenvl_lab[extras]` pulls in, transitively (markers evaluated for this machine)."""

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    found, todo = set(), [("qwenvl_lab", frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
                continue
            if canonical(req.name) not in found:
                found.add(canonical(req.name))
                todo.append((req.name, frozenset(req.extras)))
    return found


def test_installing_the_learners_extra_brings_no_test_runner():
    pulled = installed_closure({"course"})
    assert {"torch", "jupyterlab", "onnxruntime"} <= pulled  # the walk reaches the course's own packages
    assert not pulled & {"pytest", "nbval", "coverage", "hypothesis", "ruff", "nbdime"}, sorted(pulled & TEST_TOOLS)
    assert {"pytest", "nbval", "nbdime"} <= installed_closure({"course", "test"})


def test_one_constraints_file_pins_every_requirement_within_its_range():
    pins = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[re.sub(r"[-_.]+", "-", req.name).lower()] = spec.version
    groups = {"": PYPROJECT["project"]["dependencies"], **PYPROJECT["project"]["optional-dependencies"]}
    unpinned, outside = [], []
    for group, requirements in groups.items():
        if group == "trtllm":  # GPU machines only, pinned to tensorrt_llm 1.2.1's own requirement in pyproject
            continue
        for line in requirements:
            req = Requirement(line)
            pin = pins.get(re.sub(r"[-_.]+", "-", req.name).lower())
            if pin is None:
                unpinned.append(f"{group or 'dependencies'}: {req.name}")
            elif pin not in req.specifier:
                outside.append(f"{req.name}=={pin} outside {req.specifier}")
    assert unpinned == [] and outside == []
    assert pins["torch"] == make_variable("TORCH_VERSION")
    assert "-c $(CONSTRAINTS)" in MAKEFILE and make_variable("CONSTRAINTS") == "constraints.txt"
    assert "- -c constraints.txt" in (REPO / "environment.yml").read_text(encoding="utf-8")
    pip_lines = [ln for ln in MAKEFILE.splitlines() if re.search(r"\$\(PY\) -m pip install", ln)]
    assert pip_lines and all("-c $(CONSTRAINTS)" in ln for ln in pip_lines), pip_lines  # one pip command, constrained


def test_wheel_lists_every_subpackage():
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "qwenvl_lab").rglob("__init__.py")}
    listed = set(SETUPTOOLS["packages"])
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
    data = {
        "qwenvl_lab.data",
        "qwenvl_lab.data.images",
        "qwenvl_lab.data.benchmarks",
        "qwenvl_lab.data.benchmarks.jupyterhub",
        "qwenvl_lab.data.fonts",
    }
    assert listed - found == data


def test_package_data_globs_cover_every_data_file():
    data = REPO / SETUPTOOLS["package-dir"]["qwenvl_lab.data"]
    globs = [
        (data.joinpath(*package.split(".")[2:]), pattern)
        for package, patterns in SETUPTOOLS["package-data"].items()
        for pattern in patterns
    ]
    files = [
        p
        for p in data.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts
    ]
    missed = [
        str(p.relative_to(data))
        for p in files
        if not any(
            p.is_relative_to(folder) and fnmatch.fnmatch(p.relative_to(folder).as_posix(), pattern)
            for folder, pattern in globs
        )
    ]
    assert {"qwen.tiktoken", "toy-qwen-vl/model.safetensors", "images/red_circle.png"} <= {
        p.relative_to(data).as_posix() for p in files
    }
    assert missed == [], f"these data files would be left out of the wheel: add them to package-data: {missed}"


# resources.py


def test_checkout_finds_the_top_level_data():
    assert resources.checkout_dir() == REPO
    assert resources.data_dir() == REPO / "data"
    assert (resources.toy_checkpoint_dir() / "config.json").is_file()
    assert (resources.images_dir() / "red_circle.png").is_file()
    assert resources.vocab_file() == REPO / "data" / "qwen.tiktoken"


def test_installed_data_beside_the_package_wins(monkeypatch, tmp_path):
    (tmp_path / "qwenvl_lab" / "data").mkdir(parents=True)
    monkeypatch.setattr(resources, "PACKAGE_DIR", tmp_path / "qwenvl_lab")
    assert resources.data_dir() == tmp_path / "qwenvl_lab" / "data"
    assert resources.checkout_dir() is None


def test_missing_data_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(resources, "PACKAGE_DIR", tmp_path / "qwenvl_lab")
    with pytest.raises(FileNotFoundError, match="reinstall qwenvl_lab"):
        resources.data_dir()


def test_output_dir_env_then_checkout_then_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(resources.OUTPUT_ENV, str(tmp_path / "mine"))
    assert resources.output_dir() == tmp_path / "mine" and (tmp_path / "mine").is_dir()
    monkeypatch.setenv(resources.OUTPUT_ENV, "")
    monkeypatch.setattr(resources, "checkout_dir", lambda: tmp_path / "clone")
    assert resources.output_dir() == tmp_path / "clone" / "course-output"
    monkeypatch.setattr(resources, "checkout_dir", lambda: None)
    monkeypatch.setattr(platformdirs, "user_cache_path", lambda name: tmp_path / "cache" / name)
    assert resources.output_dir() == tmp_path / "cache" / "qwenvl-lab" / "course-output"


def test_output_dir_that_is_a_file_is_refused(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(resources.OUTPUT_ENV, str(tmp_path / "file"))
    with pytest.raises(NotADirectoryError, match=resources.OUTPUT_ENV):
        resources.output_dir()


# the wheel, installed (not editable) into a fresh virtual environment

SOURCES = ("pyproject.toml", "README.md", "qwenvl_lab", "data")
PROBE = """
import json, sys
import qwenvl_lab
from qwenvl_lab import resources
from qwenvl_lab.tokenizing import load_tokenizer
from qwenvl_lab.toy import TOY_DIR, load_toy_model
from qwenvl_lab.toy.evaluate import ask
from qwenvl_lab.toy.make_samples import SAMPLES
from qwenvl_lab.toy.shapes import describe, question

model, tokenizer = load_toy_model(), load_tokenizer()
answer = ask(model, tokenizer, [[resources.images_dir() / "red_circle.png"]], [question("what")], max_new_tokens=8)[0]
print(json.dumps({
    "package": qwenvl_lab.__file__, "toy": str(TOY_DIR), "vocab": str(tokenizer.vocab_file),
    "checkout": resources.checkout_dir() and str(resources.checkout_dir()), "layers": model.config.num_hidden_layers,
    "answer": answer, "expected": describe(SAMPLES["red_circle.png"]),
    "output": str(resources.output_dir()) if sys.platform.startswith("linux") else None,  # XDG_CACHE_HOME is ours
    "sys_path": sys.path,
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the sources (nothing is written into the checkout)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        else:
            (source / name).write_bytes(path.read_bytes())
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
    )
    (built,) = out.glob("qwenvl_lab-*.whl")
    return built


@pytest.mark.slow
def test_wheel_carries_the_data_and_stays_small(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "qwenvl_lab/data/qwen.tiktoken",
        "qwenvl_lab/data/toy-qwen-vl/model.safetensors",
        "qwenvl_lab/data/toy-qwen-vl/config.json",
        "qwenvl_lab/data/images/red_circle.png",
        "qwenvl_lab/data/README.md",
        "qwenvl_lab/resources.py",
    } <= names
    assert wheel.stat().st_size < 8 * 2**20  # the 81 MB toy checkpoint is mostly zeros and compresses to ~1 MB


@pytest.mark.slow
def test_installed_wheel_loads_the_toy_model_and_answers(wheel, tmp_path):
    env_dir, run_dir, cache = tmp_path / "venv", tmp_path / "run", tmp_path / "cache"
    run_dir.mkdir()
    venv.create(env_dir, with_pip=False)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
    )
    # torch, transformers, … come from this test environment; a path line does not run its .pth files, so the
    # editable install of qwenvl_lab stays invisible
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "test_environment.pth").write_text("\n".join(sorted(ours)) + "\n")
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", resources.OUTPUT_ENV, "QWENVL_LAB_CHECKPOINT")
    }
    env["XDG_CACHE_HOME"] = str(cache)  # the per-user output folder, on Linux
    result = subprocess.run([python, "-c", PROBE], cwd=run_dir, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(found["package"]).is_relative_to(site), found["sys_path"]
    assert Path(found["toy"]) == site / "qwenvl_lab" / "data" / "toy-qwen-vl"
    assert Path(found["vocab"]) == site / "qwenvl_lab" / "data" / "qwen.tiktoken"
    assert found["checkout"] is None and found["layers"] == 4
    assert found["answer"] == found["expected"] == "A red circle."
    if sys.platform.startswith("linux"):
        assert Path(found["output"]) == cache / "qwenvl-lab" / "course-output"
    assert list(run_dir.iterdir()) == []  # nothing written into the working directory


# one Python range and one torch everywhere a learner reads or runs it

MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")


def make_variable(name: str) -> str:
    """The value of `NAME := …` or `NAME ?= …` in the Makefile."""
    (value,) = re.findall(rf"^{name} [:?]= (.*)$", MAKEFILE, re.MULTILINE)
    return value


def test_one_python_range_everywhere():

    (low, high) = PYTHON_RANGE
    ok = make_variable("PYTHON_OK")
    assert f"not ({low[0]}, {low[1]}) <= sys.version_info[:2] <= ({high[0]}, {high[1]})" in ok
    candidates = make_variable("PYTHON_CANDIDATES").split()
    assert [c for c in candidates if re.fullmatch(r"python3\.\d+", c)] == [
        f"python3.{m}" for m in range(high[1], low[1] - 1, -1)
    ]
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]) == SpecifierSet(f">={low[0]}.{low[1]}")
    conda_python = re.search(r"- python=(3\.\d+)", (REPO / "environment.yml").read_text()).group(1)
    assert low <= tuple(map(int, conda_python.split("."))) <= high
    supported, stale = f"{low[0]}.{low[1]}–{high[0]}.{high[1]}", f"3.{low[1] - 1}–"
    for doc in ("README.md", "docs/install.md"):
        text = (REPO / doc).read_text(encoding="utf-8")
        assert supported in text and stale not in text, doc


def test_the_doctor_checks_what_the_makefile_installs():

    assert make_variable("TORCH_VERSION") == doctor.TORCH_VERSION
    assert make_variable("TORCH_INDEX") == doctor.TORCH_CPU_INDEX
    assert "--before-install" in make_variable("PREFLIGHT")
