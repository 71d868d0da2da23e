"""Reading only the tensors a step needs (the vision tower, or the language model) from a Qwen-VL checkpoint."""

from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ..checkpoint import check_state_dict, load_config, weight_files
from ..layout import is_visual
from ..vision import VisionTransformer

VISUAL_PREFIX = "transformer.visual."


def iter_weights(checkpoint_dir, keep: Callable[[str], bool]) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, tensor) for every weight of a Qwen-VL checkpoint whose key passes `keep`, one shard open at a time."""
    for path in weight_files(Path(checkpoint_dir)):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as shard:
                for key in shard.keys():
                    if keep(key):
                        yield key, shard.get_tensor(key)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            yield from ((key, value) for key, value in state.items() if keep(key))


def load_visual_tower(checkpoint_dir, dtype=torch.float32) -> VisionTransformer:
    """`transformer.visual` of a Qwen-VL checkpoint alone (config.json `visual` + its weights), in eval mode."""
    config = load_config(checkpoint_dir)
    with torch.device("meta"):
        tower = VisionTransformer(**config.visual)
    state = {key[len(VISUAL_PREFIX):]: value.to(dtype) for key, value in iter_weights(checkpoint_dir, is_visual)}
    check_state_dict(state, tower.state_dict())
    tower.load_state_dict(state, strict=True, assign=True)
    return tower.eval()
