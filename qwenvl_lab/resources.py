"""Where the course's files lie: the shipped data (toy checkpoint, pictures, vocabulary, benchmarks) and its outputs.

The top-level `data/` folder of the repository is installed as the package data `qwenvl_lab/data/` (pyproject.toml
maps it), so an installed wheel finds it beside the package and a checkout (editable install or source tree) finds it
at the repository's top level.
"""

import os
import platform
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
OUTPUT_ENV = "QWENVL_LAB_OUTPUT"  # where course outputs (engines, checkpoints, plans) go
OUTPUT_FOLDER = "course-output"  # their folder at a checkout's top level (git ignores it)
VOCAB_FILE_NAME = "qwen.tiktoken"


def checkout_dir() -> Path | None:
    """The repository's top-level folder when the package runs from a source checkout, else None."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "data").is_dir():
        return root
    return None


def data_dir() -> Path:
    """The shipped data folder: `qwenvl_lab/data` of an installed wheel, else the checkout's `data/`."""
    installed = PACKAGE_DIR / "data"
    if installed.is_dir():
        return installed
    root = checkout_dir()
    if root is None:
        raise FileNotFoundError(
            f"the course data is missing: neither {installed} nor a source checkout's data/ folder exists; "
            "reinstall qwenvl_lab (pip install --force-reinstall qwenvl_lab) or run from a clone of the repository"
        )
    return root / "data"


def toy_checkpoint_dir() -> Path:
    """The shipped toy Qwen-VL checkpoint (config.json, generation_config.json, model.safetensors)."""
    return data_dir() / "toy-qwen-vl"


def images_dir() -> Path:
    """The sample pictures with the answers the toy model gives (their README.md lists them)."""
    return data_dir() / "images"


def vocab_file() -> Path:
    """The shipped qwen.tiktoken, Qwen's BPE vocabulary (data/README.md: origin and sha256)."""
    return data_dir() / VOCAB_FILE_NAME


def output_dir() -> Path:
    """The folder for course outputs, created if needed: $QWENVL_LAB_OUTPUT, else `course-output/` of a checkout,
    else a per-user cache folder."""
    chosen = os.environ.get(OUTPUT_ENV, "")
    if chosen:
        folder = Path(chosen).expanduser()
    elif checkout_dir() is not None:
        folder = checkout_dir() / OUTPUT_FOLDER
    else:
        import platformdirs  # noqa: PLC0415 — only here: the TensorRT-LLM environment installs this package without its dependencies

        folder = platformdirs.user_cache_path("qwenvl-lab") / OUTPUT_FOLDER
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"course outputs go to {folder}, which is a file; set {OUTPUT_ENV} to a folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def machine() -> dict:
    """What this machine is, for results saved beside the data: the CPU's model name, its cores, Python's version."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), platform.processor()
    )
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "python": platform.python_version()}
