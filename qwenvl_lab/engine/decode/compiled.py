"""Decode back end "compiled": the "torch" step with its layer halves fused by torch.compile (Triton on CUDA)."""

import torch

from ..layers import attention_input, mlp_output
from .torch_ops import TorchDecode


class CompiledDecode(TorchDecode):
    """TorchDecode whose `attention_input` and `mlp_output` run as compiled graphs: fewer kernels per layer."""

    name = "compiled"

    def __init__(self, engine):
        super().__init__(
            engine, torch.compile(attention_input, fullgraph=True), torch.compile(mlp_output, fullgraph=True)
        )
