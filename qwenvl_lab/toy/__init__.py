"""The embedded toy model: a small Qwen-VL-architecture model trained on synthetic shape pictures."""

import os
from pathlib import Path

import torch

from ..checkpoint import load_checkpoint
from ..resources import data_dir, toy_checkpoint_dir

DATA_DIR = data_dir()
TOY_DIR = toy_checkpoint_dir()
CHECKPOINT_ENV = "QWENVL_LAB_CHECKPOINT"  # point the course at a real Qwen-VL-Chat directory

# Qwen-VL's architecture at a laptop size: the real vocabulary (151936) and 256 image queries, head size 64
TOY_CONFIG = dict(
    vocab_size=151936, hidden_size=128, num_hidden_layers=4, num_attention_heads=2, kv_channels=64,
    intermediate_size=1024, seq_length=2048, max_position_embeddings=8192,
    visual=dict(heads=2, image_size=112, image_start_id=151857, layers=3, mlp_ratio=2.0, output_dim=128,
                patch_size=14, width=128),
)


def default_checkpoint_dir() -> Path:
    """The course's checkpoint: $QWENVL_LAB_CHECKPOINT when set (a real Qwen-VL-Chat), else the shipped toy."""
    return Path(os.environ.get(CHECKPOINT_ENV, TOY_DIR))


def load_course_model(checkpoint_dir=None, dtype=torch.float32, device="cpu"):
    """Load the course's model: the shipped toy, or a real Qwen-VL-Chat named by `checkpoint_dir` or
    $QWENVL_LAB_CHECKPOINT."""
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir()
    if not (checkpoint_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"no checkpoint at {checkpoint_dir}: train the toy model with `python -m qwenvl_lab.toy.train` "
            f"or set {CHECKPOINT_ENV} to a Qwen-VL-Chat directory"
        )
    return load_checkpoint(checkpoint_dir, dtype=dtype, device=device)


load_toy_model = load_course_model  # the name before 0.2; kept for one release
