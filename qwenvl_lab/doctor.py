"""`python -m qwenvl_lab.doctor` — a pre-flight check of the machine: one line per check (ok / warn / fail) and a fix.

The exit status is 1 when a check fails (the course cannot run), else 0 (warnings included).
"""

import argparse
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from . import resources

OK, WARN, FAIL = "ok", "warn", "fail"
PYTHON_RANGE = ((3, 10), (3, 13))  # the versions the course is tested on
TORCH_MIN = (2, 11)  # pyproject.toml: torch>=2.11
COURSE_DISK_GIB = 1.0  # the notebooks' engines and checkpoints in the output folder take about 0.7 GB
SPARE_DISK_GIB = 3.0
SPARE_MEMORY_GIB = 2.0
INSTALL_COURSE = 'make setup (or: python -m pip install -e ".[course]")'
TORCH_INSTALL = (
    "make setup (or: python -m pip install torch==2.13.0, adding --index-url "
    "https://download.pytorch.org/whl/cpu on Linux for the CPU build)"
)
TOY_RESTORE = "`git checkout -- data/toy-qwen-vl` restores the shipped toy model in a clone (else reinstall qwenvl_lab)"
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
SAMPLE_PICTURE = "red_circle.png"  # a sample picture the toy model describes exactly (data/images/README.md)


@dataclass(frozen=True)
class Check:
    """One check's result: its name, ok / warn / fail, what was found, and what to do when it is not ok."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def check_python(version_info=sys.version_info) -> Check:
    """The interpreter's version against PYTHON_RANGE."""
    (low, high), found = PYTHON_RANGE, tuple(version_info[:2])
    version = ".".join(map(str, version_info[:3]))
    supported = f"{low[0]}.{low[1]}–{high[0]}.{high[1]}"
    if found < low:
        return Check(
            "python",
            FAIL,
            f"Python {version} is older than the course needs ({supported})",
            f"install Python {high[0]}.{high[1]}, delete .venv, then: make lab PYTHON=python{high[0]}.{high[1]}",
        )
    if found > high:
        return Check(
            "python",
            WARN,
            f"Python {version} is newer than the tested {supported}",
            f"if an install fails, install Python {high[0]}.{high[1]}, delete .venv, then: make lab "
            f"PYTHON=python{high[0]}.{high[1]}",
        )
    return Check("python", OK, f"{version} ({sys.executable})")


def check_torch() -> Check:
    """torch's version and build (CPU or CUDA)."""
    try:
        import torch
    except ImportError as err:
        return Check("torch", FAIL, f"torch cannot be imported ({err})", TORCH_INSTALL)
    if torch.__version__ < TORCH_MIN:  # a TorchVersion compares with tuples
        return Check(
            "torch", FAIL, f"torch {torch.__version__} is older than {'.'.join(map(str, TORCH_MIN))}", TORCH_INSTALL
        )
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    return Check("torch", OK, f"{torch.__version__} ({build})")


def check_gpu() -> Check:
    """The NVIDIA GPU torch sees, if any (the course runs on a CPU without one)."""
    try:
        import torch
    except ImportError:
        return Check("gpu", WARN, "unknown: torch cannot be imported (see the torch line)", TORCH_INSTALL)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        count = torch.cuda.device_count()
        return Check(
            "gpu",
            OK,
            f"{props.name} ({_gib(props.total_memory)}, compute {props.major}.{props.minor})"
            + (f" and {count - 1} more" if count > 1 else ""),
        )
    if Path("/proc/driver/nvidia/version").exists() and not torch.version.cuda:
        return Check(
            "gpu",
            WARN,
            "an NVIDIA driver is present but torch is a CPU build: the GPU parts are skipped",
            "for the GPU parts install a CUDA build of torch (https://pytorch.org/get-started/locally/)",
        )
    return Check("gpu", OK, "none: the course runs on the CPU (the GPU parts are skipped)")


def check_vocabulary() -> Check:
    """The shipped qwen.tiktoken: present and with the expected sha256 (the tokenizer refuses any other)."""
    try:
        from .tokenizing import QWEN_TIKTOKEN_SHA256, VOCAB_RESTORE, load_tokenizer
    except ImportError as err:
        return Check("vocabulary", FAIL, f"the tokenizer cannot be imported ({err})", INSTALL_COURSE)
    try:
        tokenizer = load_tokenizer()
    except (FileNotFoundError, ValueError) as err:
        return Check("vocabulary", FAIL, str(err).split("; ")[0], VOCAB_RESTORE)
    return Check("vocabulary", OK, f"{tokenizer.vocab_file} (sha256 {QWEN_TIKTOKEN_SHA256[:16]}…, as expected)")


