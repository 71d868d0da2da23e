"""Tests for the TensorRT-LLM 1.2.1 install check (make trtllm-env runs it before pip): stand-in nvcc and nvidia-smi."""

import subprocess
import sys

import pytest

from qwenvl_lab.trtllm.install_check import install_problems, main

NVIDIA_SMI = """#!/bin/sh
echo '| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: {cuda}  |'
"""
NVCC = """#!/bin/sh
echo 'Cuda compilation tools, release {cuda}, V{cuda}.80'
"""


def machine(tmp_path, nvcc=None, smi=None, cuda_home=True):
    """An environment whose PATH holds stand-in nvidia-smi (driver CUDA `smi`) and CUDA_HOME/bin/nvcc (`nvcc`)."""
    bin_dir, home = tmp_path / "bin", tmp_path / "cuda"
    bin_dir.mkdir(exist_ok=True)
    (home / "bin").mkdir(parents=True, exist_ok=True)
    for folder, name, template, cuda in ((home / "bin", "nvcc", NVCC, nvcc), (bin_dir, "nvidia-smi", NVIDIA_SMI, smi)):
        if cuda is not None:
            (folder / name).write_text(template.format(cuda=cuda))
            (folder / name).chmod(0o755)
    env = {"PATH": str(bin_dir)}  # nothing of the real machine: a GPU machine has its own nvidia-smi
    if cuda_home:
        env["CUDA_HOME"] = str(home)
    return env


def test_a_ready_machine_has_no_problems(tmp_path):
    assert install_problems(machine(tmp_path, "13.1", "13.1"), lambda name: "libmpi.so.40", (3, 12)) == []


@pytest.mark.parametrize(
    "setup, python, expected",
    [
        (
            dict(nvcc="13.1", smi="13.1"),
            (3, 11),
            "Python 3.11: tensorrt_llm 1.2.1 has wheels for Python 3.10 and 3.12 only, and this package",
        ),
        (dict(nvcc="12.8", smi="13.1"), (3, 12), "is CUDA 12.8; tensorrt_llm 1.2.1 is built with CUDA 13.1"),
        (dict(nvcc="13.1", smi="13.0"), (3, 12), "supports CUDA up to 13.0, older than 13.1: install cuda-compat-13-1"),
        (dict(nvcc="13.1", smi=None), (3, 12), "no nvidia-smi: this machine has no NVIDIA driver"),
        (dict(nvcc=None, smi="13.1"), (3, 12), "has no bin/nvcc: point it at the CUDA Toolkit 13.1"),
        (dict(nvcc=None, smi="13.1", cuda_home=False), (3, 12), "CUDA_HOME is not set: install the CUDA Toolkit 13.1"),
    ],
)
def test_each_missing_piece_is_named(tmp_path, setup, python, expected):
    problems = install_problems(machine(tmp_path, **setup), lambda name: "libmpi.so.40", python)
    assert len(problems) == (2 if not setup.get("cuda_home", True) else 1) and expected in problems[0]


def test_no_mpi_library_is_named_with_its_package(tmp_path):
    (problem,) = install_problems(machine(tmp_path, "13.1", "13.1"), lambda name: None, (3, 12))
    assert "sudo apt-get -y install libopenmpi-dev" in problem


def test_the_command_fails_before_pip_and_report_does_not(capsys):
    status = main([])
    if install_problems():  # this machine (no GPU): the usual case here
        assert status == 1 and "TensorRT-LLM 1.2.1 needs what this machine lacks" in capsys.readouterr().err
        assert main(["--report"]) == 0
    else:
        assert status == 0


def test_it_runs_in_a_bare_python():
    """make trtllm-env runs it before anything is installed: the standard library must be enough."""
    code = (
        "import sys, qwenvl_lab.trtllm.install_check; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
