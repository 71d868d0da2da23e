"""Notebook 07's precision exercises (07.3, 07.4): right answers written two ways pass, each plausible wrong
answer is refused with a hint that does not give the answer away, stubs are 'not attempted yet'."""

import numpy as np
import pytest
import torch

from qwenvl_lab.course.exercises import check
from qwenvl_lab.course.exercises.nb07 import CHAT, step_bytes
from qwenvl_lab.unified_checkpoint import quantize_per_channel

L, H, V = CHAT.num_hidden_layers, CHAT.hidden_size, CHAT.vocab_size
FFN = CHAT.intermediate_size // 2
LAYER_INT8 = 3 * H * H + H * H + 2 * FFN * H + H * FFN  # qkv, dense, gate, fc, proj: one byte a number
LAYER_FLOAT16 = 2 * (3 * H + H + 2 * FFN + H) + 2 * 3 * H + 2 * 2 * H  # their scales, the qkv bias, two norms
BY_HAND = L * (LAYER_INT8 + LAYER_FLOAT16) + 2 * (V * H + H + H)  # lm_head, ln_f, one embedding row


def test_the_bytes_counted_by_hand_are_right_as_an_int_and_as_numpy():
    assert BY_HAND == step_bytes()
    assert check("07.3", BY_HAND) and check("07.3", np.int64(BY_HAND)) and check("07.3", torch.tensor(BY_HAND))


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (step_bytes(weight_only=False), "float16 engine's step"),
        (step_bytes(weight_only=False) // 2, "halving everything"),
        (step_bytes() - 2 * L * (3 * H + H + 2 * FFN + H), "add the scales"),
        (step_bytes() + 2 * L * (3 * H + H + 2 * FFN + H), "float16: 2 bytes each"),
        (step_bytes() - V * H, "lm_head stays in float16"),
        (step_bytes() + 2 * (V - 1) * H, "one row of the embedding"),
        (step_bytes() + 1000, "close"),
        (1, "add up"),
        (7.0e9, "one whole number"),
        ("7.7 GB", "one whole number"),
    ],
)
def test_plausible_wrong_byte_counts_are_refused(wrong, hint):
    result = check("07.3", wrong)
    assert not result and hint in result.message and str(BY_HAND) not in result.message


def quantize_by_hand(w):
    scale = w.abs().amax(dim=1) / 128
    steps = w / torch.where(scale > 0, scale, 1)[:, None]
    return (steps.sign() * (steps.abs() + 0.5).floor()).clamp(-128, 127).to(torch.int8), scale


def quantize_numpy(w):
    a = w.numpy()
    scale = np.abs(a).max(axis=1, keepdims=True) / 128  # [out, 1]
    steps = np.divide(a, scale, out=np.zeros_like(a), where=scale > 0)
    q = np.clip(np.sign(steps) * np.floor(np.abs(steps) + 0.5), -128, 127).astype(np.int8)
    return torch.from_numpy(q), torch.from_numpy(scale)


def test_the_quantizer_written_two_ways_is_right():
    assert check("07.4", quantize_by_hand) and check("07.4", quantize_numpy) and check("07.4", quantize_per_channel)


def per_tensor(w):
    scale = w.abs().max() / 128
    return (w / scale).round().clamp(-128, 127).to(torch.int8), scale


def per_input_column(w):
    scale = w.abs().amax(dim=0) / 128
    return (w / scale).round().clamp(-128, 127).to(torch.int8), scale


def over_127(w):
    scale = w.abs().amax(dim=1) / 127
    return (w / torch.where(scale > 0, scale, 1)[:, None]).round().to(torch.int8), scale


def no_clip(w):
    q, scale = quantize_by_hand(w)
    steps = w / torch.where(scale > 0, scale, 1)[:, None]
    return (steps.sign() * (steps.abs() + 0.5).floor()).to(torch.int16).to(torch.int8), scale  # 128 wraps to -128


def half_to_even(w):
    q, scale = quantize_by_hand(w)
    return (w / torch.where(scale > 0, scale, 1)[:, None]).round().clamp(-128, 127).to(torch.int8), scale


def truncated(w):
    q, scale = quantize_by_hand(w)
    return (w / torch.where(scale > 0, scale, 1)[:, None]).clamp(-128, 127).to(torch.int8), scale


def as_float(w):
    q, scale = quantize_by_hand(w)
    return q.float(), scale


def scale_as_step_count(w):
    q, scale = quantize_by_hand(w)
    return q, scale * 128


def scales_in_float16(w):
    q, scale = quantize_by_hand(w)
    return q, scale.half()


def per_tensor_repeated(w):
    scale = (w.abs().max() / 128).expand(w.shape[0])
    steps = w / scale[:, None]
    return (steps.sign() * (steps.abs() + 0.5).floor()).clamp(-128, 127).to(torch.int8), scale


def one_thing(w):
    return quantize_by_hand(w)[0]


def stub(w):
    return None


@pytest.mark.parametrize(
    "function, hint",
    [
        (per_tensor, "per-tensor"),
        (per_input_column, "one scale per input column"),
        (over_127, "not 127"),
        (no_clip, "clip to [-128, 127]"),
        (half_to_even, "round away from zero"),
        (truncated, "truncates toward zero"),
        (as_float, "stored as int8"),
        (scale_as_step_count, "the largest |w| divided by 128"),
        (scales_in_float16, "scales in float32, not torch.float16"),
        (per_tensor_repeated, "per-tensor"),
        (one_thing, "(q, scale)"),
        ("quantize", "give a function"),
    ],
)
def test_plausible_wrong_quantizers_are_refused(function, hint):
    result = check("07.4", function)
    assert not result and hint in result.message


def test_a_stub_is_not_attempted_yet():
    result = check("07.4", stub)
    assert not result and "not attempted yet" in result.message
    assert "not attempted yet" in check("07.3", None).message