def check_model() -> Check:
    """The course's model: the shipped toy loads and answers a sample picture; another checkpoint's config is read."""
    try:
        from .checkpoint import load_config
        from .tokenizing import load_tokenizer
        from .toy import CHECKPOINT_ENV, TOY_DIR, default_checkpoint_dir, load_toy_model
        from .toy.evaluate import ask
        from .toy.make_samples import SAMPLES
        from .toy.shapes import describe, question
    except ImportError as err:
        return Check("model", FAIL, f"the model code cannot be imported ({err})", INSTALL_COURSE)
    checkpoint = default_checkpoint_dir()
    try:
        if checkpoint != TOY_DIR:
            config = load_config(checkpoint)
            return Check(
                "model",
                OK,
                f"{checkpoint} (from ${CHECKPOINT_ENV}): {config.num_hidden_layers} layers, "
                f"hidden size {config.hidden_size}; not loaded here",
            )
        model = load_toy_model()
        config = model.config
        answer = ask(
            model, load_tokenizer(), [[resources.images_dir() / SAMPLE_PICTURE]], [question("what")], max_new_tokens=8
        )[0]
    except (FileNotFoundError, ValueError) as err:
        fix = (
            f"unset {CHECKPOINT_ENV} or point it at a Qwen-VL-Chat directory" if checkpoint != TOY_DIR else TOY_RESTORE
        )
        return Check("model", FAIL, f"{checkpoint}: {err}", fix)
    size = sum(p.numel() for p in model.parameters()) / 1e6
    detail = (
        f"toy Qwen-VL at {checkpoint}: {config.num_hidden_layers} layers, hidden size {config.hidden_size}, "
        f"vocab {config.vocab_size}, {size:.1f}M parameters; {SAMPLE_PICTURE} → {answer!r}"
    )
    expected = describe(SAMPLES[SAMPLE_PICTURE])
    if answer != expected:
        return Check("model", FAIL, f"{detail} (expected {expected!r})", TOY_RESTORE)
    return Check("model", OK, detail)


def check_jupyterlab() -> Check:
    """JupyterLab 4, which runs the notebooks."""
    try:
        version = metadata.version("jupyterlab")
    except metadata.PackageNotFoundError:
        return Check("jupyterlab", FAIL, "JupyterLab is not installed", INSTALL_COURSE)
    if int(version.split(".")[0]) < 4:
        return Check("jupyterlab", FAIL, f"JupyterLab {version} is older than 4", INSTALL_COURSE)
    return Check("jupyterlab", OK, version)


def check_widgets() -> Check:
    """ipywidgets and its JupyterLab extension (without them the interactive parts show as text)."""
    try:
        version = metadata.version("ipywidgets")
    except metadata.PackageNotFoundError:
        return Check(
            "ipywidgets", WARN, "ipywidgets is not installed: the interactive parts are skipped", INSTALL_COURSE
        )
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:
        return Check("ipywidgets", WARN, f"ipywidgets {version}, but jupyter_core is missing", INSTALL_COURSE)
    for folder in jupyter_path("labextensions"):
        package = Path(folder) / WIDGETS_EXTENSION / "package.json"
        if package.is_file():
            try:
                extension = json.loads(package.read_text(encoding="utf-8")).get("version", "?")
            except (OSError, ValueError):
                extension = "unreadable package.json"
            return Check("ipywidgets", OK, f"{version}, JupyterLab extension {extension}")
    return Check(
        "ipywidgets",
        WARN,
        f"ipywidgets {version}, but its JupyterLab extension ({WIDGETS_EXTENSION}) is missing: widgets show as text",
        'python -m pip install "jupyterlab_widgets>=3"',
    )


def check_disk() -> Check:
    """Free space where the course writes its outputs (resources.output_dir())."""
    folder = resources.output_dir()
    free = shutil.disk_usage(folder).free
    detail = f"{_gib(free)} free at {folder}"
    fix = f"free some space there, or set {resources.OUTPUT_ENV} to a folder on a disk with more room"
    if free < COURSE_DISK_GIB * 2**30:
        return Check("disk", FAIL, detail + f" (the course writes about {COURSE_DISK_GIB:.1f} GiB)", fix)
    if free < SPARE_DISK_GIB * 2**30:
        return Check("disk", WARN, detail + " (little room left)", fix)
    return Check("disk", OK, detail)


