"""`python tools/wheelhouse.py` — one folder of wheels from which the course installs with no network: torch's CPU
build and every dependency of the course, for each Python and platform a class brings (`make wheelhouse`).

For each platform and Python: uv resolves the course's requirements (pyproject.toml's dependencies and `course` extra,
the tested versions of constraints.txt, setuptools for the editable install's build) with the markers of *that*
platform (`uv pip compile --python-platform`; pip's own resolver would evaluate `os_name == 'nt'` and the like for
the machine it runs on, and miss Windows' pywinpty), then pip downloads exactly those wheels for it (`pip download
--no-deps --only-binary=:all: --platform … --python-version …`). Linux's torch comes from the PyPI CPU index
(--torch-index; PyPI's Linux torch is a CUDA build of 2.7 GB with its libraries), macOS's and Windows' from PyPI.
pip's own sources (pip.conf's find-links) are searched too. Put the folder on a USB stick or a share; a learner's
`make lab WHEELHOUSE=/path/to/it` (or the folder copied to wheelhouse/ in the clone) installs from it first.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from qwenvl_lab.course.doctor import TORCH_CPU_INDEX, TORCH_VERSION, pip_settings

ROOT = Path(__file__).resolve().parents[1]

PYTHONS = ("3.11", "3.12", "3.13")  # doctor.PYTHON_RANGE
PYPI = "https://pypi.org/simple"


def manylinux(arch: str) -> list[str]:
    """pip's platform tags for a Linux wheel on `arch` with glibc 2.17-2.28 (torch 2.13's CPU wheels: 2.28); pip
    expands manylinux2014 to the older 2010 and 1 itself, but not the manylinux_2_x tags."""
    return [f"manylinux_2_{minor}_{arch}" for minor in range(28, 16, -1)] + [f"manylinux2014_{arch}"]


# name: (uv's --python-platform, pip's --platform tags, whether torch comes from the CPU index)
PLATFORMS = {
    "linux-x86_64": ("x86_64-manylinux_2_28", manylinux("x86_64"), True),
    "linux-aarch64": ("aarch64-manylinux_2_28", manylinux("aarch64"), True),
    "macos-arm64": ("aarch64-apple-darwin", ["macosx_14_0_arm64"], False),  # pip expands it down to macOS 11
    "windows-amd64": ("x86_64-pc-windows-msvc", ["win_amd64"], False),
}


def requirements(cpu_index: bool) -> list[str]:
    """What the course installs (pyproject.toml: dependencies and the `course` extra, with their markers), torch as
    the CPU build where it comes from the CPU index, the build backend of `pip install -e .`, and pip (make's first
    step upgrades the new venv's)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    wanted = project["project"]["dependencies"] + project["project"]["optional-dependencies"]["course"]
    torch = f"torch=={TORCH_VERSION}+cpu" if cpu_index else f"torch=={TORCH_VERSION}"
    backend = project["build-system"]["requires"]  # pip builds the editable install with it, offline too
    return [torch] + [r for r in wanted if not r.replace(" ", "").startswith("torch")] + backend + ["pip"]


def index_options(cpu_index: bool, torch_index: str, find_links: list[str]) -> list[str]:
    """Where to look: PyPI (or pip.conf's index), the CPU index of torch for Linux, pip's find-links."""
    options = ["--index-url", pip_settings()["index-url"] or PYPI]
    if cpu_index and torch_index:
        options += ["--extra-index-url", torch_index]
    for link in find_links:
        options += ["--find-links", link]
    return options


def compile_command(uv: str, platform: str, python: str, requirements_in: Path, out: Path, torch_index: str):
    """uv's resolution of the course for one platform and Python, into a list of pinned requirements."""
    target, _, cpu_index = PLATFORMS[platform]
    return [
        uv, "pip", "compile", str(requirements_in), "--output-file", str(out), "--quiet",
        "--constraints", str(ROOT / "constraints.txt"),
        "--python-platform", target, "--python-version", python, "--only-binary", ":all:",
        "--no-header", "--no-annotate", "--index-strategy", "unsafe-best-match",
        *index_options(cpu_index, torch_index, pip_settings()["find-links"]),
    ]  # fmt: skip


def download_command(platform: str, python: str, pinned: Path, dest: Path, torch_index: str) -> list[str]:
    """pip's download of exactly the pinned wheels for one platform and Python."""
    _, tags, cpu_index = PLATFORMS[platform]
    abi = "cp" + python.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--dest", str(dest), "--python-version", python, "--implementation", "cp", "--abi", abi]
    for tag in tags:
        command += ["--platform", tag]
    return command + ["-r", str(pinned)] + index_options(cpu_index, torch_index, [])  # pip reads its own find-links


def gather(dest: Path, platforms, pythons, torch_index: str, uv: str) -> list[str]:
    """Download every platform's and Python's wheels into `dest`; what failed (empty when all came)."""
    dest.mkdir(parents=True, exist_ok=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="qwenvl-wheelhouse-") as work:
        for platform in platforms:
            requirements_in = Path(work) / f"{platform}.in"
            requirements_in.write_text("\n".join(requirements(PLATFORMS[platform][2])) + "\n", encoding="utf-8")
            for python in pythons:
                pinned = Path(work) / f"{platform}-{python}.txt"
                print(f"{platform}, Python {python}", flush=True)
                for command in (
                    compile_command(uv, platform, python, requirements_in, pinned, torch_index),
                    download_command(platform, python, pinned, dest, torch_index),
                ):
                    if subprocess.run(command).returncode != 0:
                        failed.append(f"{platform}, Python {python}: {' '.join(command[:4])} … failed (above)")
                        break
    return failed


def main(argv=None) -> int:
    """Command line: gather the wheels and say how big the folder is; exit status 1 when a platform failed."""
    parser = argparse.ArgumentParser(prog="python tools/wheelhouse.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "wheelhouse", help="the folder (default: %(default)s)")
    parser.add_argument("--platforms", nargs="+", choices=sorted(PLATFORMS), default=sorted(PLATFORMS))
    parser.add_argument("--pythons", nargs="+", choices=PYTHONS, default=list(PYTHONS))
    parser.add_argument(
        "--torch-index",
        default=TORCH_CPU_INDEX,
        help="Linux's torch CPU builds (default: %(default)s; empty: only pip's find-links)",
    )
    parser.add_argument("--uv", default=str(Path(sys.executable).with_name("uv")), help="uv (default: beside python)")
    args = parser.parse_args(argv)
    if not os.access(args.uv, os.X_OK):
        parser.error(f"no uv at {args.uv}: pip install uv (make wheelhouse does)")
    failed = gather(args.dest, args.platforms, args.pythons, args.torch_index, args.uv)
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels) / 2**30
    print(f"{args.dest}: {len(wheels)} wheels, {size:.1f} GiB")
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
