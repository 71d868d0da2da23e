"""`make wheelhouse` (tools/wheelhouse.py): what it resolves and downloads for each platform and Python, how make
installs from a wheelhouse first, and (given a wheelhouse in $QWENVL_LAB_WHEELHOUSE, for this machine's platform and
Python) an install of the course from it with the network off."""

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tools import wheelhouse

REPO = Path(__file__).resolve().parents[1]
TEST_TOOLS = {"pytest", "nbval", "nbclient", "coverage", "hypothesis", "ruff", "nbdime"}


@pytest.mark.parametrize("platform", sorted(wheelhouse.PLATFORMS))
def test_each_platform_gets_the_course_and_its_torch(platform):
    cpu_index = wheelhouse.PLATFORMS[platform][2]
    wanted = {Requirement(r).name: Requirement(r) for r in wheelhouse.requirements(cpu_index)}
    assert str(wanted["torch"].specifier) == ("==2.13.0+cpu" if platform.startswith("linux") else "==2.13.0")
    assert {"jupyterlab", "onnxruntime", "transformers", "setuptools", "pip"} <= wanted.keys()
    assert not wanted.keys() & TEST_TOOLS


@pytest.mark.parametrize("platform", sorted(wheelhouse.PLATFORMS))
@pytest.mark.parametrize("python", wheelhouse.PYTHONS)
def test_resolved_for_the_target_and_downloaded_for_it(platform, python, tmp_path):
    target, tags, cpu_index = wheelhouse.PLATFORMS[platform]
    resolve = wheelhouse.compile_command("uv", platform, python, tmp_path / "in", tmp_path / "out", "https://t/cpu")
    assert resolve[:3] == ["uv", "pip", "compile"]
    for flag, value in (("--python-platform", target), ("--python-version", python), ("--only-binary", ":all:")):
        assert resolve[resolve.index(flag) + 1] == value
    assert resolve[resolve.index("--constraints") + 1] == str(REPO / "constraints.txt")
    assert ("https://t/cpu" in resolve) == cpu_index  # Linux's torch from the CPU index, the others' from PyPI
    download = wheelhouse.download_command(platform, python, tmp_path / "out", tmp_path / "wheels", "https://t/cpu")
    assert {"--no-deps", "--only-binary=:all:"} <= set(download)  # exactly the resolved wheels, never an sdist
    assert [download[i + 1] for i, a in enumerate(download) if a == "--platform"] == tags
    assert download[download.index("--abi") + 1] == "cp" + python.replace(".", "")
    assert all(tag.endswith(platform.split("-")[1]) for tag in tags)


def test_make_installs_from_a_wheelhouse_alone_first():
    def dry_run(*args):
        done = subprocess.run(["make", "-n", "-B", ".venv/.course", *args], cwd=REPO, capture_output=True, text=True)
        return next(line for line in done.stdout.splitlines() if "pip_install -e '.[course]'" in line)

    with_house = dry_run("WHEELHOUSE=/media/usb/wheels")
    first, _, then = with_house.partition("||")
    assert '--find-links "/media/usb/wheels" --no-index "$@"' in first  # no network at all, first
    assert "--no-index" not in then and '--find-links "/media/usb/wheels"' in then  # then the indexes too
    assert "--no-index" not in dry_run("WHEELHOUSE=") and "--find-links" not in dry_run("WHEELHOUSE=")


@pytest.mark.slow
def test_the_course_installs_from_the_wheelhouse_with_the_network_off(tmp_path):
    """Needs a wheelhouse for this machine's platform and Python (`make wheelhouse WHEELHOUSE_PLATFORMS=…
    WHEELHOUSE_PYTHONS=…`) named by $QWENVL_LAB_WHEELHOUSE; the network is cut with `unshare -n` (root on Linux),
    else only pip's indexes are (--no-index, no pip configuration)."""
    house = os.environ.get("QWENVL_LAB_WHEELHOUSE")
    if not house:
        pytest.skip("no $QWENVL_LAB_WHEELHOUSE: make wheelhouse, then name the folder")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "constraints.txt", "qwenvl_lab", "data"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}))  # fmt: skip
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    offline = ["unshare", "-n"] if shutil.which("unshare") and os.geteuid() == 0 else []
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    torch = "torch==2.13.0+cpu" if sys.platform.startswith("linux") else "torch==2.13.0"
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", house]
    install += ["-c", str(source / "constraints.txt"), torch, f"{source}[course]"]
    done = subprocess.run(offline + install, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = (
        "import torch, jupyterlab, onnxruntime, qwenvl_lab; from qwenvl_lab.toy import load_toy_model; load_toy_model()"
    )
    ran = subprocess.run(offline + [str(python), "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
