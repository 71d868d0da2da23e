"""Notebook 00 — checkpoints: load a directory in Qwen-VL-Chat's layout, checking every key, and make tiny ones."""

import json
import pickle
import shutil
from pathlib import Path, PurePosixPath

import torch
from safetensors import SafetensorError, safe_open

from . import files
from .checks.tensors import cast_finite, first_non_finite, to_torch_dtype
from .checks.values import check_path
from .files import CheckpointError, read_json
from .modeling import QWenLMHeadModel, QWenVLConfig, check_visual
from .tokenizing import vocab_file_path
from .vision import VisionTransformer

REPAIR = "re-download the file or repair it"
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")

TINY_CONFIG = dict(
    vocab_size=151936,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    kv_channels=64,
    intermediate_size=512,
    seq_length=2048,
    max_position_embeddings=8192,
    visual=dict(
        heads=2, image_size=56, image_start_id=151857, layers=2, mlp_ratio=2.0, output_dim=128, patch_size=14, width=64
    ),
)


def _shard_path(checkpoint_dir: Path, name, source: str) -> Path:
    """The weight file `name` (as `source` names it) inside checkpoint_dir; refused when it points outside.

    A Hugging Face cache snapshot (`…/snapshots/<revision>/`) may link its files into the repository's `blobs/`.
    """
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(
            f"{source} names the weight file {name!r}, which is not a file name; "
            "re-download the checkpoint or repair the file"
        )
    if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
        raise CheckpointError(
            f"{source} names the weight file {name!r}, outside the checkpoint directory "
            f"{checkpoint_dir}; weight files must lie inside it: re-download the checkpoint"
        )
    try:
        root, target = checkpoint_dir.resolve(), (checkpoint_dir / name).resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop, a name too long
        raise CheckpointError(f"{source} names the weight file {name!r}, which cannot be resolved ({err})") from None
    hf_blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
    if not target.is_relative_to(root) and target.parent != hf_blobs:
        raise CheckpointError(
            f"{source} names the weight file {name!r}, a link to {target} outside the checkpoint "
            f"directory {checkpoint_dir}; weight files must lie inside it: copy them in"
        )
    return checkpoint_dir / name


def weight_files(checkpoint_dir: Path) -> list[Path]:
    """The weight shards of a checkpoint directory (via its index file when sharded), each checked to lie inside it."""
    checkpoint_dir = check_path("checkpoint_dir", checkpoint_dir)
    for name in INDEX_FILES:
        index_file = checkpoint_dir / name
        if index_file.is_file():
            index = read_json(index_file, REPAIR)
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(
                    f"{index_file} has no weight_map (weight name → shard file); re-download the file or repair it"
                )
            files = [_shard_path(checkpoint_dir, f, str(index_file)) for f in dict.fromkeys(weight_map.values())]
            missing = [str(f.relative_to(checkpoint_dir)) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"{name} in {checkpoint_dir} names shards that are missing: {missing}")
            return files
    for name in SINGLE_FILES:
        if (checkpoint_dir / name).is_file():
            return [_shard_path(checkpoint_dir, name, str(checkpoint_dir))]
    raise CheckpointError(
        f"no weights in {checkpoint_dir}: expected one of {INDEX_FILES + SINGLE_FILES} (Qwen-VL-Chat's layout)"
    )


def _shard_tensors(path: Path, keep=None):
    """(key, tensor) for each tensor of one weight file whose key passes `keep`; a damaged file is a CheckpointError."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as shard:
                yield from ((key, shard.get_tensor(key)) for key in shard.keys() if keep is None or keep(key))
            return
        if _is_legacy_torch_file(path):
            raise CheckpointError(
                f"{path} is intact but in PyTorch's legacy (before 1.6, not zip) format, which cannot be memory-mapped: "
                f'convert it once with: python -c "import torch; p = {str(path)!r}; torch.save(torch.load(p, '
                'weights_only=True), p)" (the same weights, in the zip format), or save the checkpoint as safetensors'
            )
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        if "weights only load failed" not in str(err).lower():
            raise CheckpointError(
                f"{path} cannot be read as a weight file ({err}); it is damaged: re-download it"
            ) from None
        raise CheckpointError(
            f"{path} holds Python objects other than tensors ({_unsupported(err)}): refused, as loading it could run "
            "code; get the checkpoint from a source you trust, as safetensors if you can"
        ) from None
    except (SafetensorError, RuntimeError, OSError, EOFError) as err:
        raise CheckpointError(
            f"{path} cannot be read as a weight file ({err}); it is truncated or damaged: re-download it"
        ) from None
    bad = (
        next((k for k, v in state.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))), None)
        if isinstance(state, dict)
        else type(state).__name__
    )
    if bad is not None:
        raise CheckpointError(
            f"{path} is not a state dict of named tensors ({bad!r} is not a weight name with a tensor); re-download it"
        )
    yield from ((key, value) for key, value in state.items() if keep is None or keep(key))


LEGACY_TORCH_MAGIC = bytes.fromhex(
    "80028a0a6cfc9c46f9206aa85019"
)  # pickle protocol 2, then torch's legacy magic number


def _is_legacy_torch_file(path: Path) -> bool:
    """True for a file torch.save wrote in its legacy (non-zip) format."""
    with open(path, "rb") as f:
        return f.read(len(LEGACY_TORCH_MAGIC)) == LEGACY_TORCH_MAGIC


def _unsupported(err: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler met, without its advice to load the file unsafely."""
    lines = [line.strip() for line in str(err).splitlines()]
    found = [line for line in lines if line and "weights_only" not in line and "weights only" not in line.lower()]
    return found[0].rstrip(".") if found else "objects the weights-only loader does not accept"


