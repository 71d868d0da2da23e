"""Notebook 05 — the `trtllm-build` command that builds an engine with a prompt-table input, and running it."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

from ..checks.tensors import dtype_name
from ..limits import IMAGE_IDS, prompt_table_size
from ..tokenizing import IMG_TOKEN_SPAN
from .gpu import GPUStackError, missing_gpu_stack
from .mpi_world import launcher_free_env

BUILD_MODULE = "tensorrt_llm.commands.build"  # what the `trtllm-build` console script runs


def trtllm_build_command(checkpoint_dir, engine_dir, build_config, images_per_request: int = 1) -> list[str]:
    """The `trtllm-build` argument list for our engine's BuildConfig (the same limits, the same dtype)."""
    if build_config.weight_only is not None:
        raise ValueError(
            f"build_config.weight_only={build_config.weight_only!r}: TensorRT-LLM takes weight-only quantization from "
            "its checkpoint (convert_checkpoint.py --use_weight_only --weight_only_precision int8), not from "
            "trtllm-build; this route converts unquantized checkpoints only: leave weight_only out"
        )
    table_size = prompt_table_size(build_config, images_per_request)
    dtype = dtype_name(build_config.dtype)
    configured = build_config.max_prompt_embedding_table_size
    if configured != table_size:
        why = (
            "an engine built with 0 has no prompt-table input: the picture never reaches it (a user report of an image not being read: TensorRT-LLM issue #1300)"
            if configured == 0
            else "each request's table sits at row (its position in the step's batch) × size / max_batch_size"
        )
        raise ValueError(
            f"build_config.max_prompt_embedding_table_size is {configured}, but {images_per_request} image(s) per "
            f"request × max_batch_size {build_config.max_batch_size} need {IMG_TOKEN_SPAN} × {images_per_request} × "
            f"{build_config.max_batch_size} = {table_size} rows ({why}); make them agree"
        )
    if build_config.max_input_len < images_per_request * IMAGE_IDS:
        raise ValueError(
            f"max_input_len {build_config.max_input_len} cannot hold {images_per_request} image(s) of {IMAGE_IDS} ids "
            f"each (<img> + {IMG_TOKEN_SPAN} + </img>) plus the question; raise max_input_len"
        )
    checkpoint_config = Path(checkpoint_dir) / "config.json"
    if checkpoint_config.is_file():
        checkpoint_dtype = json.loads(checkpoint_config.read_text()).get("dtype")
        if checkpoint_dtype != dtype:
            raise ValueError(
                f"the checkpoint in {checkpoint_dir} is {checkpoint_dtype} but build_config.dtype is {dtype}; "
                "convert with the same dtype or change build_config.dtype (the plugins run in that dtype)"
            )
    return [
        "trtllm-build",
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(engine_dir),
        "--gemm_plugin",
        dtype,
        "--gpt_attention_plugin",
        dtype,
        "--max_batch_size",
        str(build_config.max_batch_size),
        "--max_beam_width",
        str(build_config.max_beam_width),
        "--max_input_len",
        str(build_config.max_input_len),
        "--max_seq_len",
        str(build_config.max_seq_len),
        "--max_prompt_embedding_table_size",
        str(table_size),  # without it the engine has no prompt-table input: the picture never reaches it (#1300)
        "--remove_input_padding",
        "enable",
    ]


def run_trtllm_build(command: list[str]) -> Path:
    """Run a `trtllm_build_command` list (needs tensorrt_llm 1.2.x and a GPU): the engine dir.

    The build runs as `python -m tensorrt_llm.commands.build …` with this interpreter, so an environment's
    Python finds its own TensorRT-LLM even when that environment's `bin/` (where `trtllm-build` lives) is not on PATH,
    and without the MPI launcher's variables, so that under mpirun it is an MPI process of its own (tensorrt_llm
    starts MPI when imported).
    """
    command = [str(part) for part in command]
    if not command or command[0] != "trtllm-build" or not {"--checkpoint_dir", "--output_dir"} <= set(command):
        raise ValueError("run_trtllm_build takes the argument list made by trtllm_build_command")
    checkpoint_dir = Path(command[command.index("--checkpoint_dir") + 1])
    engine_dir = Path(command[command.index("--output_dir") + 1])
    if not (checkpoint_dir / "config.json").is_file():
        raise FileNotFoundError(f"no TensorRT-LLM checkpoint in {checkpoint_dir}; run convert_to_trtllm_checkpoint")
    missing = missing_gpu_stack("tensorrt_llm", "cuda")
    if missing:
        raise GPUStackError(
            f"building the engine needs {'; '.join(missing)}. On a GPU machine run:\n{shlex.join(command)}"
        )
    subprocess.run([sys.executable, "-m", BUILD_MODULE, *command[1:]], check=True, env=launcher_free_env())
    return engine_dir
