"""Build limits — what `trtllm-build` fixes at build time (batch, lengths, beams, prompt-table rows, dtype).

Shared by the package's own engine (`engine/`) and the real TensorRT-LLM path (`trtllm/`), so both are built with
the same numbers. This module imports no transformers: the TensorRT-LLM environment loads it too.
"""

from dataclasses import dataclass

import torch

from .checks.tensors import check_weight_only, dtype_name, to_torch_dtype
from .checks.values import check_int
from .files import size_text
from .tokenizing import IMAGE_IDS, IMG_TOKEN_SPAN

TABLE_SIZE_RULE = f"{IMG_TOKEN_SPAN} rows a picture × pictures per request × max_batch_size"  # prompt_table_size


@dataclass(frozen=True)
class BuildConfig:
    """The limits `trtllm-build` fixes at build time, and the engine dtype.

    `max_prompt_embedding_table_size` = rows a picture (Qwen-VL: 256) × images per request × max_batch_size
    (`prompt_table_size`); 0 (trtllm-build's default, and what article 2's command leaves) builds an engine without
    prompt-table inputs.
    """

    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: int = 2048
    max_prompt_embedding_table_size: int = 0
    dtype: str = "float32"
    max_beam_width: int = 1
    weight_only: str | None = None

    def __post_init__(self):
        for name in ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width"):
            check_int(f"BuildConfig.{name}", getattr(self, name), 1)
        table = check_int("BuildConfig.max_prompt_embedding_table_size", self.max_prompt_embedding_table_size, 0)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        check_weight_only(self.weight_only)
        if self.max_input_len > self.max_seq_len:
            raise ValueError(
                f"max_input_len {self.max_input_len} exceeds max_seq_len {self.max_seq_len}: max_seq_len counts the "
                "prompt and the answer; raise max_seq_len"
            )
        if 0 < table < IMG_TOKEN_SPAN:
            raise ValueError(
                f"a prompt table of {table} rows cannot hold one image ({IMG_TOKEN_SPAN} rows); use {TABLE_SIZE_RULE}, "
                "or 0 for a text-only engine"
            )
        if table and self.max_input_len < IMAGE_IDS:
            raise ValueError(
                f"max_input_len {self.max_input_len} cannot hold one image span ({IMAGE_IDS} ids with <img> and "
                "</img>); "
                "raise max_input_len"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        """The engine dtype as a torch.dtype."""
        return to_torch_dtype(self.dtype)

    @property
    def rows_per_request(self) -> int:
        """Table rows one request may use under in-flight batching (the C++ executor): at every step the table of the
        request at position b of that step's batch is copied to row b × this (with the engine's max_batch_size, the
        runtime's default; a runtime given a smaller max batch size divides by that)."""
        return self.max_prompt_embedding_table_size // self.max_batch_size


def prompt_table_size(build_config: BuildConfig, images_per_request: int = 1) -> int:
    """`--max_prompt_embedding_table_size` for in-flight batching: rows a picture × images per request ×
    max_batch_size (the C++ executor's block, size / max_batch_size, then holds one request's pictures)."""
    check_int("images_per_request", images_per_request, 1)
    return IMG_TOKEN_SPAN * images_per_request * build_config.max_batch_size


def engine_memory(build_config: BuildConfig, pretrained_config: dict, weight_count: int) -> dict[str, int]:
    """Bytes an engine takes where it runs: its KV cache ([layers, K and V, max_batch_size × max_beam_width rows,
    heads, max_seq_len, head size] in the engine dtype, allocated whole when it loads) and its `weight_count`
    language-model weights."""
    item = torch.empty((), dtype=build_config.torch_dtype).element_size()
    rows = build_config.max_batch_size * build_config.max_beam_width
    per_position = 2 * pretrained_config["num_hidden_layers"] * pretrained_config["num_attention_heads"]
    per_position *= pretrained_config["head_size"] * item
    return {"kv_cache": rows * build_config.max_seq_len * per_position, "weights": weight_count * item}


def memory_text(build_config: BuildConfig, pretrained_config: dict, need: dict[str, int]) -> str:
    """What an engine's limits ask for, in words: which limits make the KV cache, how large each part is."""
    b, p = build_config, pretrained_config
    return (
        f"KV cache {size_text(need['kv_cache'])} (max_batch_size {b.max_batch_size} × max_beam_width "
        f"{b.max_beam_width} rows × max_seq_len {b.max_seq_len} positions × {p['num_hidden_layers']} layers × K and "
        f"V × {p['num_attention_heads']} heads × {p['head_size']} × {b.dtype}) + weights {size_text(need['weights'])}"
    )


def device_memory(device) -> tuple[int, int] | None:
    """(available, total) bytes of memory of `device` (a torch.device): the GPU's free memory on CUDA, the machine's
    available memory on a CPU (psutil, else Linux's /proc/meminfo); None where it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None  # refused where the engine is made, with its own message
        free, total = torch.cuda.mem_get_info(device)
        return free, total
    if device.type != "cpu":
        return None
    try:
        import psutil  # noqa: PLC0415 — the course extra's; the TensorRT-LLM environment may lack it

        memory = psutil.virtual_memory()
        return memory.available, memory.total
    except ImportError:
        pass
    try:
        info = dict(line.split(":", 1) for line in open("/proc/meminfo", encoding="ascii").read().splitlines())
        return int(info["MemAvailable"].split()[0]) * 1024, int(info["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_engine_memory(build_config: BuildConfig, pretrained_config: dict, need: dict[str, int], device) -> None:
    """Refuse to load an engine whose KV cache and weights (`need`, from engine_memory) exceed the memory `device`
    has available, naming the limits that ask for it and what the machine has."""
    has = device_memory(device)
    if has is None or sum(need.values()) <= has[0]:
        return
    raise ValueError(
        f"this engine needs {size_text(sum(need.values()))} on {device}: "
        f"{memory_text(build_config, pretrained_config, need)}; {device} has {size_text(has[0])} available "
        f"({size_text(has[1])} in all). Rebuild it with smaller limits (--max-batch-size, --max-seq-len, "
        "--max-beam-width, or --dtype bfloat16 for float32)"
    )
