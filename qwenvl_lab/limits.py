"""Build limits — what `trtllm-build` fixes at build time (batch, lengths, beams, prompt-table rows, dtype).

Shared by the package's own engine (`engine/`) and the real TensorRT-LLM path (`trtllm/`), so both are built with
the same numbers. This module imports no transformers: the TensorRT-LLM environment loads it too.
"""

from dataclasses import dataclass

import torch

from .checks.tensors import check_weight_only, dtype_name, to_torch_dtype
from .checks.values import check_int
from .tokenizing import IMAGE_IDS, IMG_TOKEN_SPAN

TABLE_SIZE_RULE = f"{IMG_TOKEN_SPAN} rows a picture × pictures per request × max_batch_size"  # prompt_table_size


@dataclass(frozen=True)
class BuildConfig:
    """The limits `trtllm-build` fixes at build time, and the engine dtype.

    `max_prompt_embedding_table_size` = rows a picture (Qwen-VL: 256) × images per request × max_batch_size
    (`prompt_table_size`); 0 (trtllm-build's default, and what article 2's command leaves) builds an engine without
    prompt-table inputs, which refuses images.
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
