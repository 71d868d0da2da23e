"""Notebook 05 — Qwen-VL-Chat's LM as a TensorRT-LLM unified checkpoint (config.json + rank{N}.safetensors), and back.

The format `trtllm-build` reads, and the layout the package's own engine keeps its language model in. Weight-only INT8
(`convert_checkpoint.py --use_weight_only --weight_only_precision int8`, quant_algo "W8A16") follows TensorRT-LLM's
rule: the layers' five matrices become int8 with one scale per output channel (`<name>.per_channel_scale`), the
vocabulary embedding, `lm_head` and the norms stay in the checkpoint dtype, and activations stay in it too.
"""

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from . import files
from .checkpoint import check_state_dict, iter_weights, load_config, load_visual_tower
from .checks.tensors import DTYPES, WEIGHT_ONLY, cast_finite, check_weight_only, to_torch_dtype
from .checks.values import check_path, is_int
from .files import CheckpointError, field, read_json
from .layout import hf_name, is_visual, to_trtllm_names
from .modeling import QWenLMHeadModel, QWenVLConfig
from .tokenizing import IMAGE_START_ID
from .vision import VisionTransformer

# how each tensor-parallel weight is cut (TensorRT-LLM 1.2.x QWen: ColumnLinear splits outputs, RowLinear inputs)
QKV = "qkv"  # [3·heads·d, …]: Q, K and V each split per head
SPLIT_DIM = {
    "attention.qkv.weight": QKV,
    "attention.qkv.bias": QKV,
    "attention.dense.weight": 1,
    "mlp.gate.weight": 0,
    "mlp.fc.weight": 0,
    "mlp.proj.weight": 1,
    "lm_head.weight": 0,  # rows padded to a multiple of tp_size first
}  # everything else (vocab_embedding, the norms) is kept whole on every rank
# the architecture upstream's converter writes for Qwen-VL-Chat (QWenConfig.from_hugging_face copies the HF config's
# architectures[0]); TensorRT-LLM's MODEL_MAP maps it and the older "QWenForCausalLM" to the same QWenForCausalLM
ARCHITECTURE = "QWenLMHeadModel"
# the matrices weight-only quantization converts: every layer's qkv, dense, gate, fc and proj (ColumnLinear and
# RowLinear); quantize_layers' default exclude_modules keeps '*lm_head' and '*vocab_embedding' in the dtype
QUANTIZED = ("attention.qkv.weight", "attention.dense.weight", "mlp.gate.weight", "mlp.fc.weight", "mlp.proj.weight")
SCALE_SUFFIX = "per_channel_scale"
ARCHITECTURES = (ARCHITECTURE, "QWenForCausalLM")
CHECKPOINT_WRITER = files.writer("TensorRT-LLM checkpoint", "a TensorRT-LLM checkpoint")
PLACEHOLDER_VISUAL = dict(
    image_size=28, patch_size=14, width=64, layers=1, heads=1, mlp_ratio=1.0, image_start_id=IMAGE_START_ID
)


def split_dim(name: str):
    """How the TensorRT-LLM weight `name` is split across ranks: 0, 1, "qkv", or None (kept whole)."""
    return next((dim for suffix, dim in SPLIT_DIM.items() if name.endswith(suffix)), None)


