"""Engine, build — fix the limits once, write the LM in TensorRT-LLM's layout and dtype, the vision tower beside it."""

import json
import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..checkpoint import CheckpointError, check_state_dict, load_config, load_visual_tower, vision_tower_from
from ..prompt_table import to_torch_dtype
from ..tokenizing import IMG_TOKEN_SPAN, VOCAB_FILE_NAME
from ..trtllm.build_command import IMAGE_IDS, dtype_name
from ..trtllm.convert import convert_to_trtllm_checkpoint, read_trtllm_config, trtllm_config
from ..vision import VisionTransformer

ENGINE_VERSION = "qwenvl-lab-engine/1"
LLM_DIR, VISION_DIR = "llm", "vision"  # TensorRT-LLM's multimodal layout: engine_dir/llm and engine_dir/vision
RANK0 = "rank0.safetensors"


@dataclass(frozen=True)
class BuildConfig:
    """The limits `trtllm-build` fixes at build time, and the engine dtype.

    `max_prompt_embedding_table_size` = 256 × images per request × max_batch_size; 0 (trtllm-build's default, and
    what article 2's command leaves) builds an engine without prompt-table inputs, which refuses images.
    """

    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: int = 2048
    max_prompt_embedding_table_size: int = 0
    dtype: str = "float32"
    max_beam_width: int = 1

    def __post_init__(self):
        for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BuildConfig.{name} must be a positive int, got {value!r}")
        table = self.max_prompt_embedding_table_size
        if isinstance(table, bool) or not isinstance(table, int) or table < 0:
            raise ValueError(f"BuildConfig.max_prompt_embedding_table_size must be an int >= 0, got {table!r}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.max_input_len > self.max_seq_len:
            raise ValueError(
                f"max_input_len {self.max_input_len} exceeds max_seq_len {self.max_seq_len}: max_seq_len counts the "
                "prompt and the answer; raise max_seq_len"
            )
        if 0 < table < IMG_TOKEN_SPAN:
            raise ValueError(
                f"a prompt table of {table} rows cannot hold one image ({IMG_TOKEN_SPAN} rows); use 256 × images per "
                "request × max_batch_size, or 0 for a text-only engine"
            )
        if table and self.max_input_len < IMAGE_IDS:
            raise ValueError(
                f"max_input_len {self.max_input_len} cannot hold one image span ({IMAGE_IDS} ids: <img> + 256 + </img>); "
                "raise max_input_len"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        """The engine dtype as a torch.dtype."""
        return to_torch_dtype(self.dtype)


def check_model_limits(build_config: BuildConfig, pretrained_config: dict) -> None:
    """Raise when the limits do not fit the model; warn past seq_length, where Qwen-VL's dynamic NTK would start."""
    if build_config.max_seq_len > pretrained_config["max_position_embeddings"]:
        raise ValueError(
            f"max_seq_len {build_config.max_seq_len} exceeds the model's max_position_embeddings "
            f"{pretrained_config['max_position_embeddings']}"
        )
    if build_config.max_seq_len > pretrained_config["seq_length"]:
        warnings.warn(
            f"max_seq_len {build_config.max_seq_len} > seq_length {pretrained_config['seq_length']}: past that length "
            "Qwen-VL applies dynamic NTK and logn attention, which this engine (like TensorRT-LLM) does not, so long "
            "answers differ from the original model",
            stacklevel=3,
        )


def expected_weights(pretrained_config: dict) -> dict[str, tuple[int, ...]]:
    """The engine's LM weights, by TensorRT-LLM name, with their shapes."""
    hidden, vocab = pretrained_config["hidden_size"], pretrained_config["vocab_size"]
    proj = pretrained_config["num_attention_heads"] * pretrained_config["head_size"]
    ffn = pretrained_config["intermediate_size"] // 2  # Qwen v1 stores twice the MLP width
    shapes = {"transformer.vocab_embedding.weight": (vocab, hidden), "transformer.ln_f.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for layer in range(pretrained_config["num_hidden_layers"]):
        prefix = f"transformer.layers.{layer}."
        shapes.update({
            prefix + "input_layernorm.weight": (hidden,), prefix + "attention.qkv.weight": (3 * proj, hidden),
            prefix + "attention.qkv.bias": (3 * proj,), prefix + "attention.dense.weight": (hidden, proj),
            prefix + "post_layernorm.weight": (hidden,), prefix + "mlp.gate.weight": (ffn, hidden),
            prefix + "mlp.fc.weight": (ffn, hidden), prefix + "mlp.proj.weight": (hidden, ffn),
        })
    return shapes


def check_engine_weights(weights: dict, pretrained_config: dict) -> None:
    """Raise a CheckpointError naming missing, unexpected or mis-shaped engine weights."""
    check_state_dict(weights, {name: torch.empty(shape, device="meta")
                               for name, shape in expected_weights(pretrained_config).items()})


def build_engine(checkpoint_dir, output_dir, build_config: BuildConfig) -> Path:
    """Write an engine directory: config.json (version, limits, model), llm/ (TensorRT-LLM checkpoint), vision/."""
    if not isinstance(build_config, BuildConfig):
        raise TypeError(f"build_config must be a BuildConfig, got {type(build_config).__name__}")
    checkpoint_dir, output_dir = Path(checkpoint_dir), Path(output_dir)
    hf_config = load_config(checkpoint_dir)
    pretrained = trtllm_config(hf_config, build_config.dtype)
    check_model_limits(build_config, pretrained)
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"{output_dir} is a file; give a directory for the engine")
    convert_to_trtllm_checkpoint(checkpoint_dir, output_dir / LLM_DIR, build_config.dtype)
    tower = load_visual_tower(checkpoint_dir, build_config.torch_dtype)
    (output_dir / VISION_DIR).mkdir(parents=True, exist_ok=True)
    vision = {k: v.contiguous() for k, v in tower.state_dict().items()}
    save_file(vision, str(output_dir / VISION_DIR / "model.safetensors"))
    (output_dir / VISION_DIR / "config.json").write_text(
        json.dumps({"visual": hf_config.visual, "dtype": build_config.dtype}, indent=2) + "\n")
    if (checkpoint_dir / VOCAB_FILE_NAME).is_file():
        shutil.copyfile(checkpoint_dir / VOCAB_FILE_NAME, output_dir / VOCAB_FILE_NAME)
    config = {"version": ENGINE_VERSION, "build_config": asdict(build_config), "pretrained_config": pretrained}
    (output_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return output_dir


def load_engine_config(engine_dir) -> tuple[BuildConfig, dict]:
    """(BuildConfig, pretrained_config) of an engine directory, checked to be one this version reads."""
    engine_dir = Path(engine_dir)
    config_file = engine_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{str(config_file)!r} not found; build the engine first with build_engine(...)")
    config = json.loads(config_file.read_text())
    if config.get("version") != ENGINE_VERSION:
        raise CheckpointError(
            f"{engine_dir} holds engine version {config.get('version')!r}, this package reads {ENGINE_VERSION!r}; "
            "rebuild it with build_engine"
        )
    if not (engine_dir / LLM_DIR / RANK0).is_file():
        raise FileNotFoundError(f"{engine_dir / LLM_DIR / RANK0} is missing; was build_engine interrupted?")
    pretrained = read_trtllm_config(engine_dir / LLM_DIR)
    return BuildConfig(**config["build_config"]), pretrained


def load_engine_weights(engine_dir) -> dict[str, torch.Tensor]:
    """The LM weights of an engine directory, by TensorRT-LLM name."""
    return load_file(str(Path(engine_dir) / LLM_DIR / RANK0))


def load_vision_tower(engine_dir, device="cpu") -> VisionTransformer:
    """The engine's vision part: VisionTransformer from vision/config.json and vision/model.safetensors."""
    vision_dir = Path(engine_dir) / VISION_DIR
    if not (vision_dir / "config.json").is_file():
        raise FileNotFoundError(f"{vision_dir} has no config.json; this engine was built without its vision part")
    visual = json.loads((vision_dir / "config.json").read_text())["visual"]
    tower = vision_tower_from(visual, load_file(str(vision_dir / "model.safetensors")))
    return tower.to(device)