def iter_weights(checkpoint_dir, keep=None):
    """(key, tensor) for each weight of a checkpoint directory whose key passes `keep`, one shard open at a time.

    A weight holding NaN or ±inf is refused by its key.
    """
    for path in weight_files(checkpoint_dir):
        for key, tensor in _shard_tensors(path, keep):
            bad = first_non_finite(tensor) if tensor.is_floating_point() else None
            if bad is not None:
                raise CheckpointError(
                    f"weight {key} in {path} holds {float(tensor[bad])} at index {list(bad)}; the file "
                    "is damaged or the checkpoint diverged in training: re-download it"
                )
            yield key, tensor


def read_state_dict(checkpoint_dir, keep=None) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory (those whose key passes `keep`), by their Qwen-VL key names."""
    return dict(iter_weights(checkpoint_dir, keep))


def vision_tower_from(visual_config: dict, state: dict, dtype=None) -> VisionTransformer:
    """A VisionTransformer built from a `visual` config and its weights (keys without the `transformer.visual.` prefix)."""
    check_visual(visual_config)
    with torch.device("meta"):
        tower = VisionTransformer(**visual_config)
    check_state_dict(state, tower.state_dict())
    if dtype is not None:
        state = {k: cast_finite(f"transformer.visual.{k}", v, dtype) for k, v in state.items()}
    tower.load_state_dict(state, strict=True, assign=True)
    return tower.eval()


def load_visual_tower(checkpoint_dir, dtype=torch.float32) -> VisionTransformer:
    """`transformer.visual` of a Qwen-VL checkpoint alone (config.json `visual` + its weights), in eval mode."""
    visual, prefix = load_config(checkpoint_dir).visual, "transformer.visual."
    state = {k[len(prefix) :]: v for k, v in iter_weights(checkpoint_dir, lambda key: key.startswith(prefix))}
    return vision_tower_from(visual, state, dtype)


def load_config(checkpoint_dir) -> QWenVLConfig:
    """Read config.json of a Qwen-VL checkpoint directory; a value a model cannot use is named with the file."""
    checkpoint_dir = check_path("checkpoint_dir", checkpoint_dir)
    if not checkpoint_dir.is_dir():
        if checkpoint_dir.exists():
            raise NotADirectoryError(
                f"{str(checkpoint_dir)!r} is a file; point at the checkpoint directory that holds it"
            )
        raise FileNotFoundError(f"checkpoint directory not found: {str(checkpoint_dir)!r}")
    config_file = checkpoint_dir / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{checkpoint_dir} has no config.json; point at a Qwen-VL-Chat checkpoint directory")
    fields = read_json(config_file, REPAIR)
    try:
        return QWenVLConfig.from_dict(fields)
    except TypeError as err:
        raise CheckpointError(
            f"{config_file} has a value of the wrong type: {err}; repair the file "
            "(Qwen-VL-Chat's config.json has the types of QWenVLConfig())"
        ) from None
    except Exception as err:  # transformers' own fields raise their own errors: the file's content is at fault
        raise CheckpointError(f"{config_file} has a value a Qwen-VL model cannot use: {err}; repair the file") from None


def check_state_dict(state: dict, expected: dict) -> None:
    """Raise a CheckpointError naming every missing, unexpected or mis-shaped key."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = [
        f"{k}: expected {tuple(expected[k].shape)}, found {tuple(state[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    problems = (
        ([f"missing keys: {missing[:8]}{' …' if len(missing) > 8 else ''}"] if missing else [])
        + ([f"unexpected keys: {unexpected[:8]}{' …' if len(unexpected) > 8 else ''}"] if unexpected else [])
        + ([f"mis-shaped: {misshaped[:8]}"] if misshaped else [])
    )
    if problems:
        raise CheckpointError("checkpoint does not match its config.json — " + "; ".join(problems))


