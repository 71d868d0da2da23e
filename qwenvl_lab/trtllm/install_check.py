"""What a machine lacks for TensorRT-LLM 1.2.1's pip install, said before pip starts (`make trtllm-env`).

TensorRT-LLM 1.2's Linux install guide (docs/source/installation/linux.md) asks for the CUDA Toolkit 13.1 with
CUDA_HOME set, `cuda-compat-13-1` where the driver is older, libopenmpi, and a Python tensorrt_llm 1.2.1 has wheels for
(3.10 and 3.12, its PKG-INFO) that this package runs on (3.11+): 3.12. Standard library only: it runs in a bare Python, before any install.

    python3.12 -m qwenvl_lab.trtllm.install_check            # exit status 1 when something is missing
    python3.12 -m qwenvl_lab.trtllm.install_check --report   # the same lines, exit status 0
"""

import argparse
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CUDA_VERSION = (13, 1)  # the CUDA TensorRT-LLM 1.2.1's wheels are built with
PYTHONS = ((3, 12),)  # of tensorrt_llm 1.2.1's wheels (3.10, 3.12), the one this package runs on (3.11+)
GUIDE = "docs/tensorrt.md"


def _version(text: str, pattern: str) -> tuple[int, int] | None:
    found = re.search(pattern, text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _output(command: list[str]) -> str | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def install_problems(env=None, find_library=ctypes.util.find_library, python=sys.version_info[:2]) -> list[str]:
    """What this machine lacks for `pip install tensorrt_llm==1.2.1`, one sentence each (empty when nothing)."""
    env = os.environ if env is None else env
    path = env.get("PATH", "")
    cuda = ".".join(map(str, CUDA_VERSION))
    problems = []
    if tuple(python) not in PYTHONS:
        problems.append(
            f"Python {python[0]}.{python[1]}: tensorrt_llm 1.2.1 has wheels for Python 3.10 and 3.12 only, and this package "
            "needs 3.11 or later: use 3.12, e.g. make trtllm-env TRT_PYTHON=python3.12"
        )
    cuda_home = env.get("CUDA_HOME", "")
    nvcc = None
    if not cuda_home:
        problems.append(
            f"CUDA_HOME is not set: install the CUDA Toolkit {cuda} (NVIDIA's CUDA Installation Guide for Linux) and "
            f"export CUDA_HOME=/usr/local/cuda-{cuda}"
        )
        nvcc = shutil.which("nvcc", path=path)
    elif (Path(cuda_home) / "bin" / "nvcc").is_file():
        nvcc = str(Path(cuda_home) / "bin" / "nvcc")
    else:
        problems.append(f"CUDA_HOME={cuda_home} has no bin/nvcc: point it at the CUDA Toolkit {cuda} install")
    if nvcc is None and not cuda_home:
        problems.append(f"no nvcc on PATH: the CUDA Toolkit {cuda} is not installed (or not on PATH)")
    elif nvcc is not None:
        release = _version(_output([nvcc, "--version"]) or "", r"release (\d+)\.(\d+)")
        if release is None:
            problems.append(f"{nvcc} --version did not say its CUDA release: check the CUDA Toolkit {cuda} install")
        elif release != CUDA_VERSION:
            problems.append(
                f"{nvcc} is CUDA {release[0]}.{release[1]}; tensorrt_llm 1.2.1 is built with CUDA {cuda}: install "
                f"the CUDA Toolkit {cuda} and point CUDA_HOME (and PATH) at it"
            )
    smi = shutil.which("nvidia-smi", path=path)
    if smi is None:
        problems.append("no nvidia-smi: this machine has no NVIDIA driver (TensorRT-LLM needs an NVIDIA GPU)")
    else:
        driver = _version(_output([smi]) or "", r"CUDA Version: (\d+)\.(\d+)")
        if driver is not None and driver < CUDA_VERSION:
            problems.append(
                f"the NVIDIA driver supports CUDA up to {driver[0]}.{driver[1]}, older than {cuda}: install "
                f"cuda-compat-{CUDA_VERSION[0]}-{CUDA_VERSION[1]} (CUDA forward compatibility, data-center GPUs) "
                "and put its libraries first (LD_LIBRARY_PATH=/usr/local/cuda/compat), or a newer driver"
            )
    if find_library("mpi") is None:
        problems.append("no MPI library (libmpi): install Open MPI, sudo apt-get -y install libopenmpi-dev")
    return problems


def main(argv=None) -> int:
    """Print what is missing; exit status 1 when something is (0 with --report)."""
    parser = argparse.ArgumentParser(
        prog="python -m qwenvl_lab.trtllm.install_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--report", action="store_true", help="only report: exit status 0 even when something is missing"
    )
    args = parser.parse_args(argv)
    problems = install_problems()
    if not problems:
        print(f"TensorRT-LLM 1.2.1 prerequisites found: CUDA {'.'.join(map(str, CUDA_VERSION))}, driver, MPI, Python")
        return 0
    print(f"TensorRT-LLM 1.2.1 needs what this machine lacks ({GUIDE}):", file=sys.stderr)
    for problem in problems:
        print(f"  - {problem}", file=sys.stderr)
    return 0 if args.report else 1


if __name__ == "__main__":
    sys.exit(main())
