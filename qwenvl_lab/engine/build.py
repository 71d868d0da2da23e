"""Notebook 05 — building the engine: the limits fixed once, the LM in TensorRT-LLM's layout, the vision tower beside.

An engine directory holds config.json (the limits and the model), llm/ (a TensorRT-LLM unified checkpoint), vision/
(the vision tower), qwen.tiktoken when the checkpoint has one, and manifest.json, written last, with every file's size
and sha256 checksums. A build writes into a temporary directory beside the engine directory and renames it into place
only when complete, so a failed or killed build leaves the previous engine exactly as it was. It holds a lock file
beside the engine directory meanwhile, so a second build of the same directory is refused, and it replaces only a
directory holding nothing but an engine of this package. Loading checks every file against the manifest.
"""

import errno
import hashlib
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from importlib import metadata
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..checkpoint import check_state_dict, load_config, load_visual_tower, vision_tower_from
from ..checks.values import check_model_limits, is_int
from ..files import CheckpointError, field, put_in_place, read_json, sibling_name
from ..limits import BuildConfig
from ..tokenizing import VOCAB_FILE_NAME
from ..unified_checkpoint import (
    convert_to_trtllm_checkpoint,
    is_quantized,
    read_trtllm_config,
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
        TUNING_FILE + ".tmp",
    }
)
OS_FILES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})  # what a file browser leaves in a folder it showed
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
    """Up to `most` entries of an engine directory that no build wrote: other files, links, empty folders (with /)."""
    found = []
    for root, dirs, files in os.walk(engine_dir):
        here = Path(root).relative_to(engine_dir)
        links = sorted(d for d in dirs if os.path.islink(os.path.join(root, d)))
        for name in sorted(files) + links:
            if name in OS_FILES and not os.path.islink(os.path.join(root, name)):
                continue
            if (here / name).as_posix() not in BUILT or os.path.islink(os.path.join(root, name)):
                found.append((here / name).as_posix())
        dirs[:] = sorted(d for d in dirs if d not in links)
        if here.as_posix() not in (".", LLM_DIR, VISION_DIR) and not set(files) - OS_FILES and not dirs:
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


def _chunk_sha256(path: Path, chunk: int, k: int) -> str:
    """sha256 of bytes [k·chunk, (k+1)·chunk) of a file."""
    digest, left = hashlib.sha256(), chunk
    with open(path, "rb") as f:
        f.seek(k * chunk)
        while left and (block := f.read(min(left, 4 * 2**20))):
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _checksums(engine_dir: Path, chunks: dict[str, list[int]], chunk: int) -> dict[str, list[str]]:
    """{file: sha256 of each listed chunk}, hashed on every core (hashlib releases the GIL)."""
    jobs = [(name, k) for name, ks in chunks.items() for k in ks]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(lambda job: _chunk_sha256(engine_dir / job[0], chunk, job[1]), jobs))
    out = {name: [] for name in chunks}
    for (name, _), digest in zip(jobs, digests):
        out[name].append(digest)
    return out


