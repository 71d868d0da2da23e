"""Notebook 05 — building the engine: the limits fixed once, the LM in TensorRT-LLM's layout, the vision tower beside.

An engine directory holds config.json (the limits and the model), llm/ (a TensorRT-LLM unified checkpoint), vision/
(the vision tower), qwen.tiktoken when the checkpoint has one, and manifest.json, written last, with every file's size
and sha256 checksums. A build writes through `files.writing_folder`: into a staging folder beside the engine directory,
renamed into place only when complete, so a failed or killed build leaves the previous engine exactly as it was. It
holds a lock file beside the engine directory meanwhile, so a second build of the same directory is refused, and it
replaces only a directory holding nothing but an engine of this package. Loading opens the engine once
(`EngineFiles`) and checks every file it reads against the manifest: a rebuild meanwhile cannot mix two builds.
"""

import hashlib
import json
import math
import os
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, fields
from importlib import metadata
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import files
from ..checkpoint import check_state_dict, load_config, load_visual_tower, vision_tower_from
from ..checks.values import check_model_limits, check_path, is_int
from ..files import MARK, CheckpointError, field, read_json
from ..limits import BuildConfig, device_memory, engine_memory, memory_text
from ..modeling import QWenLMHeadModel
from ..tokenizing import VOCAB_FILE_NAME
from ..unified_checkpoint import (
    check_trtllm_config,
    convert_to_trtllm_checkpoint,
    is_quantized,
    scale_name,
    trtllm_config,
)
from ..vision import VisionTransformer

ENGINE_VERSION = "qwenvl-lab-engine/2"
LLM_DIR, VISION_DIR = "llm", "vision"  # TensorRT-LLM's multimodal layout: engine_dir/llm and engine_dir/vision
RANK0 = "rank0.safetensors"
MANIFEST = "manifest.json"  # written last: its presence marks a complete engine of this package
TUNING_FILE = "tuning.json"  # beside an engine: the decode kernels' tuned choices, per GPU and Triton version
BUILT = frozenset(  # every file a build writes (qwen.tiktoken and generation_config.json when the checkpoint has them)
    {
        "config.json",
        f"{LLM_DIR}/config.json",
        f"{LLM_DIR}/{RANK0}",
        f"{VISION_DIR}/config.json",
        f"{VISION_DIR}/model.safetensors",
        VOCAB_FILE_NAME,
        "generation_config.json",
        MANIFEST,
        TUNING_FILE,  # written later by the runner
        MARK,  # written with the folder: the files the build wrote (files.MARK)
        f"{LLM_DIR}/{MARK}",  # and with llm/, a TensorRT-LLM checkpoint of its own
    }
)
LOADED = (  # the files a load reads: each must be in the manifest (a vocabulary or sampling defaults when present)
    "config.json",
    f"{LLM_DIR}/config.json",
    f"{LLM_DIR}/{RANK0}",
    f"{VISION_DIR}/config.json",
    f"{VISION_DIR}/model.safetensors",
)
OS_FILES = files.DISPOSABLE  # what a file browser leaves in a folder it showed
ENGINE_WRITER = files.writer("engine", "an engine directory")
CHUNK_BYTES = 64 * 2**20  # files are checksummed in chunks of this size: hashed in parallel, sampled by verify="quick"
VERIFY = ("full", "quick", "none")
REBUILD = "rebuild it with build_engine(checkpoint_dir, engine_dir, build_config, overwrite=True)"


def package_version() -> str:
    """The installed qwenvl_lab's version (recorded in every engine it builds)."""
    try:
        return metadata.version("qwenvl_lab")
    except metadata.PackageNotFoundError:
        return "unknown"


