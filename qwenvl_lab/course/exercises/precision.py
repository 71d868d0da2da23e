"""Exercises of the precision section (notebook 07, weight-only INT8): the bytes one decode step reads in INT8, and
TensorRT-LLM's per-channel quantizer written by hand."""

import torch

from ...engine.build import expected_weights
from ...engine.layers import weight_bytes_per_token
from ...modeling import QWenVLConfig
from ...unified_checkpoint import is_quantized, quantize_per_channel, scale_name, trtllm_config
from . import exercise, whole_number
from .nb03 import NOT_ATTEMPTED

CHAT = QWenVLConfig()  # Qwen-VL-Chat's shapes


def step_bytes(weight_only: bool = True, scales=torch.float16, quantized=is_quantized, embedding_row=True) -> int:
    """Bytes of Qwen-VL-Chat's language-model weights one decode step reads, float16 with `quantized` matrices in int8
    and their scales in `scales` (weight_only), or all in float16; the embedding one row (or whole)."""
    pretrained = trtllm_config(CHAT, "float16", weight_only="int8" if weight_only else None)
    shapes = expected_weights(pretrained)
    dtypes = {name: torch.float16 for name in shapes}
    if weight_only:
        for name in shapes:
            if quantized(name):
                dtypes[name] = torch.int8
                dtypes[scale_name(name)] = scales
        shapes = {name: shape for name, shape in shapes.items() if name in dtypes}
    weights = {name: torch.empty(shape, dtype=dtypes[name], device="meta") for name, shape in shapes.items()}
    total = weight_bytes_per_token(weights)
    if not embedding_row:
        embedding = weights["transformer.vocab_embedding.weight"]
        total += (embedding.shape[0] - 1) * embedding.shape[1] * embedding.element_size()
    return total


@exercise(
    "07.9", "an int: the bytes one INT8 decode step of Qwen-VL-Chat's language model reads, as TensorRT-LLM builds it"
)
def int8_step_bytes(answer):
    """None for the INT8 engine's bytes a step, else what the number counts instead."""
    value = whole_number(answer)
    if value is None:
        return "give one whole number of bytes (an int)"
    expected = step_bytes()
    if value == expected:
        return None
    float16 = step_bytes(weight_only=False)
    wrong = {
        float16: "that is the float16 engine's step: the layers' five matrices are int8 in the INT8 engine",
        float16 // 2: "halving everything makes lm_head, the embedding's row, the norms and the bias int8 too: "
        "TensorRT-LLM keeps lm_head and the embedding in float16 (quantize_layers' exclude_modules)",
        step_bytes(quantized=lambda n: is_quantized(n) or n == "lm_head.weight"): "lm_head stays in float16 in "
        "TensorRT-LLM's weight-only recipe; only the layers' qkv, dense, gate, fc and proj become int8",
        step_bytes(scales=torch.float32): "the scales are stored in the checkpoint's dtype, float16: 2 bytes each",
        step_bytes(embedding_row=False): "a decode step reads one row of the embedding (its token's), not the table",
    }
    scales = sum(
        shape[0] * 2
        for name, shape in expected_weights(trtllm_config(CHAT, "float16", weight_only="int8")).items()
        if name.endswith("per_channel_scale")
    )
    wrong.setdefault(expected - scales, "add the scales: one float16 number per output channel of each int8 matrix")
    if value in wrong:
        return wrong[value]
    if abs(value - expected) < 0.02 * expected:
        return "close: count every tensor the step reads, with its own element size (int8 1 byte, float16 2)"
    return "add up, per layer, the five matrices in int8 and their per-row scales, the norms and the qkv bias in float16, then lm_head, ln_f and one embedding row in float16"


