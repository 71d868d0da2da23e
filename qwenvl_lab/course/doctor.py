"""`python -m qwenvl_lab.course.doctor` — check this machine for the course, before and after installing it.

Two stages, one line per check (ok / warn / fail) with a fix. The first, before installing, needs only the standard
library, so any Python 3.6 or newer runs it in a bare clone: the Python version, venv and ensurepip, make, disk,
memory, and whether the package index and the PyTorch index answer. The second checks the installed course: torch,
the vocabulary, the toy model answering a question, JupyterLab, widgets. The exit status is 1 when a check fails.
This module keeps to Python 3.6's syntax and imports the package only inside the second stage's checks.
"""

import argparse
import configparser
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from importlib import util
from pathlib import Path
from typing import NamedTuple

try:
    from importlib import metadata
except ImportError:  # Python 3.7 and older: only the first stage runs there
    metadata = None

OK, WARN, FAIL = "ok", "warn", "fail"
PYTHON_RANGE = ((3, 11), (3, 13))  # transformers 5.24 needs 3.11; 3.11-3.13 are the versions the course is tested on
PYTHON_TO_GET = "3.12"  # supported, and packaged for every common system
TORCH_VERSION = "2.13.0"  # the Makefile's TORCH_VERSION
TORCH_MIN = (2, 11)  # pyproject.toml: torch>=2.11
TORCH_INDEX_ENV = "TORCH_INDEX"  # the Makefile passes its TORCH_INDEX; empty: PyPI's build (CUDA on Linux)
WHEELHOUSE_ENV = "WHEELHOUSE"  # the Makefile passes its WHEELHOUSE: a folder of wheels (make wheelhouse)
WHEELHOUSE_FOLDER = "wheelhouse"  # in the clone: where make looks for one by default
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # the Makefile's default TORCH_INDEX
PYPI = "https://pypi.org/simple/"
# PyPI's Linux x86_64 torch 2.13.0 with the NVIDIA libraries it pulls in (sizes of the wheels on PyPI, cp312)
CUDA_TORCH_COST = "a CUDA build: 2.7 GB of downloads, 5.6 GB in .venv"
NETWORK_TIMEOUT_S = 5.0
VENV_DISK_GIB = 3.5  # .venv with the CPU torch and the test tools (measured: docs/install.md)
CUDA_VENV_DISK_GIB = 7.5  # .venv with PyPI's CUDA torch
COURSE_DISK_GIB = 1.0  # the notebooks' engines and checkpoints in the output folder take about 0.7 GB
SPARE_DISK_GIB = 3.0
SPARE_MEMORY_GIB = 2.0  # a notebook's kernel (up to 1.5 GiB) and the JupyterLab server
CLONE = Path(__file__).resolve().parents[1]  # the clone's top level when run from one (where .venv goes)
INSTALL_COURSE = 'make setup (or: python -m pip install -e ".[course]")'
TORCH_INSTALL = (
    "make setup (or: python -m pip install torch==2.13.0, adding --index-url "
    "https://download.pytorch.org/whl/cpu on Linux for the CPU build)"
)
TOY_RESTORE = "`git checkout -- data/toy-qwen-vl` restores the shipped toy model in a clone (else reinstall qwenvl_lab)"
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
SAMPLE_PICTURE = "red_circle.png"  # a sample picture the toy model describes exactly (data/images/README.md)
TENSORRT_SERIES = "10.14."  # tensorrt_llm 1.2.1 pins tensorrt~=10.14.1 (pyproject.toml's trtllm extra)
COURSE_PACKAGES = ("torch", "transformers", "jupyterlab")  # none importable: the course is not installed here


class Check(NamedTuple):
    """One check's result: its name, ok / warn / fail, what was found, and what to do when it is not ok."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def _dotted(version) -> str:
    return ".".join(map(str, version))


# the first stage: the standard library only


def get_python_advice(system=None, os_release=None) -> str:
    """How to get a supported Python on this kind of machine (one line)."""
    system, want = system or platform.system(), PYTHON_TO_GET
    if system == "Darwin":
        return f"brew install python@{want} (or the installer from python.org), then: make lab PYTHON=python{want}"
    if system == "Windows":
        return (
            f"py install {want} or winget install Python.Python.{want} (or python.org), then docs/install.md's commands"
        )
    release = _os_release() if os_release is None else os_release
    ids = {release.get("ID", "")} | set(release.get("ID_LIKE", "").split())
    uv = f"uv python install {want}, then: make lab PYTHON=$(uv python find {want})"
    if "ubuntu" in ids:
        return (
            f"Ubuntu: sudo add-apt-repository ppa:deadsnakes/ppa && sudo apt install python{want} python{want}-venv, "
            f"then: make lab PYTHON=python{want}; or {uv}; or pyenv, or conda (environment.yml)"
        )
    return f"{uv}; or pyenv install {want}; or conda (environment.yml); or your distribution's python{want}"


def _os_release() -> dict:
    """/etc/os-release as a dict (empty where there is none)."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: value.strip().strip('"') for key, value in pairs}