def check_memory() -> Check:
    """Available memory (psutil)."""
    try:
        import psutil
    except ImportError:
        return Check("memory", WARN, "unknown: psutil is not installed", INSTALL_COURSE)
    memory = psutil.virtual_memory()
    detail = f"{_gib(memory.available)} available of {_gib(memory.total)}"
    if memory.available < SPARE_MEMORY_GIB * 2**30:
        return Check("memory", WARN, detail + " (tight: close other programs)", "close other programs or notebooks")
    return Check("memory", OK, detail)


def check_tensorrt() -> Check:
    """TensorRT (visual plans) and TensorRT-LLM (engines), optional: GPU machines only."""
    found = []
    for name in ("tensorrt", "tensorrt_llm"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    if found:
        return Check("tensorrt", OK, ", ".join(found))
    return Check("tensorrt", OK, "not installed (optional: NVIDIA GPU machines, docs/tensorrt.md and `make trtllm`)")


def check_cjk_font() -> Check:
    """A CJK font for the Chinese in the figures: the machine's, else only the course's own subset (fonts.py)."""
    from . import fonts

    if not fonts.shipped_font().is_file():
        return Check("font", WARN, f"the course's font {fonts.shipped_font()} is missing", INSTALL_COURSE)
    found = fonts.system_cjk_font()
    if found is not None:
        return Check("font", OK, f"{found[0]} ({found[1]}), and the course's own for what it lacks")
    return Check(
        "font",
        WARN,
        f"no CJK font on this machine: figures draw Chinese with the course's own ({len(fonts.shipped_characters())} "
        "characters: the common ones and the course's); rarer characters show as empty boxes",
        fonts.GET_A_FONT,
    )


CHECKS = (
    check_python,
    check_torch,
    check_gpu,
    check_vocabulary,
    check_model,
    check_jupyterlab,
    check_widgets,
    check_disk,
    check_memory,
    check_tensorrt,
    check_cjk_font,
)


def run_checks(checks=None) -> list[Check]:
    """Run every check (default CHECKS); one that raises becomes a failed check naming the error."""
    results = []
    for check in CHECKS if checks is None else checks:
        try:
            results.append(check())
        except Exception as err:  # a broken check must not hide the others
            name = check.__name__.removeprefix("check_")
            results.append(
                Check(
                    name,
                    FAIL,
                    f"the check itself failed: {type(err).__name__}: {err}",
                    "report this output to the course's maintainers",
                )
            )
    return results


def format_check(check: Check) -> str:
    """One line per check, and an indented `fix:` line when it is not ok."""
    line = f"{check.status:<5} {check.name:<11} {check.detail}"
    return line + (f"\n{'':<17} fix: {check.fix}" if check.fix and check.status != OK else "")


def format_for_notebook(results) -> str:
    """The terminal's lines (format_check) for `results`, with this checkout shown relative to the working folder, the
    Python environment as <python env> and the home folder as ~, so a stored notebook shows no machine's paths."""
    checkout = resources.checkout_dir()
    places = [(str(checkout), os.path.relpath(checkout))] if checkout is not None else []
    places += [(sys.prefix, "<python env>"), (str(Path.home()), "~")]
    text = "\n".join(format_check(check) for check in results)
    for path, shown in sorted(places, key=lambda p: -len(p[0])):
        text = text.replace(path, shown)
    return text


def main(argv=None) -> int:
    """Command line: print every check; exit status 1 when one fails."""
    parser = argparse.ArgumentParser(prog="python -m qwenvl_lab.doctor", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    print(f"qwenvl-lab doctor: {platform.system()} {platform.machine()}, package at {resources.PACKAGE_DIR}")
    results = run_checks()
    for check in results:
        print(format_check(check))
    failed = [c.name for c in results if c.status == FAIL]
    warned = [c.name for c in results if c.status == WARN]
    if failed:
        print(f"the course cannot run: fix {', '.join(failed)} (see fix: above), then run the doctor again")
        return 1
    print("ready for the course" + (f" (warnings: {', '.join(warned)})" if warned else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