def expected_weights(pretrained_config: dict) -> dict[str, tuple[int, ...]]:
    """The engine's LM weights, by TensorRT-LLM name, with their shapes (a weight-only engine: each quantized matrix's
    per_channel_scale too)."""
    hidden, vocab = pretrained_config["hidden_size"], pretrained_config["vocab_size"]
    proj = pretrained_config["num_attention_heads"] * pretrained_config["head_size"]
    ffn = pretrained_config["intermediate_size"] // 2  # Qwen v1 stores twice the MLP width
    shapes = {
        "transformer.vocab_embedding.weight": (vocab, hidden),
        "transformer.ln_f.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for layer in range(pretrained_config["num_hidden_layers"]):
        prefix = f"transformer.layers.{layer}."
        shapes.update(
            {
                prefix + "input_layernorm.weight": (hidden,),
                prefix + "attention.qkv.weight": (3 * proj, hidden),
                prefix + "attention.qkv.bias": (3 * proj,),
                prefix + "attention.dense.weight": (hidden, proj),
                prefix + "post_layernorm.weight": (hidden,),
                prefix + "mlp.gate.weight": (ffn, hidden),
                prefix + "mlp.fc.weight": (ffn, hidden),
                prefix + "mlp.proj.weight": (hidden, ffn),
            }
        )
    if (pretrained_config.get("quantization") or {}).get("quant_algo") is not None:
        shapes.update({scale_name(name): shape[:1] for name, shape in shapes.items() if is_quantized(name)})
    return shapes


def check_engine_weights(weights: dict, pretrained_config: dict) -> None:
    """Raise a CheckpointError naming missing, unexpected or mis-shaped engine weights."""
    check_state_dict(
        weights,
        {name: torch.empty(shape, device="meta") for name, shape in expected_weights(pretrained_config).items()},
    )


def _engine_path(engine_dir: Path) -> Path:
    """Where the engine goes: the absolute directory, a symbolic link's target; refused when building there would
    pull the current directory away or the link points nowhere."""
    target = engine_dir.resolve()
    if engine_dir.is_symlink() and not target.exists():
        raise FileNotFoundError(
            f"{engine_dir} is a symbolic link to {target}, which does not exist: create that directory first "
            "(the engine is written where the link points) or give another directory"
        )
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise ValueError(
            f"{engine_dir} is the current directory or a folder around it ({target}): a build replaces its engine "
            "directory whole, which would pull the folder from under you: give a new directory, e.g. ./engine"
        )
    return target


def _listing(entries: list[str]) -> str:
    return ", ".join(entries[:8]) + (" …" if len(entries) > 8 else "")


def _not_built(engine_dir: Path, most: int = 9) -> list[str]:
    """Up to `most` entries of an engine directory that no build wrote: other files, links, empty folders (with /);
    a staging folder the runner's writer left (marked as the package's) does not count."""
    found = []
    for root, dirs, names in os.walk(engine_dir):
        here = Path(root).relative_to(engine_dir)
        links = sorted(d for d in dirs if os.path.islink(os.path.join(root, d)))
        staged = {d for d in dirs if d not in links and (files.read_mark(Path(root, d)) or {}).get("staging")}
        for name in sorted(names) + links:
            if name in OS_FILES and not os.path.islink(os.path.join(root, name)):
                continue
            if (here / name).as_posix() not in BUILT or os.path.islink(os.path.join(root, name)):
                found.append((here / name).as_posix())
        dirs[:] = sorted(d for d in dirs if d not in links and d not in staged)
        if here.as_posix() not in (".", LLM_DIR, VISION_DIR) and not set(names) - OS_FILES and not dirs:
            found.append(here.as_posix() + "/")
        if len(found) >= most:
            break
    return sorted(found)[:most]


def _is_engine(engine_dir: Path) -> bool:
    """True when the directory's manifest.json (or, for engines without one, config.json) says, by its content, that
    a build of this package wrote it."""
    for name, key in ((MANIFEST, "format"), ("config.json", "version")):
        try:
            if str(json.loads((engine_dir / name).read_text()).get(key, "")).startswith("qwenvl-lab-engine/"):
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _check_target(checkpoint_dir: Path, engine_dir: Path, target: Path, overwrite: bool) -> None:
    """Refuse an engine directory (`target`: where it leads) that is the checkpoint (or inside or around it), holds
    anything but an engine of this package, or holds an engine without overwrite=True."""
    ckpt = checkpoint_dir.resolve()
    if target == ckpt or ckpt in target.parents or target in ckpt.parents:
        raise ValueError(
            f"the engine directory {engine_dir} is the checkpoint directory {checkpoint_dir}, inside it "
            "or around it: building there would overwrite the checkpoint. Give a separate directory"
        )
    if not target.exists():
        return
    if not target.is_dir():
        raise NotADirectoryError(f"{engine_dir} is a file; give a directory for the engine")
    entries = sorted(p.name for p in target.iterdir())
    if not entries:
        return
    if not _is_engine(target):
        if "config.json" in entries and MANIFEST not in entries:
            raise FileExistsError(
                f"{engine_dir} holds a config.json that is not an engine of this package: refusing to "
                "write an engine over it. Give a new or empty directory"
            )
        raise FileExistsError(
            f"{engine_dir} is not empty and holds no engine of this package ({_listing(entries)}): refusing to "
            "write an engine over it. Give a new or empty directory"
        )
    others = _not_built(target)
    if others:
        raise FileExistsError(
            f"{engine_dir} holds files the engine builder did not write ({_listing(others)}): move them out, or "
            "give another directory; nothing was changed"
        )
    if not overwrite:
        raise FileExistsError(
            f"{engine_dir} already holds an engine: pass overwrite=True to replace it "
            "(`--overwrite` on the command line), or give another directory"
        )


def _made_by_build(engine_dir: Path) -> dict | None:
    """The files a build wrote in `engine_dir` ({file: [bytes, …]}): its mark's list, or for an engine built before
    marks, its manifest's (the manifest names the package's format: a mark of its own)."""
    listed = files.made_files(engine_dir)
    if listed is not None or not _is_engine(engine_dir):
        return listed
    try:
        manifest = json.loads((engine_dir / MANIFEST).read_text())
        listed = {name: [entry["bytes"]] for name, entry in manifest["files"].items() if ".." not in name}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        listed = {}
    return {**listed, MANIFEST: [(engine_dir / MANIFEST).stat().st_size], "config.json": []}


def _chunk_sha256(path: Path, chunk: int, k: int) -> str:
    """sha256 of bytes [k·chunk, (k+1)·chunk) of a file."""
    digest, left = hashlib.sha256(), chunk
    with open(path, "rb") as f:
        f.seek(k * chunk)
        while left and (block := f.read(min(left, 4 * 2**20))):
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _checksums(local, chunks: dict[str, list[int]], chunk: int) -> dict[str, list[str]]:
    """{file: sha256 of each listed chunk}, each file read at `local(file)`, hashed on every core (hashlib releases the
    GIL)."""
    jobs = [(name, k) for name, ks in chunks.items() for k in ks]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(lambda job: _chunk_sha256(local(job[0]), chunk, job[1]), jobs))
    out = {name: [] for name in chunks}
    for (name, _), digest in zip(jobs, digests):
        out[name].append(digest)
    return out