def runs_as(command: str, version) -> bool:
    """Whether `command` on PATH starts and is Python `version` (a pyenv shim may exist and refuse to run)."""
    if shutil.which(command) is None:
        return False
    try:
        probe = subprocess.run(
            [command, "-c", "import sys; print(sys.version_info[:2])"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            universal_newlines=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == str(tuple(version))


def other_pythons(runs=runs_as) -> list:
    """The supported `python3.X` commands on PATH that run, newest first."""
    low, high = PYTHON_RANGE
    return [f"python3.{minor}" for minor in range(high[1], low[1] - 1, -1) if runs(f"python3.{minor}", (3, minor))]


def check_python(version_info=sys.version_info, runs=runs_as) -> Check:
    """The interpreter's version against PYTHON_RANGE; outside it, where to find or get a supported one."""
    (low, high), found = PYTHON_RANGE, tuple(version_info[:2])
    version, supported = _dotted(version_info[:3]), f"{_dotted(low)}–{_dotted(high)}"
    if low <= found <= high:
        return Check("python", OK, f"{version} ({sys.executable})")
    why = "older than the course needs" if found < low else "newer than the course was tested on"
    here = other_pythons(runs)
    fix = f"this machine has {here[0]}: make lab PYTHON={here[0]}" if here else f"get Python {supported}: "
    return Check(
        "python", FAIL, f"Python {version} is {why} ({supported})", fix + ("" if here else get_python_advice())
    )


def check_venv(find_spec=util.find_spec) -> Check:
    """The venv module and ensurepip, which `python -m venv` needs to put pip into .venv (Debian splits them off)."""
    missing = [name for name in ("venv", "ensurepip") if find_spec(name) is None]
    if not missing:
        probe = subprocess.run(
            [sys.executable, "-m", "ensurepip", "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            universal_newlines=True,
        )
        if probe.returncode == 0:
            return Check("venv", OK, f"venv and ensurepip ({probe.stdout.strip()})")
        missing = [f"a working ensurepip ({probe.stdout.strip()[-200:]})"]
    minor = "python{}.{}".format(*sys.version_info[:2])
    return Check(
        "venv",
        FAIL,
        f"{minor} cannot create .venv: {' and '.join(missing)} missing",
        f"Debian/Ubuntu: sudo apt install {minor}-venv; elsewhere reinstall Python (python.org)",
    )


def check_make(which=shutil.which, system=None) -> Check:
    """GNU make, which runs the course's commands (Windows has none: docs/install.md gives each command)."""
    found = which("make")
    if found:
        return Check("make", OK, found)
    fix = {
        "Darwin": "xcode-select --install",
        "Windows": "use docs/install.md's commands for Windows (one per make target)",
    }.get(
        system or platform.system(),
        "install make (Debian/Ubuntu: sudo apt install make), or docs/install.md's commands",
    )
    return Check("make", WARN, "no make on PATH", fix)


def _torch_index() -> str:
    return os.environ.get(TORCH_INDEX_ENV, TORCH_CPU_INDEX)


def check_install_disk(folder=CLONE, torch_index=None, disk_usage=shutil.disk_usage) -> Check:
    """Free space where .venv goes (the clone): the environment and the course outputs."""
    torch_index = _torch_index() if torch_index is None else torch_index
    venv_gib = VENV_DISK_GIB if torch_index or platform.system() != "Linux" else CUDA_VENV_DISK_GIB
    free = disk_usage(str(folder)).free
    detail = f"{_gib(free)} free at {folder} (.venv takes about {venv_gib:.1f} GiB, outputs {COURSE_DISK_GIB:.1f} GiB)"
    if free < (venv_gib + COURSE_DISK_GIB) * 2**30:
        return Check("disk", FAIL, detail, "free some space there, or clone the course onto a disk with more room")
    return Check("disk", OK, detail)


def _meminfo() -> dict:
    """Linux's /proc/meminfo in bytes (empty elsewhere)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        match = re.match(r"(\w+):\s+(\d+) kB", line)
        if match:
            found[match.group(1)] = int(match.group(2)) * 1024
    return found


def check_install_memory(meminfo=None) -> Check:
    """Memory available now (Linux) or in all (elsewhere), from the standard library."""
    info = _meminfo() if meminfo is None else meminfo
    if "MemAvailable" in info:
        available = info["MemAvailable"]
        detail = f"{_gib(available)} available of {_gib(info.get('MemTotal', 0))}"
    else:
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            return Check("memory", OK, "unknown before installing (checked again once the course is installed)")
        detail = f"{_gib(available)} in all"
    if available < SPARE_MEMORY_GIB * 2**30:
        return Check(
            "memory",
            WARN,
            detail + " (tight: a notebook's kernel takes up to 1.5 GiB)",
            "close other programs; open one notebook at a time",
        )
    return Check("memory", OK, detail)


def answers(url: str, timeout: float = NETWORK_TIMEOUT_S):
    """None when `url`'s server answers (with any HTTP status), else why not."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "qwenvl-lab-doctor"})
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None  # it answered, with an error status
    except urllib.error.URLError as err:
        if "CERTIFICATE" in str(err.reason).upper():
            return None  # reached; this Python does not trust its certificate (pip may, with its own)
        return str(err.reason) or type(err.reason).__name__
    except (OSError, ValueError) as err:  # timeouts, resets, a malformed URL
        return str(err) or type(err).__name__


def pip_settings(environ=None, files=None) -> dict:
    """pip's index-url and find-links from its configuration files and environment variables (later ones win)."""
    environ = os.environ if environ is None else environ
    if files is None:
        xdg = environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
        home = Path.home()
        files = [Path("/etc/pip.conf")] + [Path(d) / "pip" / "pip.conf" for d in xdg]
        files += [home / ".pip" / "pip.conf", home / ".config" / "pip" / "pip.conf"]
        files += [Path(environ["PIP_CONFIG_FILE"])] if environ.get("PIP_CONFIG_FILE") else []
    found = {"index-url": "", "find-links": []}
    for file in files:
        config = configparser.ConfigParser(interpolation=None)
        try:
            config.read(str(file))
        except configparser.Error:
            continue
        for section in ("global", "install"):
            if config.has_option(section, "index-url"):
                found["index-url"] = config.get(section, "index-url").strip()
            if config.has_option(section, "find-links"):
                found["find-links"] = config.get(section, "find-links").split()
    found["index-url"] = environ.get("PIP_INDEX_URL") or found["index-url"]
    found["find-links"] = environ.get("PIP_FIND_LINKS", "").split() or found["find-links"]
    return found


def local_torch_wheel(build: str, find_links, version_info=sys.version_info, machine=None):
    """A torch wheel of this build for this Python and machine in pip's find-links folders, or None."""
    tag = "cp{}{}".format(*version_info[:2])
    pattern = re.compile(
        rf"torch-{re.escape(TORCH_VERSION)}\+{re.escape(build)}-{tag}-{tag}-.*{machine or platform.machine()}\.whl$"
    )
    for link in find_links:
        folder = Path(link[len("file://") :] if link.startswith("file://") else link)
        if folder.is_dir():
            for wheel in sorted(folder.iterdir()):
                if pattern.match(wheel.name):
                    return wheel
    return None


def wheelhouse(environ=None, clone=CLONE):
    """The wheelhouse make installs from first: $WHEELHOUSE when set, else wheelhouse/ in the clone; None when
    there is none (a named folder that does not exist is returned: the wheelhouse check says so)."""
    environ = os.environ if environ is None else environ
    if environ.get(WHEELHOUSE_ENV):
        return Path(environ[WHEELHOUSE_ENV]).expanduser()
    found = clone / WHEELHOUSE_FOLDER
    return found if found.is_dir() else None


def check_wheelhouse(folder=None, version_info=sys.version_info, machine=None, system=None) -> Check:
    """A wheelhouse, if there is one: its wheels, and whether it holds torch for this Python and machine."""
    folder = wheelhouse() if folder is None else Path(folder)
    if folder is None:
        return Check("wheelhouse", OK, "none (make wheelhouse makes one for a room without fast internet)")
    if not folder.is_dir():
        return Check(
            "wheelhouse", FAIL, f"{folder} is not a folder", "give WHEELHOUSE= the folder that make wheelhouse filled"
        )
    wheels = sorted(p.name for p in folder.glob("*.whl"))
    tag = "cp{}{}".format(*version_info[:2])
    arch = {"AMD64": "amd64", "arm64": "arm64", "aarch64": "aarch64"}.get(machine or platform.machine(), machine)
    torch = [w for w in wheels if w.startswith(f"torch-{TORCH_VERSION}") and f"-{tag}-" in w and (arch or "") in w]
    detail = f"{folder}: {len(wheels)} wheels"
    if not torch:
        return Check(
            "wheelhouse",
            WARN,
            f"{detail}, none of them torch {TORCH_VERSION} for Python {_dotted(version_info[:2])} on "
            f"{system or platform.system()} {machine or platform.machine()}: make downloads it",
            "make wheelhouse on a machine with internet, for this Python and platform (docs/install.md)",
        )
    return Check("wheelhouse", OK, f"{detail}, with {torch[0]}; make installs from it first, with no network")


def check_package_index(probe=answers, settings=None, folder=None) -> Check:
    """The package index pip installs from (PyPI unless pip's configuration names another) answers; unreachable
    beside a wheelhouse, only a warning: make installs from the wheelhouse first."""
    settings = pip_settings() if settings is None else settings
    index = settings["index-url"] or PYPI
    why = probe(index)
    if why is None:
        return Check("index", OK, f"{index} answers")
    folder = wheelhouse() if folder is None else folder
    if folder is not None and folder.is_dir():
        return Check(
            "index",
            WARN,
            f"{index} does not answer ({why}); make installs from the wheelhouse {folder} first",
            "if make then names a missing wheel: connect, or make wheelhouse again with it",
        )
    return Check(
        "index",
        FAIL,
        f"{index} does not answer ({why})",
        "connect to the internet, give pip your network's proxy (https_proxy=…) or index (pip.conf: index-url), or "
        "install from a wheelhouse: make lab WHEELHOUSE=/path (make wheelhouse fills one where there is internet)",
    )


def check_torch_index(probe=answers, settings=None, torch_index=None, system=None, installed=None) -> Check:
    """Linux: the PyTorch index of the CPU build answers, or pip's own sources hold its wheel (find-links, the
    wheelhouse)."""
    torch_index = _torch_index() if torch_index is None else torch_index
    system = system or platform.system()
    if util.find_spec("torch") is not None if installed is None else installed:
        return Check("torch-index", OK, "not needed: torch is installed in this Python")
    if system != "Linux":
        return Check("torch-index", OK, f"not needed: PyPI's torch for {system} is the CPU build")
    if not torch_index:
        return Check("torch-index", OK, f"TORCH_INDEX= (empty): PyPI's torch, {CUDA_TORCH_COST}")
    settings = pip_settings() if settings is None else settings
    build = torch_index.rstrip("/").rsplit("/", 1)[-1]
    folder = wheelhouse()
    wheel = local_torch_wheel(build, settings["find-links"] + ([str(folder)] if folder is not None else []))
    if wheel is not None:
        return Check("torch-index", OK, f"torch {TORCH_VERSION}+{build} from pip's own sources: {wheel}")
    why = probe(torch_index.rstrip("/") + "/torch/")
    if why is None:
        return Check("torch-index", OK, f"{torch_index} answers")
    wheel_name = "torch-{}+{}-cp{}{}-….whl".format(TORCH_VERSION, build, *sys.version_info[:2])
    return Check(
        "torch-index",
        FAIL,
        f"{torch_index} does not answer ({why}): make cannot install torch's {build} build",
        f"make lab WHEELHOUSE=/path installs from a wheelhouse (make wheelhouse fills one where there is internet); "
        f"make lab TORCH_INDEX= installs PyPI's torch instead ({CUDA_TORCH_COST}); "
        f"or put {wheel_name} in a folder named in pip.conf's find-links",
    )


# before installing: all of these; once installed, the second stage's python, disk and memory checks replace theirs
PREFLIGHT = (check_python, check_venv, check_make, check_install_disk, check_install_memory, check_wheelhouse)
NETWORK = (check_package_index, check_torch_index)
REPLACED_ONCE_INSTALLED = (check_python, check_install_disk, check_install_memory, check_torch_index, check_wheelhouse)


# the second stage: the installed course


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
        from ..tokenizing import QWEN_TIKTOKEN_SHA256, VOCAB_RESTORE, load_tokenizer
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
        from .. import resources
        from ..checkpoint import load_config
        from ..tokenizing import load_tokenizer
        from ..toy import CHECKPOINT_ENV, TOY_DIR, default_checkpoint_dir, load_toy_model
        from ..toy.evaluate import ask
        from ..toy.make_samples import SAMPLES
        from ..toy.shapes import describe, question
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
    from .. import resources

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
    """TensorRT (visual plans) and TensorRT-LLM (engines), optional: GPU machines only; a TensorRT other than the one
    tensorrt_llm 1.2.1 pins cannot load the plans that environment builds."""
    found = {}
    for name in ("tensorrt", "tensorrt_llm"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if not found:
        return Check(
            "tensorrt", OK, "not installed (optional: NVIDIA GPU machines, docs/tensorrt.md and `make trtllm`)"
        )
    detail = ", ".join(f"{name} {version}" for name, version in found.items())
    if "tensorrt" in found and not found["tensorrt"].startswith(TENSORRT_SERIES):
        return Check(
            "tensorrt",
            WARN,
            f"{detail}: a vision plan loads only in the TensorRT that built it, and tensorrt_llm 1.2.1 builds with "
            f"tensorrt {TENSORRT_SERIES}x",
            'python -m pip install -e ".[trtllm]" (tensorrt~=10.14.1)',
        )
    return Check("tensorrt", OK, detail)


def check_cjk_font() -> Check:
    """A CJK font for the Chinese in the figures: the machine's, else only the course's own subset (fonts.py)."""
    from .. import fonts

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


def run_checks(checks=None) -> list:
    """Run every check (default CHECKS: the installed course's); one that raises becomes a failed check naming the
    error."""
    results = []
    for check in CHECKS if checks is None else checks:
        try:
            results.append(check())
        except Exception as err:  # a broken check must not hide the others
            name = check.__name__[len("check_") :] if check.__name__.startswith("check_") else check.__name__
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


def course_installed(find_spec=util.find_spec) -> bool:
    """Whether any of the course's main packages is importable here (else only the first stage runs)."""
    return any(find_spec(name) is not None for name in COURSE_PACKAGES)


def format_for_notebook(results) -> str:
    """The terminal's lines (format_check) for `results`, with this checkout shown relative to the working folder, the
    Python environment as <python env> and the home folder as ~, so a stored notebook shows no machine's paths."""
    from .. import resources  # the package, imported only where the installed checks need it (module docstring)

    checkout = resources.checkout_dir()
    places = [(str(checkout), os.path.relpath(checkout))] if checkout is not None else []
    places += [(sys.prefix, "<python env>"), (str(Path.home()), "~")]
    text = "\n".join(format_check(check) for check in results)
    for path, shown in sorted(places, key=lambda p: -len(p[0])):
        text = text.replace(path, shown)
    return text


def parser() -> argparse.ArgumentParser:
    """`qwenvl-lab doctor`'s options (argparse alone: the doctor runs before anything is installed)."""
    parser = argparse.ArgumentParser(prog="qwenvl-lab doctor", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--before-install",
        action="store_true",
        help="only the first stage (standard library), as `make lab` runs it before it creates .venv",
    )
    parser.add_argument("--no-network", action="store_true", help="skip the checks of the package indexes")
    return parser


def main(argv=None) -> int:
    """Command line: print every check; exit status 1 when one fails."""
    args = parser().parse_args(argv)
    version = _dotted(sys.version_info[:3])
    print(f"qwenvl-lab doctor: {platform.system()} {platform.machine()}, Python {version} at {sys.executable}")
    installed = not args.before_install and course_installed()
    first = [c for c in PREFLIGHT + (() if args.no_network else NETWORK)]
    if installed:
        first = [c for c in first if c not in REPLACED_ONCE_INSTALLED]
    print("the machine (standard library only):")
    results = run_checks(first)
    for check in results:
        print(format_check(check))
    if installed:
        print("the installed course:")
        results += run_checks()
        for check in results[len(first) :]:
            print(format_check(check))
    failed = [c.name for c in results if c.status == FAIL]
    warned = [c.name for c in results if c.status == WARN]
    warnings = f" (warnings: {', '.join(warned)})" if warned else ""
    if failed:
        print(f"the course cannot run: fix {', '.join(failed)} (see fix: above), then run the doctor again")
        return 1
    if not installed:
        print(f"ready to install{warnings}: make lab (or docs/install.md); then the doctor checks the installed course")
        return 0
    print("ready for the course" + warnings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