def _chunk_count(size: int, chunk: int) -> int:
    return max(1, -(-size // chunk))


def _write_manifest(engine_dir: Path, build_config: BuildConfig) -> None:
    """manifest.json: the format, the package version, the build config, every file's size and chunk checksums."""
    sizes = {
        p.relative_to(engine_dir).as_posix(): p.stat().st_size for p in sorted(engine_dir.rglob("*")) if p.is_file()
    }
    sums = _checksums(engine_dir, {n: list(range(_chunk_count(b, CHUNK_BYTES))) for n, b in sizes.items()}, CHUNK_BYTES)
    manifest = {
        "format": ENGINE_VERSION,
        "package_version": package_version(),
        "build_config": asdict(build_config),
        "chunk_bytes": CHUNK_BYTES,
        "files": {name: {"bytes": size, "sha256": sums[name]} for name, size in sizes.items()},
    }
    (engine_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _remove_leftovers(target: Path) -> None:
    """Delete the temporary siblings that killed builds of this engine directory left (run under its lock: no build
    of it is running; a sibling's, such as `.e.v2.….tmp` beside `.e.….tmp`, never matches)."""
    own = re.compile(rf"\.{re.escape(target.name)}\.[^.]+\.tmp")
    for stale in target.parent.iterdir():
        if own.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)


def _write_error(err: Exception, folder: Path):
    """A one-line OSError for a full disk or a folder one cannot write in, or None for any other error."""
    code = getattr(err, "errno", None)
    if code is None:  # safetensors reports the OS error in its message
        found = re.search(r"os error (\d+)|code: (\d+)", str(err))
        code = int(found[1] or found[2]) if found else None
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return OSError(f"no space left on the device of {folder}: free some space, then build again")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason = "a read-only file system" if code == errno.EROFS else "permission denied"
        return PermissionError(f"cannot write in {folder} ({reason}): build into a directory you can write to")
    return None


def build_engine(checkpoint_dir, output_dir, build_config: BuildConfig, overwrite: bool = False) -> Path:
    """Write an engine directory: config.json (version, limits, model), llm/ (TensorRT-LLM checkpoint), vision/.

    The directory must be new, empty, or (with overwrite=True) an earlier engine of this package and nothing else; it
    is replaced only once the new engine is complete. A symbolic link is followed: the engine goes where it points.
    """
    if not isinstance(build_config, BuildConfig):
        raise TypeError(f"build_config must be a BuildConfig, got {type(build_config).__name__}")
    checkpoint_dir, engine_dir = Path(checkpoint_dir), Path(output_dir)
    hf_config = load_config(checkpoint_dir)
    pretrained = trtllm_config(hf_config, build_config.dtype, weight_only=build_config.weight_only)
    check_model_limits(build_config, pretrained["max_position_embeddings"], pretrained["seq_length"])
    target = _engine_path(engine_dir)
    _check_target(checkpoint_dir, engine_dir, target, overwrite)
    lock = target.parent / f".{target.name}.lock"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(lock, timeout=0):
            _check_target(checkpoint_dir, engine_dir, target, overwrite)  # as it is now that no other build runs
            _remove_leftovers(target)
            staging = sibling_name(target)
            os.mkdir(staging)  # with the umask's permissions, like every file written into it
            _build_into(staging, checkpoint_dir, target, hf_config, pretrained, build_config)
    except Timeout:
        if not lock.exists():  # the lock file could not even be made: the folder takes no files
            raise PermissionError(f"cannot write in {target.parent}: build into a directory you can write to") from None
        raise FileExistsError(
            f"another build is writing {engine_dir} now: wait for it to finish, then use that engine (or build "
            "into another directory)"
        ) from None
    except (OSError, SafetensorError) as err:
        error = _write_error(err, target.parent)
        if error is None:
            raise
        raise error from None
    return engine_dir


def _build_into(staging: Path, checkpoint_dir: Path, target: Path, hf_config, pretrained, build_config) -> None:
    """Write the engine into `staging`, then put it in `target`'s place (an earlier engine there removed)."""
    try:
        convert_to_trtllm_checkpoint(checkpoint_dir, staging / LLM_DIR, build_config.dtype, 1, build_config.weight_only)
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
        put_in_place(staging, target)  # an earlier engine there (empty, or overwrite=True) moved aside, then removed
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the build completed


def _read_manifest(engine_dir: Path) -> dict:
    """manifest.json of an engine directory, checked to be one this version of the package wrote."""
    manifest_file = engine_dir / MANIFEST
    if not manifest_file.is_file():
        raise CheckpointError(
            f"{engine_dir} has no {MANIFEST}: the build did not finish, or the directory was not "
            f"made by build_engine; {REBUILD}"
        )
    manifest = read_json(manifest_file, REBUILD)
    if manifest.get("format") != ENGINE_VERSION or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(
            f"{manifest_file} describes engine format {manifest.get('format')!r}, this package reads "
            f"{ENGINE_VERSION!r}; {REBUILD}"
        )
    if manifest.get("package_version") != package_version():
        raise CheckpointError(
            f"{engine_dir} was built by qwenvl_lab {manifest.get('package_version')!r}, this is "
            f"{package_version()!r}; {REBUILD}"
        )
    chunk = manifest.get("chunk_bytes")
    if not is_int(chunk) or chunk < 1:
        raise CheckpointError(f"{manifest_file} records no checksums of the engine's files (an older build); {REBUILD}")
    return manifest


def _check_files(engine_dir: Path, manifest: dict, verify: str, under: str = "") -> None:
    """Refuse an engine whose files (those under `under`) differ from its manifest: an interrupted build, a damaged
    copy, a file changed in place. verify="full" reads every byte, "quick" every byte of files up to two chunks and
    the first and last chunk of larger ones, "none" only the sizes."""
    if verify not in VERIFY:
        raise ValueError(f"verify must be 'full', 'quick' or 'none', got {verify!r}")
    files = {name: entry for name, entry in manifest["files"].items() if name.startswith(under)}
    chunks = {}
    for name, expected in files.items():
        path = engine_dir / name
        if not isinstance(expected, dict) or not path.is_file():
            raise CheckpointError(f"{path} is missing: the engine is incomplete; {REBUILD}")
        size, sums = path.stat().st_size, expected.get("sha256")
        if size != expected.get("bytes"):
            raise CheckpointError(
                f"{path} has {size} bytes, the build wrote {expected.get('bytes')}: the engine is damaged; {REBUILD}"
            )
        n = _chunk_count(size, manifest["chunk_bytes"])
        if not isinstance(sums, list) or len(sums) != n:
            raise CheckpointError(f"{engine_dir / MANIFEST} has no checksums of {name}; {REBUILD}")
        if verify != "none":
            chunks[name] = list(range(n)) if verify == "full" or n <= 2 else [0, n - 1]
    found = _checksums(engine_dir, chunks, manifest["chunk_bytes"]) if chunks else {}
    for name, ks in chunks.items():
        if any(files[name]["sha256"][k] != digest for k, digest in zip(ks, found[name])):
            raise CheckpointError(f"{engine_dir / name} was changed after the build (its checksum differs); {REBUILD}")


def verify_engine(engine_dir, verify: str = "full") -> None:
    """Check every file of an engine directory against its manifest (sizes, and checksums as `verify` says), on
    demand: e.g. after loading it with verify="quick"."""
    engine_dir = Path(engine_dir)
    _check_files(engine_dir, _read_manifest(engine_dir), verify)


def load_engine_config(engine_dir, verify: str = "full") -> tuple[BuildConfig, dict]:
    """(BuildConfig, pretrained_config) of an engine directory, checked complete, unchanged since its build (every
    file's sha256 with verify="full"; see `verify_engine`) and readable by this version."""
    engine_dir = Path(engine_dir)
    if not engine_dir.is_dir():
        raise FileNotFoundError(
            f"engine directory {str(engine_dir)!r} not found; build the engine first with build_engine(...)"
        )
    config_file = engine_dir / "config.json"
    config = read_json(config_file, f"build the engine first with build_engine(...), or {REBUILD}")
    if config.get("version") != ENGINE_VERSION:
        raise CheckpointError(
            f"{engine_dir} holds engine version {config.get('version')!r}, this package reads "
            f"{ENGINE_VERSION!r}; {REBUILD}"
        )
    manifest = _read_manifest(engine_dir)
    if manifest.get("build_config") != config.get("build_config"):
        raise CheckpointError(
            f"{engine_dir}: config.json's build_config differs from the one the engine was built "
            f"with ({MANIFEST}); {REBUILD}"
        )
    _check_files(engine_dir, manifest, verify)
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
    return build_config, read_trtllm_config(engine_dir / LLM_DIR)  # the limits are checked against it where it runs


def load_engine_weights(engine_dir) -> dict[str, torch.Tensor]:
    """The LM weights of an engine directory, by TensorRT-LLM name."""
    path = Path(engine_dir) / LLM_DIR / RANK0
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} cannot be read as safetensors ({err}); {REBUILD}") from None


def load_engine_vision_tower(engine_dir, device="cpu", verify: str = "full") -> VisionTransformer:
    """The engine's vision part: VisionTransformer from vision/config.json and vision/model.safetensors, checked
    against the engine's manifest (`verify` as in load_engine_config)."""
    _check_files(Path(engine_dir), _read_manifest(Path(engine_dir)), verify, under=VISION_DIR + "/")
    vision_dir = Path(engine_dir) / VISION_DIR
    visual = field(
        read_json(vision_dir / "config.json", f"this engine has no vision part; {REBUILD}"),
        "visual",
        "dict",
        vision_dir / "config.json",
        REBUILD,
    )
    try:
        state = load_file(str(vision_dir / "model.safetensors"))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{vision_dir / 'model.safetensors'} cannot be read ({err}); {REBUILD}") from None
    return vision_tower_from(visual, state).to(device)
