"""Build limits — what `trtllm-build` fixes at build time (batch, lengths, beams, prompt-table rows, dtype).

Shared by the package's own engine (`engine/`) and the real TensorRT-LLM path (`trtllm/`), so both are built with
the same numbers. This module imports no transformers: the TensorRT-LLM environment loads it too.
"""

import warnings
from dataclasses import dataclass

import torch

from .prompt_table import DTYPES, to_torch_dtype
from .tokenizing import IMG_TOKEN_SPAN

IMAGE_IDS = IMG_TOKEN_SPAN + 2  # an image takes <img> + 256 + </img> positions of the input


def dtype_name(dtype) -> str:
    """ "float16"/"bfloat16"/"float32" for a dtype given as that name or as a torch.dtype."""
    names = {v: k for k, v in DTYPES.items()}
    if isinstance(dtype, torch.dtype) and dtype in names:
        return names[dtype]
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    raise ValueError(f"dtype must be one of {sorted(DTYPES)} (or the torch.dtype), got {dtype!r}")


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

    @property
    def rows_per_request(self) -> int:
        """Table rows one request may use under in-flight batching (the C++ executor): at every step the table of the
        request at position b of that step's batch is copied to row b × this, a block fixed at build time."""
        return self.max_prompt_embedding_table_size // self.max_batch_size


def prompt_table_size(build_config: BuildConfig, images_per_request: int = 1) -> int:
    """`--max_prompt_embedding_table_size` = 256 × images per request × max_batch_size (in-flight batching)."""
    if isinstance(images_per_request, bool) or not isinstance(images_per_request, int) or images_per_request < 1:
        raise ValueError(f"images_per_request must be a positive int, got {images_per_request!r}")
    return IMG_TOKEN_SPAN * images_per_request * build_config.max_batch_size


def check_model_limits(build_config: BuildConfig, max_position_embeddings: int, seq_length: int) -> None:
    """Raise when the limits do not fit the model; warn past seq_length, where Qwen-VL's dynamic NTK would start."""
    if build_config.max_seq_len > max_position_embeddings:
        raise ValueError(
            f"max_seq_len {build_config.max_seq_len} exceeds the model's max_position_embeddings {max_position_embeddings}"
        )
    if build_config.max_seq_len > seq_length:
        warnings.warn(
            f"max_seq_len {build_config.max_seq_len} > seq_length {seq_length}: past that length Qwen-VL applies "
            "dynamic NTK and logn attention, which this engine (like TensorRT-LLM) does not, so long answers differ "
            "from the original model",
            stacklevel=3,
        )