def load_checkpoint(checkpoint_dir, dtype=None, device="cpu") -> QWenLMHeadModel:
    """Load a Qwen-VL-Chat-layout directory (config.json + sharded safetensors/.bin) into QWenLMHeadModel."""
    config = load_config(checkpoint_dir)
    generation_config = Path(checkpoint_dir) / "generation_config.json"
    if generation_config.is_file():
        read_json(
            generation_config, REPAIR
        )  # a damaged copy is named here, before transformers or a chat loop reads it
    with torch.device("meta"):
        model = QWenLMHeadModel(config)
    state = read_state_dict(checkpoint_dir)
    check_state_dict(state, model.state_dict())
    if dtype is not None:
        state = {k: v.to(to_torch_dtype(dtype)) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).eval()


CHECKPOINT_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")
CHECKPOINT_WRITER = files.writer("checkpoint", "a checkpoint")


def _replaceable(output_dir: Path, overwrite: bool) -> None:
    """Refuse a folder that is not empty unless overwrite=True, and one holding anything but a checkpoint."""
    if not overwrite:
        raise FileExistsError(
            f"{output_dir} is not empty: name a new folder, or pass overwrite=True (--overwrite) to replace the "
            "checkpoint there"
        )
    made = files.made_files(output_dir) or {}
    held = [p for p in output_dir.iterdir() if p.name not in (files.MARK, *files.DISPOSABLE, *made)]
    others = [p.name for p in held if not (p.is_file() and any(p.match(pattern) for pattern in CHECKPOINT_FILES))]
    if others or not (output_dir / "config.json").is_file():
        what = f"{', '.join(sorted(others)[:3])}{' …' if len(others) > 3 else ''}" if others else "no config.json"
        raise FileExistsError(
            f"{output_dir} holds more than a checkpoint ({what}) and is not replaced: name a new folder"
        )


def check_checkpoint_target(output_dir, overwrite: bool = False, need_bytes: int = 0) -> Path:
    """Refuse, before any work, a folder that save_checkpoint must not write: a file, one holding anything but a
    checkpoint, or (without overwrite) any folder that is not empty; a folder that takes no files or has less room
    than `need_bytes`. A checkpoint that a save replaces loses the files the package wrote (its mark lists them); one
    it did not write is kept, moved to NAME.kept-<date>."""
    return files.check_destination(
        output_dir,
        CHECKPOINT_WRITER,
        folder=True,
        overwrite=overwrite,
        need_bytes=need_bytes,
        parents=True,
        allow=_replaceable,
    )


def checkpoint_bytes(model: QWenLMHeadModel) -> int:
    """About how many bytes save_checkpoint writes for `model`: every weight at its dtype's size, and the configs."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values()) + 2**20


def save_checkpoint(  # noqa: PLR0913 — the save's options, one argument each
    model: QWenLMHeadModel, output_dir, max_shard_size="200MB", overwrite: bool = False, copy_in=()
) -> Path:
    """Write config.json, generation_config.json and sharded safetensors with Qwen-VL's key names into a new or
    empty folder (overwrite: replace the checkpoint there), atomically: written beside it, then renamed into place.
    `copy_in`: files copied in with them (a qwen.tiktoken)."""
    with files.writing_folder(
        output_dir,
        CHECKPOINT_WRITER,
        overwrite=overwrite,
        need_bytes=checkpoint_bytes(model) + sum(Path(p).stat().st_size for p in copy_in),
        parents=True,
        allow=_replaceable,
    ) as staging:
        model.save_pretrained(staging, max_shard_size=max_shard_size)
        (staging / "generation_config.json").write_text(
            json.dumps(
                dict(
                    chat_format="chatml",
                    eos_token_id=151643,
                    pad_token_id=151643,
                    max_window_size=6144,
                    max_new_tokens=512,
                    do_sample=True,
                    top_k=0,
                    top_p=0.3,
                ),
                indent=2,
            )
            + "\n"
        )
        for source in copy_in:
            shutil.copyfile(source, staging / Path(source).name)
    return Path(output_dir)


def make_tiny_checkpoint(output_dir, seed: int = 0, with_vocab: bool = True) -> Path:
    """Write a small random Qwen-VL checkpoint (real vocab size, 256 queries, real layout) for tests."""
    torch.manual_seed(seed)
    model = QWenLMHeadModel(QWenVLConfig(**TINY_CONFIG))
    return save_checkpoint(model, output_dir, max_shard_size="60MB", copy_in=[vocab_file_path()] if with_vocab else ())