def shard(name: str, tensor: torch.Tensor, tp_size: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s part of the full TensorRT-LLM weight `name` under tensor parallelism."""
    dim = split_dim(name)
    if tp_size == 1 or dim is None:
        return tensor
    if dim == QKV:
        qkv = tensor.reshape(3, tensor.shape[0] // 3, -1)  # [3, heads·d, H] (bias: [3, heads·d, 1])
        return qkv.chunk(tp_size, dim=1)[rank].reshape(-1, *tensor.shape[1:])  # [3·heads·d/tp, …]
    if name == "lm_head.weight":
        tensor = F.pad(tensor, (0, 0, 0, -tensor.shape[0] % tp_size))  # [V padded to tp, H]
    return tensor.chunk(tp_size, dim=dim)[rank]


def unshard(name: str, parts: list[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """The full TensorRT-LLM weight `name` from every rank's part (inverse of `shard`)."""
    dim = split_dim(name)
    if len(parts) == 1 or dim is None:
        return parts[0]
    if dim == QKV:
        full = torch.cat([p.reshape(3, p.shape[0] // 3, -1) for p in parts], dim=1)  # [3, heads·d, H]
        return full.reshape(-1, *parts[0].shape[1:])
    full = torch.cat(parts, dim=dim)
    return full[:vocab_size] if name == "lm_head.weight" else full


def is_quantized(name: str) -> bool:
    """True for the TensorRT-LLM weights that weight-only quantization stores in int8 (QUANTIZED)."""
    return name.startswith("transformer.layers.") and name.endswith(QUANTIZED)


def scale_name(name: str) -> str:
    """The name of a quantized matrix's scales: `…qkv.weight` → `…qkv.per_channel_scale`."""
    return name.removesuffix("weight") + SCALE_SUFFIX


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 of a matrix [out, in] with one scale per output channel, TensorRT-LLM's rule
    (cutlass_preprocessors.cpp's symmetric_quantize): scale = max |w| of the channel / 128, q = w / scale rounded half
    away from zero and clipped to [-128, 127] (a channel of zeros: scale 0, q 0). Returns q int8 [out, in] and the
    scales in float32 [out]; w ≈ q · scale, within scale / 2 except the channel's positive maximum, clipped at 127."""
    w = weight.float()
    scale = w.abs().amax(dim=1) / 128  # [out]
    scaled = torch.where(scale[:, None] > 0, w / scale.clamp(min=torch.finfo(torch.float32).tiny)[:, None], 0.0)
    q = (scaled.sign() * (scaled.abs() + 0.5).floor()).clamp(-128, 127).to(torch.int8)  # C's round()
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """The matrix that int8 q [out, in] and its scales [out] stand for, in dtype (each channel times its scale)."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def weight_only_quantize(weights: dict, dtype) -> dict:
    """TensorRT-LLM weights (a language model's, in `dtype`) with every QUANTIZED matrix replaced by int8 and its
    `per_channel_scale` [out] in `dtype`, as TensorRT-LLM's W8A16 checkpoint holds them (the scales are stored in the
    checkpoint dtype; the rounding uses them in float32, as the C++ does). Other weights are kept as they are."""
    out = {}
    for name, tensor in weights.items():
        if is_quantized(name):
            q, scale = quantize_per_channel(tensor)
            out[name], out[scale_name(name)] = q, scale.to(to_torch_dtype(dtype))
        else:
            out[name] = tensor
    return out


def trtllm_config(config: QWenVLConfig, dtype: str = "float16", tp_size: int = 1, weight_only=None) -> dict:
    """config.json of the unified checkpoint: TensorRT-LLM 1.2.x QWenConfig fields for Qwen-VL-Chat's LM (weight_only
    "int8": quant_algo "W8A16")."""
    check_weight_only(weight_only)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} (TensorRT-LLM checkpoint dtypes), got {dtype!r}")
    if not is_int(tp_size) or tp_size < 1:
        raise ValueError(f"tp_size must be a positive int, got {tp_size!r}")
    ffn = config.intermediate_size // 2  # Qwen v1: intermediate_size is twice the MLP width
    if config.num_attention_heads % tp_size or ffn % tp_size:
        raise ValueError(
            f"tp_size {tp_size} must divide the {config.num_attention_heads} attention heads and the MLP width {ffn}"
        )
    if config.rotary_pct != 1.0 or not config.no_bias:
        raise ValueError(
            f"TensorRT-LLM's QWen supports rotary_pct 1.0 and no_bias true (Qwen-VL-Chat's values); this config has "
            f"rotary_pct {config.rotary_pct}, no_bias {config.no_bias}"
        )
    return {
        "architecture": ARCHITECTURE,
        "qwen_type": "qwen",
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_attention_heads,
        "head_size": config.kv_channels,
        "intermediate_size": config.intermediate_size,  # the HF value; TensorRT-LLM halves it for qwen_type "qwen"
        "hidden_act": "silu",
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": float(config.rotary_emb_base),
        "rotary_scaling": None,
        "norm_epsilon": config.layer_norm_epsilon,
        "max_position_embeddings": config.max_position_embeddings,
        "seq_length": config.seq_length,
        "use_logn_attn": config.use_logn_attn,  # recorded as TensorRT-LLM does; its QWen layers do not apply it
        "attn_bias": True,
        "mlp_bias": False,
        "use_parallel_embedding": False,  # vocab_embedding stays whole on every rank
        "embedding_sharding_dim": 0,
        "tie_word_embeddings": False,
        "mapping": {"world_size": tp_size, "tp_size": tp_size, "pp_size": 1},
        "quantization": {"quant_algo": WEIGHT_ONLY.get(weight_only), "kv_cache_quant_algo": None},
    }


def convert_to_trtllm_checkpoint(  # noqa: PLR0913 — the conversion's options, one argument each
    checkpoint_dir, output_dir, dtype: str = "float16", tp_size: int = 1, overwrite: bool = False, weight_only=None
) -> Path:
    """Write the TensorRT-LLM checkpoint of a Qwen-VL checkpoint's language model (no vision weights) as the folder
    `output_dir` (new or empty; overwrite: replace one this package wrote). A finite weight that overflows in `dtype`
    (float16 past 65504) is refused, named. weight_only "int8" stores the layers' matrices as int8 with per-channel
    scales (one rank only).

    The int8 matrices are kept [out, in], the layout this package's engine reads: TensorRT-LLM's weight-only plugin
    stores them transposed and interleaved for its CUTLASS kernels (preprocess_weights_for_mixed_gemm), so
    `trtllm-build` takes a checkpoint from its own convert_checkpoint.py for that."""
    hf_config = load_config(checkpoint_dir)
    config = trtllm_config(hf_config, dtype, tp_size, weight_only)
    if weight_only is not None and tp_size != 1:
        raise ValueError(
            f"weight_only={weight_only!r} is written for one rank (the package's engine), not tp_size {tp_size}: "
            "TensorRT-LLM quantizes each rank's share of a split matrix on its own; use tp_size=1"
        )
    with torch.device("meta"):
        expected = {k: v for k, v in QWenLMHeadModel(hf_config).state_dict().items() if not is_visual(k)}
    item = torch.empty((), dtype=to_torch_dtype(dtype)).element_size()
    need = sum(t.numel() for t in expected.values()) * item + 2**20
    check_trtllm_destination(output_dir, overwrite, need)
    state = dict(iter_weights(checkpoint_dir, keep=lambda key: not is_visual(key)))
    check_state_dict(state, expected)
    weights = to_trtllm_names(state)
    del state
    ranks = [{} for _ in range(tp_size)]
    for name in list(weights):
        tensor = cast_finite(
            f"{hf_name(name)} (the engine's {name})", weights.pop(name), dtype
        )  # quantized from the dtype's values, as upstream
        converted = weight_only_quantize({name: tensor}, dtype) if weight_only is not None else {name: tensor}
        for key, value in converted.items():
            for rank, part in enumerate(ranks):
                part[key] = shard(key, value, tp_size, rank).contiguous()
    with files.writing_folder(
        output_dir,
        CHECKPOINT_WRITER,
        overwrite=overwrite,
        need_bytes=need,
        parents=True,
        allow=_replaceable,
        made=_made,
    ) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for rank, part in enumerate(ranks):
            save_file(part, str(staging / f"rank{rank}.safetensors"), metadata={"format": "pt"})
    return Path(output_dir)


def _made(folder: Path) -> dict | None:
    """The files a conversion wrote in `folder`: its mark's list, or for one converted before marks, its config.json and
    rank files when that is all it holds (a TensorRT-LLM checkpoint of this package's format)."""
    listed = files.made_files(folder)
    if listed is not None:
        return listed
    names = {p.name for p in folder.iterdir()} - files.DISPOSABLE
    ranks = {n for n in names if n.startswith("rank") and n.endswith(".safetensors")}
    try:
        architecture = json.loads((folder / "config.json").read_text()).get("architecture")
    except (OSError, ValueError, AttributeError):
        architecture = None
    if ranks and names == ranks | {"config.json"} and architecture in ARCHITECTURES:
        return {name: [] for name in names}
    return None


def check_trtllm_destination(output_dir, overwrite: bool = False, need_bytes: int = 0) -> Path:
    """Refuse, before any work, a folder convert_to_trtllm_checkpoint must not write (see files.check_destination):
    one that is not empty, unless it holds a conversion of this package and overwrite=True."""
    return files.check_destination(
        output_dir,
        CHECKPOINT_WRITER,
        folder=True,
        overwrite=overwrite,
        need_bytes=need_bytes,
        parents=True,
        allow=_replaceable,
    )


def _replaceable(folder: Path, overwrite: bool) -> None:
    """Refuse a folder that is not empty unless it is a conversion of this package and overwrite=True."""
    if _made(folder) is None:
        raise FileExistsError(
            f"{folder} is not empty and holds no TensorRT-LLM checkpoint this package wrote: refusing to write one "
            "over it; give a new or empty folder"
        )
    if not overwrite:
        raise FileExistsError(f"{folder} already holds a TensorRT-LLM checkpoint: pass overwrite=True to replace it")


TRTLLM_FIX = "point at a directory written by convert_to_trtllm_checkpoint (convert the checkpoint again)"


def read_trtllm_config(checkpoint_dir) -> dict:
    """config.json of a TensorRT-LLM QWen checkpoint, checked to be one this package can read back."""
    checkpoint_dir = check_path("checkpoint_dir", checkpoint_dir)
    config_file = checkpoint_dir / "config.json"
    config = check_trtllm_config(read_json(config_file, TRTLLM_FIX), checkpoint_dir)
    tp_size = config["mapping"]["tp_size"]
    missing = [
        f"rank{r}.safetensors" for r in range(tp_size) if not (checkpoint_dir / f"rank{r}.safetensors").is_file()
    ]
    if missing:
        raise CheckpointError(f"{checkpoint_dir} lacks {missing} for tp_size {tp_size}")
    return config


def check_trtllm_config(config: dict, checkpoint_dir: Path) -> dict:
    """A TensorRT-LLM QWen checkpoint's config.json (read from `checkpoint_dir`), checked to be one this package can
    read back: a Qwen (v1) model, every size a positive int, unquantized or weight-only, no pipeline parallelism."""
    config_file, fix = checkpoint_dir / "config.json", TRTLLM_FIX
    if config.get("architecture") not in ARCHITECTURES or config.get("qwen_type") != "qwen":
        raise CheckpointError(
            f"{checkpoint_dir} is not a Qwen (v1) TensorRT-LLM checkpoint: architecture "
            f"{config.get('architecture')!r}, qwen_type {config.get('qwen_type')!r}"
        )
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "head_size",
        "intermediate_size",
        "max_position_embeddings",
        "seq_length",
    ):
        field(config, key, "int", config_file, fix)
    for key in ("norm_epsilon", "rotary_base"):
        field(config, key, "positive", config_file, fix)
    if not isinstance(config.get("dtype"), str) or config["dtype"] not in DTYPES:
        raise CheckpointError(f"{config_file}: 'dtype' must be one of {sorted(DTYPES)}, found {config.get('dtype')!r}")
    mapping = field(config, "mapping", "dict", config_file, fix)
    tp_size = field(mapping, "tp_size", "int", f"{config_file} (mapping)", fix)
    algo = (config.get("quantization") or {}).get("quant_algo")
    if mapping.get("pp_size", 1) != 1 or algo not in (None, *WEIGHT_ONLY.values()):
        raise CheckpointError(
            f"{checkpoint_dir}: only checkpoints without pipeline parallelism, unquantized or weight-only "
            f"{sorted(WEIGHT_ONLY.values())}, are read (found quant_algo {algo!r})"
        )
    if algo is not None and tp_size != 1:
        raise CheckpointError(f"{checkpoint_dir}: a weight-only checkpoint is read for one rank, not tp_size {tp_size}")
    return config


def dequantized(weights: dict, dtype) -> dict:
    """A weight-only checkpoint's weights with each int8 matrix times its per-channel scales, in dtype (the scales
    dropped): what `weight_only_quantize` rounded the weights to."""
    return {
        name: dequantize(tensor, weights[scale_name(name)], to_torch_dtype(dtype)) if is_quantized(name) else tensor
        for name, tensor in weights.items()
        if not name.endswith(SCALE_SUFFIX)
    }


class NoVisionWeights(VisionTransformer):
    """The vision tower's place in a model rebuilt from a TensorRT-LLM checkpoint alone, which has no vision weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Refuse: there are no trained weights to run."""
        raise ValueError(
            "this model was rebuilt from a TensorRT-LLM checkpoint, which holds no vision weights: pass "
            "hf_dir=<the Qwen-VL checkpoint> to load_trtllm_checkpoint, or give images as a prompt_table "
            "(fake ids >= vocab_size, see per_request_tables)"
        )


def load_trtllm_checkpoint(checkpoint_dir, hf_dir=None, dtype=None) -> QWenLMHeadModel:
    """Rebuild QWenLMHeadModel from a TensorRT-LLM checkpoint, ranks merged; the vision tower comes from `hf_dir`.

    Without `hf_dir` the tower is a small NoVisionWeights that refuses to run: images must then come as a prompt_table.
    """
    if hf_dir is not None:
        hf_dir = check_path("hf_dir", hf_dir)
    config = read_trtllm_config(checkpoint_dir)
    ranks = [load_file(str(Path(checkpoint_dir) / f"rank{r}.safetensors")) for r in range(config["mapping"]["tp_size"])]
    if (config.get("quantization") or {}).get(
        "quant_algo"
    ) is not None:  # weight-only: the matrices the int8 values stand for
        ranks = [dequantized(ranks[0], config["dtype"])]
    state = {hf_name(name): unshard(name, [part[name] for part in ranks], config["vocab_size"]) for name in ranks[0]}
    if hf_dir is None:
        visual = dict(PLACEHOLDER_VISUAL, output_dim=config["hidden_size"])
        tower = NoVisionWeights(**visual)
    else:
        visual, tower = load_config(hf_dir).visual, load_visual_tower(hf_dir)
    model_config = QWenVLConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        intermediate_size=config["intermediate_size"],
        kv_channels=config["head_size"],
        rotary_emb_base=config["rotary_base"],
        seq_length=config["seq_length"],
        max_position_embeddings=config["max_position_embeddings"],
        layer_norm_epsilon=config["norm_epsilon"],
        use_logn_attn=config["use_logn_attn"],
        visual=visual,
    )
    with torch.device("meta"):
        model = QWenLMHeadModel(model_config)
    model.transformer.visual = tower
    check_state_dict(state, {k: v for k, v in model.state_dict().items() if not is_visual(k)})
    model.load_state_dict(state, strict=False, assign=True)  # every language-model key, checked just above
    return model.to(to_torch_dtype(config["dtype"] if dtype is None else dtype)).eval()
