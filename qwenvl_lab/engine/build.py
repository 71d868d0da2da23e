"""Notebook 05 — building the engine: the limits fixed once, the LM in TensorRT-LLM's layout, the vision tower beside.

An engine directory holds config.json (the limits and the model), llm/ (a TensorRT-LLM unified checkpoint), vision/
(the vision tower), qwen.tiktoken when the checkpoint has one, and manifest.json, written last. A build writes into
a temporary directory beside the engine directory and renames it into place only when complete, so a failed or
killed build leaves the previous engine exactly as it was; `load_engine_config` refuses a directory whose manifest
does not match what is on disk.
"""

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, fields
from importlib import metadata
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..checkpoint import check_state_dict, load_config, load_visual_tower, vision_tower_from
from ..files import CheckpointError, field, read_json
from ..limits import BuildConfig, check_model_limits
from ..tokenizing import VOCAB_FILE_NAME
from ..unified_checkpoint import convert_to_trtllm_checkpoint, read_trtllm_config, trtllm_config
from ..vision import VisionTransformer

ENGINE_VERSION = "qwenvl-lab-engine/2"
LLM_DIR, VISION_DIR = "llm", "vision"  # TensorRT-LLM's multimodal layout: engine_dir/llm and engine_dir/vision
RANK0 = "rank0.safetensors"
MANIFEST = "manifest.json"  # written last: its presence marks a complete engine of this package
CONFIGS = ("config.json", f"{LLM_DIR}/config.json", f"{VISION_DIR}/config.json")  # checksummed in the manifest
REBUILD = "rebuild it with build_engine(checkpoint_dir, engine_dir, build_config, overwrite=True)"


def package_version() -> str:
    """The installed qwenvl_lab's version (recorded in every engine it builds)."""
    try:
        return metadata.version("qwenvl_lab")
    except metadata.PackageNotFoundError:
        return "unknown"


def expected_weights(pretrained_config: dict) -> dict[str, tuple[int, ...]]:
    """The engine's LM weights, by TensorRT-LLM name, with their shapes."""
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
    return shapes


def check_engine_weights(weights: dict, pretrained_config: dict) -> None:
    """Raise a CheckpointError naming missing, unexpected or mis-shaped engine weights."""
    check_state_dict(
        weights,
        {name: torch.empty(shape, device="meta") for name, shape in expected_weights(pretrained_config).items()},
    )


def _check_target(checkpoint_dir: Path, engine_dir: Path, overwrite: bool) -> None:
    """Refuse an engine directory that is the checkpoint (or inside or around it), holds other files, or holds an
    earlier engine without overwrite=True."""
    ckpt, target = checkpoint_dir.resolve(), engine_dir.resolve()
    if target == ckpt or ckpt in target.parents or target in ckpt.parents:
        raise ValueError(
            f"the engine directory {engine_dir} is the checkpoint directory {checkpoint_dir}, inside it "
            "or around it: building there would overwrite the checkpoint. Give a separate directory"
        )
    if not engine_dir.exists():
        return
    if not engine_dir.is_dir():
        raise NotADirectoryError(f"{engine_dir} is a file; give a directory for the engine")
    entries = sorted(p.name for p in engine_dir.iterdir())
    if not entries:
        return
    if MANIFEST not in entries and "config.json" not in entries:
        shown = ", ".join(entries[:8]) + (" …" if len(entries) > 8 else "")
        raise FileExistsError(
            f"{engine_dir} is not empty and holds no engine of this package ({shown}): refusing to "
            "write an engine over it. Give a new or empty directory"
        )
    if MANIFEST not in entries and not _is_engine_config(engine_dir / "config.json"):
        raise FileExistsError(
            f"{engine_dir} holds a config.json that is not an engine of this package: refusing to "
            "write an engine over it. Give a new or empty directory"
        )
    if not overwrite:
        raise FileExistsError(
            f"{engine_dir} already holds an engine: pass overwrite=True to replace it "
            "(`--overwrite` on the command line), or give another directory"
        )


