"""The course's model — the shipped toy, a small Qwen-VL trained on shape pictures, or a real Qwen-VL-Chat — and the
engine built from it once for every notebook (`qwenvl_lab.toy` gives these names)."""

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch

from ..checkpoint import load_checkpoint
from ..checks.values import check_path
from ..engine import BuildConfig, build_engine, load_engine_config
from ..files import CheckpointError
from ..resources import data_dir, output_dir, toy_checkpoint_dir

DATA_DIR = data_dir()
TOY_DIR = toy_checkpoint_dir()
CHECKPOINT_ENV = "QWENVL_LAB_CHECKPOINT"  # point the course at a real Qwen-VL-Chat directory

# Qwen-VL's architecture at a laptop size: the real vocabulary (151936) and 256 image queries, head size 64
TOY_CONFIG = dict(
    vocab_size=151936,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=2,
    kv_channels=64,
    intermediate_size=1024,
    seq_length=2048,
    max_position_embeddings=8192,
    visual=dict(
        heads=2,
        image_size=112,
        image_start_id=151857,
        layers=3,
        mlp_ratio=2.0,
        output_dim=128,
        patch_size=14,
        width=128,
    ),
)


def default_checkpoint_dir() -> Path:
    """The course's checkpoint: $QWENVL_LAB_CHECKPOINT when set (a real Qwen-VL-Chat), else the shipped toy."""
    return Path(os.environ.get(CHECKPOINT_ENV, TOY_DIR))


def load_course_model(checkpoint_dir=None, dtype=torch.float32, device="cpu"):
    """Load the course's model: the shipped toy, or a real Qwen-VL-Chat named by `checkpoint_dir` or
    $QWENVL_LAB_CHECKPOINT."""
    checkpoint_dir = (
        check_path("checkpoint_dir", checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir()
    )
    if not (checkpoint_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"no checkpoint at {checkpoint_dir}: train the toy model with `python -m qwenvl_lab.toy.train` "
            f"or set {CHECKPOINT_ENV} to a Qwen-VL-Chat directory"
        )
    return load_checkpoint(checkpoint_dir, dtype=dtype, device=device)


load_toy_model = load_course_model  # the name before 0.2; kept for one release

# the notebooks' engine: 4 requests of up to 2 pictures, 3 beams
COURSE_BUILD = BuildConfig(
    max_batch_size=4, max_input_len=640, max_seq_len=704, max_prompt_embedding_table_size=2048, max_beam_width=3
)


def course_engine(build_config: BuildConfig = COURSE_BUILD, checkpoint_dir=None) -> Path:
    """The course's engine directory (under output_dir()/engines/): built once from the course's model with
    `build_config`, then reused — by every notebook — until the model or the limits change."""
    checkpoint_dir = (
        check_path("checkpoint_dir", checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir()
    )
    files = sorted(p for p in checkpoint_dir.iterdir() if p.is_file()) if checkpoint_dir.is_dir() else []
    source = [
        str(checkpoint_dir.resolve()),
        asdict(build_config),
        [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files],
    ]
    tag = hashlib.sha256(json.dumps(source).encode()).hexdigest()[:12]
    engine_dir = output_dir() / "engines" / f"{checkpoint_dir.name}-{tag}"
    try:
        if load_engine_config(engine_dir)[0] == build_config:
            return engine_dir
    except (FileNotFoundError, CheckpointError):
        pass  # not built yet, or an interrupted or older build: built again
    return build_engine(checkpoint_dir, engine_dir, build_config, overwrite=True)