def _cases() -> list[torch.Tensor]:
    """Matrices [out, in] the quantizer is tried on: rows of very different sizes, exact half steps, a row of zeros,
    a row whose maximum is positive (clipped at 127) and one whose maximum is negative (-128, kept)."""
    generator = torch.Generator().manual_seed(44)
    rows = torch.randn(6, 32, generator=generator) * torch.logspace(-2, 1, 6)[:, None]
    halves = torch.tensor([[2.5, -2.5, 0.5, -0.5, 1.5] + [0.0] * 26 + [128.0]]) / 128  # steps of 1/128
    special = torch.zeros(3, 32)
    special[1, :4] = torch.tensor([1.0, -0.5, 0.25, 0.75])  # maximum +1.0 → 128 steps → 127
    special[2, :4] = torch.tensor([-1.0, 0.5, 0.25, 0.75])  # maximum |−1.0| → −128, in range
    return [rows, torch.cat([rows, halves, special]), halves.repeat(4, 1) * torch.tensor([[1.0], [3.0], [7.0], [0.5]])]


def _as_pair(result):
    """(q, scale) from what a learner's function returned, or a hint."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return None, "return two things: (q, scale)"
    q, scale = result
    if not isinstance(q, torch.Tensor) or not isinstance(scale, torch.Tensor):
        return None, "return torch tensors: q (int8) and scale (one per output row)"
    return (q, scale), None


def _scale_hint(scale: torch.Tensor, w: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when `scale` holds each output row's largest |w| / 128, else what it holds instead."""
    if scale.numel() == 1:
        return "one scale for the whole matrix is per-tensor quantization: TensorRT-LLM keeps one per output row"
    if scale.reshape(-1).shape == (w.shape[1],) and w.shape[0] != w.shape[1]:
        return "that is one scale per input column: take each output row's (dim 1's) largest |w|"
    if scale.reshape(-1).shape != expected.shape:
        return f"scale should hold one number per output row: [{w.shape[0]}]"
    scale = scale.reshape(-1).float()
    if torch.allclose(scale, expected * 128 / 127):
        return "TensorRT-LLM divides the largest |w| by 128 (2^7), not 127; the +128 that gives is clipped to 127"
    if torch.allclose(scale, expected * 128):
        return "the scale is a step: the largest |w| divided by 128"
    if not torch.allclose(scale, expected):
        return "each row's scale is its largest |w| divided by 128"
    return None


def _q_hint(q: torch.Tensor, w: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor) -> str | None:
    """None when `q` is TensorRT-LLM's int8 of `w` (row scales `scale`), else what went wrong."""
    if q.dtype != torch.int8:
        return f"q should be stored as int8, not {q.dtype}"
    if q.shape != w.shape:
        return f"q keeps the matrix's shape {tuple(w.shape)}"
    if torch.equal(q, expected):
        return None
    if (q == -128).logical_and(expected == 127).any():
        return "a row's positive maximum is 128 steps, one past int8: clip to [-128, 127] before the cast"
    steps = w / scale.clamp(min=1e-30)[:, None]
    halves = steps.abs().frac() == 0.5
    if torch.equal(q[~halves], expected[~halves]):
        return "values exactly half-way between two steps round away from zero in C's round(); torch.round rounds them to even"
    if torch.equal(q.float(), steps.trunc().clamp(-128, 127)):
        return "round to the nearest step: .to(torch.int8) alone truncates toward zero"
    return "q is each w divided by its row's scale, rounded (half away from zero) and clipped to [-128, 127]"


@exercise("07.10", "a function: TensorRT-LLM's weight-only INT8 of a matrix [out, in], returning (q int8, scale [out])")
def per_channel_quantizer(function):
    """None when the learner's function quantizes every test matrix as TensorRT-LLM does, else a hint."""
    if not callable(function):
        return "give a function w -> (q, scale)"
    for w in _cases():
        out = function(w.clone())
        if out is None:
            return NOT_ATTEMPTED
        pair, hint = _as_pair(out)
        if hint:
            return hint
        expected_q, expected_scale = quantize_per_channel(w)
        hint = _scale_hint(pair[1], w, expected_scale) or _q_hint(pair[0], w, expected_q, expected_scale)
        if hint:
            return hint
    return None