def _chunk_count(size: int, chunk: int) -> int:
    return max(1, -(-size // chunk))


def _write_manifest(staging: Path, build_config: BuildConfig) -> None:
    """manifest.json: the format, the package version, the build config, every file's size and chunk checksums."""
    sizes = {
        p.relative_to(staging).as_posix(): p.stat().st_size
        for p in sorted(staging.rglob("*"))
        if p.is_file() and p.name != MARK
    }
    chunks = {n: list(range(_chunk_count(b, CHUNK_BYTES))) for n, b in sizes.items()}
    sums = _checksums(lambda name: staging / name, chunks, CHUNK_BYTES)
    manifest = {
        "format": ENGINE_VERSION,
        "package_version": package_version(),
        "build_config": asdict(build_config),
        "chunk_bytes": CHUNK_BYTES,
        "files": {name: {"bytes": size, "sha256": sums[name]} for name, size in sizes.items()},
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def engine_bytes(hf_config, dtype) -> int:
    """About how many bytes an engine of the checkpoint `hf_config` takes on the disk in `dtype`: every weight (the
    language model's and the vision tower's) at that dtype's size, plus room for the vocabulary and the configs."""
    with torch.device("meta"):
        count = sum(t.numel() for t in QWenLMHeadModel(hf_config).state_dict().values())
    return count * torch.empty((), dtype=dtype).element_size() + 8 * 2**20


def _check_memory_at_build(build_config: BuildConfig, pretrained: dict) -> None:
    """Warn, before building, when the KV cache and weights the limits ask for exceed this machine's memory (the
    engine may be meant for a larger one: its load refuses what does not fit)."""
    need = engine_memory(build_config, pretrained, sum(math.prod(s) for s in expected_weights(pretrained).values()))
    has = device_memory("cpu")
    if has is not None and sum(need.values()) > has[1]:
        warnings.warn(
            f"these limits ask for {files.size_text(sum(need.values()))} where the engine loads: "
            f"{memory_text(build_config, pretrained, need)}; this machine has {files.size_text(has[1])} of memory "
            f"({files.size_text(has[0])} available), so it cannot load the engine: lower --max-batch-size, "
            "--max-seq-len or --max-beam-width unless it is meant for a larger machine",
            stacklevel=3,
        )


def build_engine(checkpoint_dir, output_dir, build_config: BuildConfig, overwrite: bool = False) -> Path:
    """Write an engine directory: config.json (version, limits, model), llm/ (TensorRT-LLM checkpoint), vision/.

    The directory must be new, empty, or (with overwrite=True) an earlier engine of this package and nothing else; it
    is replaced only once the new engine is complete. A symbolic link is followed: the engine goes where it points.
    """
    if not isinstance(build_config, BuildConfig):
        raise TypeError(f"build_config must be a BuildConfig, got {type(build_config).__name__}")
    checkpoint_dir, engine_dir = check_path("checkpoint_dir", checkpoint_dir), check_path("output_dir", output_dir)
    hf_config = load_config(checkpoint_dir)
    pretrained = trtllm_config(hf_config, build_config.dtype, weight_only=build_config.weight_only)
    check_model_limits(build_config, pretrained["max_position_embeddings"], pretrained["seq_length"])
    _check_memory_at_build(build_config, pretrained)
    target = _engine_path(engine_dir)
    _check_target(checkpoint_dir, engine_dir, target, overwrite)
    lock = target.parent / f".{target.name}.lock"
    try:
        files.make_folder(target.parent, parents=True)
        with FileLock(lock, timeout=0):
            with files.writing_folder(
                engine_dir,
                ENGINE_WRITER,
                overwrite=overwrite,
                need_bytes=engine_bytes(hf_config, build_config.torch_dtype),
                allow=lambda folder, replace: _check_target(checkpoint_dir, engine_dir, folder, replace),
                made=_made_by_build,
                also=(TUNING_FILE,),
            ) as staging:
                _build_into(staging, checkpoint_dir, hf_config, pretrained, build_config)
    except Timeout:
        if not lock.exists():  # the lock file could not even be made: the folder takes no files
            raise files.NotWritableError(
                13, f"cannot write {engine_dir} in {target.parent}: give a directory you can write to"
            ) from None
        raise FileExistsError(
            f"another build is writing {engine_dir} now: wait for it to finish, then use that engine (or build "
            "into another directory)"
        ) from None
    except PermissionError as err:
        if isinstance(err, files.WriteError):
            raise
        raise files.NotWritableError(
            13, f"cannot write {engine_dir} in {target.parent} (permission denied): give a directory you can write to"
        ) from None
    return engine_dir


def _build_into(staging: Path, checkpoint_dir: Path, hf_config, pretrained, build_config) -> None:
    """Write the engine into `staging`: the language model, the vision tower, the tokenizer and sampling defaults, the
    config and the manifest (last)."""
    convert_to_trtllm_checkpoint(
        checkpoint_dir, staging / LLM_DIR, build_config.dtype, weight_only=build_config.weight_only
    )
    tower = load_visual_tower(checkpoint_dir, build_config.torch_dtype)
    (staging / VISION_DIR).mkdir()
    save_file(
        {k: v.contiguous() for k, v in tower.state_dict().items()}, str(staging / VISION_DIR / "model.safetensors")
    )
    (staging / VISION_DIR / "config.json").write_text(
        json.dumps({"visual": hf_config.visual, "dtype": build_config.dtype}, indent=2) + "\n"
    )
    for name in (VOCAB_FILE_NAME, "generation_config.json"):  # the chat's tokenizer and sampling defaults
        if (checkpoint_dir / name).is_file():
            shutil.copyfile(checkpoint_dir / name, staging / name)
    config = {"version": ENGINE_VERSION, "build_config": asdict(build_config), "pretrained_config": pretrained}
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_manifest(staging, build_config)


class EngineFiles:
    """An engine directory opened once for a load: every file read through `local(name)` comes from the same build,
    even while another process rebuilds the directory with overwrite=True (which renames a new one into its place).

    On Linux the directory and each file the load reads are opened at once and read through their descriptors
    (/proc/self/fd), so a rebuild meanwhile changes nothing that is read; elsewhere the files are read by path and
    `close()` refuses the load when the directory was replaced during it.
    """

    def __init__(self, engine_dir):
        self.path = check_path("engine_dir", engine_dir)  # the user's path: every message names it
        if not self.path.is_dir():
            raise FileNotFoundError(
                f"engine directory {str(self.path)!r} not found; build the engine first with build_engine(...)"
            )
        self._identity = _identity(self.path)
        self._fds: dict[str, int] = {}
        self._directory = None
        self.manifest_sha256 = None  # set when the manifest is read: which build this is
        if not (os.open in os.supports_dir_fd and os.path.isdir("/proc/self/fd")):
            return
        for _ in range(3):  # a rebuild's swap can pass while the files are opened: then they are opened again
            if self._open_all():
                return
            self._close_fds()
        raise CheckpointError(f"{self.path} was rebuilt three times while it was opened: load it again")

    def _open_all(self) -> bool:
        """Open the directory and every file a load reads (what is absent stays absent); False when the directory was
        replaced meanwhile (a file may then be missing because the old build was being deleted)."""
        directory = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        self._directory = directory
        for name in sorted(BUILT - {MARK, TUNING_FILE}):
            try:
                self._fds[name] = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=directory)
            except OSError:
                continue  # absent, or a link or a folder where a file goes: refused as such by the checks
        info = os.fstat(directory)
        return (info.st_dev, info.st_ino) == _identity(self.path)

    def local(self, name: str) -> Path:
        """A path that reads the engine's file `name` of this load's build."""
        fd = self._fds.get(name)
        return Path(f"/proc/self/fd/{fd}") if fd is not None else self.path / name

    def exists(self, name: str) -> bool:
        """True when the engine holds the file `name` (as this load sees it)."""
        if self._directory is not None:
            return name in self._fds
        return (self.path / name).is_file()

    def read_json(self, name: str, fix: str) -> dict:
        """The JSON object in the engine's file `name`, refused as read_json refuses, naming the user's path."""
        if not self.exists(name):
            raise FileNotFoundError(f"{str(self.path / name)!r} not found; {fix}")
        try:
            return read_json(self.local(name), fix)
        except CheckpointError as err:
            raise CheckpointError(str(err).replace(str(self.local(name)), str(self.path / name))) from None

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        if self._directory is not None:
            os.close(self._directory)
        self._fds, self._directory = {}, None

    def close(self) -> None:
        """Let go of the engine; where files were read by path, refuse the load if the directory was replaced."""
        opened = self._directory is not None
        self._close_fds()
        if not opened and _identity(self.path) != self._identity:
            raise CheckpointError(
                f"{self.path} was rebuilt while it loaded, so the load may mix two builds: load it again"
            )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self._close_fds()


def _identity(path: Path):
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino


@contextmanager
def open_engine(engine_dir):
    """`engine_dir` opened for one load, closed after it (an EngineFiles given is used as it is, and left open)."""
    if isinstance(engine_dir, EngineFiles):
        yield engine_dir
        return
    with EngineFiles(engine_dir) as engine:
        yield engine


def _read_manifest(engine: EngineFiles) -> dict:
    """manifest.json of an engine directory, checked to be one this version of the package wrote, to list every file
    a load reads and nothing outside the engine."""
    manifest_file = engine.path / MANIFEST
    if not engine.exists(MANIFEST):
        raise CheckpointError(
            f"{engine.path} has no {MANIFEST}: the build did not finish, or the directory was not "
            f"made by build_engine; {REBUILD}"
        )
    manifest = engine.read_json(MANIFEST, REBUILD)
    engine.manifest_sha256 = hashlib.sha256(engine.local(MANIFEST).read_bytes()).hexdigest()
    if manifest.get("format") != ENGINE_VERSION or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(
            f"{manifest_file} describes engine format {manifest.get('format')!r}, this package reads "
            f"{ENGINE_VERSION!r}; {REBUILD}"
        )
    if manifest.get("package_version") != package_version():
        raise CheckpointError(
            f"{engine.path} was built by qwenvl_lab {manifest.get('package_version')!r}, this is "
            f"{package_version()!r}; {REBUILD}"
        )
    chunk = manifest.get("chunk_bytes")
    if not is_int(chunk) or chunk < 1:
        raise CheckpointError(f"{manifest_file} records no checksums of the engine's files (an older build); {REBUILD}")
    outside = [name for name in manifest["files"] if name not in BUILT]
    if outside:
        raise CheckpointError(
            f"{manifest_file} lists {_listing(sorted(map(repr, outside)))}, which no build writes (a path outside "
            f"the engine, or a file it does not read): the manifest was changed; {REBUILD}"
        )
    read = [*LOADED, *(name for name in (VOCAB_FILE_NAME, "generation_config.json") if engine.exists(name))]
    left_out = [name for name in read if name not in manifest["files"]]
    if left_out:
        raise CheckpointError(
            f"{manifest_file} leaves out {_listing(left_out)}, which a load reads: its checksums cannot be checked; "
            f"{REBUILD}"
        )
    return manifest


def _check_files(engine: EngineFiles, manifest: dict, verify: str, under: str = "") -> None:
    """Refuse an engine whose files (those under `under`) differ from its manifest: an interrupted build, a damaged
    copy, a file changed in place. verify="full" reads every byte, "quick" every byte of files up to two chunks and
    the first and last chunk of larger ones, "none" only the sizes."""
    if verify not in VERIFY:
        raise ValueError(f"verify must be 'full', 'quick' or 'none', got {verify!r}")
    listed = {name: entry for name, entry in manifest["files"].items() if name.startswith(under)}
    chunks = {}
    for name, expected in listed.items():
        path = engine.path / name
        if not isinstance(expected, dict) or not engine.exists(name) or os.path.islink(path):
            raise CheckpointError(f"{path} is missing: the engine is incomplete; {REBUILD}")
        size, sums = engine.local(name).stat().st_size, expected.get("sha256")
        if size != expected.get("bytes"):
            raise CheckpointError(
                f"{path} has {size} bytes, the build wrote {expected.get('bytes')}: the engine is damaged; {REBUILD}"
            )
        n = _chunk_count(size, manifest["chunk_bytes"])
        if not isinstance(sums, list) or len(sums) != n:
            raise CheckpointError(f"{engine.path / MANIFEST} has no checksums of {name}; {REBUILD}")
        if verify != "none":
            chunks[name] = list(range(n)) if verify == "full" or n <= 2 else [0, n - 1]
    found = _checksums(engine.local, chunks, manifest["chunk_bytes"]) if chunks else {}
    for name, ks in chunks.items():
        if any(listed[name]["sha256"][k] != digest for k, digest in zip(ks, found[name])):
            raise CheckpointError(f"{engine.path / name} was changed after the build (its checksum differs); {REBUILD}")


def verify_engine(engine_dir, verify: str = "full") -> None:
    """Check every file of an engine directory against its manifest (sizes, and checksums as `verify` says), on
    demand: e.g. after loading it with verify="quick"."""
    with open_engine(engine_dir) as engine:
        _check_files(engine, _read_manifest(engine), verify)


def load_engine_config(engine_dir, verify: str = "full") -> tuple[BuildConfig, dict]:
    """(BuildConfig, pretrained_config) of an engine directory, checked complete, unchanged since its build (every
    file's sha256 with verify="full"; see `verify_engine`) and readable by this version."""
    with open_engine(engine_dir) as engine:
        return _engine_config(engine, verify)


def _engine_config(engine: EngineFiles, verify: str) -> tuple[BuildConfig, dict]:
    config_file = engine.path / "config.json"
    config = engine.read_json("config.json", f"build the engine first with build_engine(...), or {REBUILD}")
    if config.get("version") != ENGINE_VERSION:
        raise CheckpointError(
            f"{engine.path} holds engine version {config.get('version')!r}, this package reads "
            f"{ENGINE_VERSION!r}; {REBUILD}"
        )
    manifest = _read_manifest(engine)
    if manifest.get("build_config") != config.get("build_config"):
        raise CheckpointError(
            f"{engine.path}: config.json's build_config differs from the one the engine was built "
            f"with ({MANIFEST}); {REBUILD}"
        )
    _check_files(engine, manifest, verify)
    stored = field(config, "build_config", "dict", config_file, REBUILD)
    names = {f.name for f in fields(BuildConfig)}
    missing, unknown = sorted(names - set(stored)), sorted(set(stored) - names)
    if missing or unknown:
        raise CheckpointError(
            f"{config_file}: build_config {'lacks ' + str(missing) if missing else ''}"
            f"{' and ' if missing and unknown else ''}{'has unknown ' + str(unknown) if unknown else ''}"
            f"; {REBUILD}"
        )
    try:
        build_config = BuildConfig(**stored)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{config_file}: {err}; {REBUILD}") from None
    llm_config = engine.read_json(f"{LLM_DIR}/config.json", REBUILD)
    pretrained = check_trtllm_config(llm_config, engine.path / LLM_DIR)
    if pretrained["mapping"]["tp_size"] != 1:
        raise CheckpointError(
            f"{engine.path / LLM_DIR}: an engine of this package holds one rank (tp_size 1); {REBUILD}"
        )
    return build_config, pretrained  # the limits are checked against it where it runs


def load_engine_weights(engine_dir) -> dict[str, torch.Tensor]:
    """The LM weights of an engine directory, by TensorRT-LLM name (read from the build `engine_dir` was opened on)."""
    with open_engine(engine_dir) as engine:
        path = engine.path / LLM_DIR / RANK0
        try:
            return load_file(str(engine.local(f"{LLM_DIR}/{RANK0}")))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{path} cannot be read as safetensors ({err}); {REBUILD}") from None


def load_engine_vision_tower(
    engine_dir, device="cpu", verify: str = "full", build: str | None = None
) -> VisionTransformer:
    """The engine's vision part: VisionTransformer from vision/config.json and vision/model.safetensors, checked
    against the engine's manifest (`verify` as in load_engine_config) and, given `build` (a runner's manifest_sha256),
    refused unless it is of that same build."""
    with open_engine(engine_dir) as engine:
        manifest = _read_manifest(engine)
        if build is not None and engine.manifest_sha256 != build:
            raise CheckpointError(
                f"{engine.path} was rebuilt after its language model was loaded: its vision part is of another build; "
                "load the engine again (QWenInfer.from_dir)"
            )
        _check_files(engine, manifest, verify, under=VISION_DIR + "/")
        vision_config = engine.path / VISION_DIR / "config.json"
        visual = field(
            engine.read_json(f"{VISION_DIR}/config.json", f"this engine has no vision part; {REBUILD}"),
            "visual",
            "dict",
            vision_config,
            REBUILD,
        )
        try:
            state = load_file(str(engine.local(f"{VISION_DIR}/model.safetensors")))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(
                f"{engine.path / VISION_DIR / 'model.safetensors'} cannot be read ({err}); {REBUILD}"
            ) from None
    return vision_tower_from(visual, state).to(device)