def _is_engine_config(config_file: Path) -> bool:
    """True for the config.json of an engine directory of this package (any version)."""
    try:
        return str(json.loads(config_file.read_text()).get("version", "")).startswith("qwenvl-lab-engine/")
    except (OSError, ValueError, AttributeError):
        return False


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_manifest(engine_dir: Path, build_config: BuildConfig) -> None:
    """manifest.json: the format, the package version, the build config, every file's size, each config's sha256."""
    files = {
        p.relative_to(engine_dir).as_posix(): {"bytes": p.stat().st_size}
        for p in sorted(engine_dir.rglob("*"))
        if p.is_file()
    }
    for name in CONFIGS:
        files[name]["sha256"] = _sha256(engine_dir / name)
    manifest = {
        "format": ENGINE_VERSION,
        "package_version": package_version(),
        "build_config": asdict(build_config),
        "files": files,
    }
    (engine_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _remove_leftovers(engine_dir: Path) -> None:
    """Delete the temporary siblings that builds of this engine directory killed earlier left behind."""
    for stale in engine_dir.parent.glob(f".{engine_dir.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def build_engine(checkpoint_dir, output_dir, build_config: BuildConfig, overwrite: bool = False) -> Path:
    """Write an engine directory: config.json (version, limits, model), llm/ (TensorRT-LLM checkpoint), vision/.

    The directory must be new, empty, or (with overwrite=True) an earlier engine of this package; it is replaced only
    once the new engine is complete.
    """
    if not isinstance(build_config, BuildConfig):
        raise TypeError(f"build_config must be a BuildConfig, got {type(build_config).__name__}")
    checkpoint_dir, engine_dir = Path(checkpoint_dir), Path(output_dir)
    hf_config = load_config(checkpoint_dir)
    pretrained = trtllm_config(hf_config, build_config.dtype)
    check_model_limits(build_config, pretrained["max_position_embeddings"], pretrained["seq_length"])
    _check_target(checkpoint_dir, engine_dir, overwrite)
    engine_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(engine_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{engine_dir.name}.", suffix=".tmp", dir=engine_dir.parent))
    try:
        convert_to_trtllm_checkpoint(checkpoint_dir, staging / LLM_DIR, build_config.dtype)
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
        if engine_dir.exists():  # empty, or an earlier engine (overwrite=True): moved aside, then removed
            replaced = engine_dir.parent / f".{engine_dir.name}.replaced.tmp"
            engine_dir.rename(replaced)
            staging.rename(engine_dir)
            shutil.rmtree(replaced)
        else:
            staging.rename(engine_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the build completed
    return engine_dir


def _check_manifest(engine_dir: Path, config: dict) -> None:
    """Refuse an engine whose files differ from its manifest: an interrupted build or a damaged copy."""
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
    if manifest.get("build_config") != config.get("build_config"):
        raise CheckpointError(
            f"{engine_dir}: config.json's build_config differs from the one the engine was built "
            f"with ({MANIFEST}); {REBUILD}"
        )
    for name, expected in manifest["files"].items():
        path = engine_dir / name
        if not isinstance(expected, dict) or not path.is_file():
            raise CheckpointError(f"{path} is missing: the engine is incomplete; {REBUILD}")
        if path.stat().st_size != expected.get("bytes"):
            raise CheckpointError(
                f"{path} has {path.stat().st_size} bytes, the build wrote {expected.get('bytes')}: "
                f"the engine is damaged; {REBUILD}"
            )
        if "sha256" in expected and _sha256(path) != expected["sha256"]:
            raise CheckpointError(f"{path} was changed after the build (its checksum differs); {REBUILD}")


def load_engine_config(engine_dir) -> tuple[BuildConfig, dict]:
    """(BuildConfig, pretrained_config) of an engine directory, checked complete and readable by this version."""
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
    _check_manifest(engine_dir, config)
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
    except ValueError as err:
        raise CheckpointError(f"{config_file}: {err}; {REBUILD}") from None
    pretrained = read_trtllm_config(engine_dir / LLM_DIR)
    check_model_limits(build_config, pretrained["max_position_embeddings"], pretrained["seq_length"])
    return build_config, pretrained


def load_engine_weights(engine_dir) -> dict[str, torch.Tensor]:
    """The LM weights of an engine directory, by TensorRT-LLM name."""
    path = Path(engine_dir) / LLM_DIR / RANK0
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} cannot be read as safetensors ({err}); {REBUILD}") from None


def load_engine_vision_tower(engine_dir, device="cpu") -> VisionTransformer:
    """The engine's vision part: VisionTransformer from vision/config.json and vision/model.safetensors."""
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
