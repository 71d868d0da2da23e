"""Tests for the weight-name mapping between Qwen-VL-Chat (HF) and TensorRT-LLM's unified checkpoint."""

import pytest
import torch
import torch.nn.functional as F

from qwenvl_lab.layout import hf_name, is_visual, to_trtllm_names, trtllm_name

# The reference's table, row by row (layer 7 stands for any layer)
REFERENCE_TABLE = {
    "transformer.wte.weight": "transformer.vocab_embedding.weight",
    "transformer.h.7.ln_1.weight": "transformer.layers.7.input_layernorm.weight",
    "transformer.h.7.attn.c_attn.weight": "transformer.layers.7.attention.qkv.weight",
    "transformer.h.7.attn.c_attn.bias": "transformer.layers.7.attention.qkv.bias",
    "transformer.h.7.attn.c_proj.weight": "transformer.layers.7.attention.dense.weight",
    "transformer.h.7.ln_2.weight": "transformer.layers.7.post_layernorm.weight",
    "transformer.h.7.mlp.w1.weight": "transformer.layers.7.mlp.gate.weight",
    "transformer.h.7.mlp.w2.weight": "transformer.layers.7.mlp.fc.weight",
    "transformer.h.7.mlp.c_proj.weight": "transformer.layers.7.mlp.proj.weight",
    "transformer.ln_f.weight": "transformer.ln_f.weight",
    "lm_head.weight": "lm_head.weight",
}


@pytest.mark.parametrize("hf, trtllm", REFERENCE_TABLE.items())
def test_names_follow_the_reference_table(hf, trtllm):
    assert trtllm_name(hf) == trtllm
    assert hf_name(trtllm) == hf


def test_w1_is_gate_and_w2_is_fc():
    assert trtllm_name("transformer.h.0.mlp.w1.weight") == "transformer.layers.0.mlp.gate.weight"
    assert trtllm_name("transformer.h.31.mlp.w2.weight") == "transformer.layers.31.mlp.fc.weight"


def test_round_trip_for_every_language_model_key(tiny_model):
    keys = list(tiny_model.state_dict())
    lm_keys = [k for k in keys if not k.startswith("transformer.visual.")]
    assert len(lm_keys) == 3 + 8 * tiny_model.config.num_hidden_layers
    names = [trtllm_name(k) for k in lm_keys]
    assert len(set(names)) == len(names)
    assert [hf_name(n) for n in names] == lm_keys
    assert all(is_visual(k) for k in keys if k not in lm_keys)


def test_visual_keys_are_excluded(tiny_model):
    state = tiny_model.state_dict()
    renamed = to_trtllm_names(state)
    assert len(renamed) == 3 + 8 * tiny_model.config.num_hidden_layers
    assert not any("visual" in k for k in renamed)
    assert renamed["transformer.layers.1.mlp.fc.weight"] is state["transformer.h.1.mlp.w2.weight"]
    with pytest.raises(KeyError, match="vision weights stay out"):
        trtllm_name("transformer.visual.transformer.resblocks.0.attn.in_proj.weight")


@pytest.mark.parametrize(
    "key",
    [
        "transformer.h.0.mlp.w3.weight",
        "transformer.h.x.ln_1.weight",
        "lm_head.bias",
        "h.0.ln_1.weight",
        "transformer.h.0.ln_1.weight.extra",
    ],
)
def test_unknown_hf_keys(key):
    with pytest.raises(KeyError, match="not a Qwen-VL language-model weight"):
        trtllm_name(key)


@pytest.mark.parametrize(
    "key", ["transformer.layers.0.mlp.up.weight", "transformer.vocab_embedding.bias", "transformer.h.0.ln_1.weight"]
)
def test_unknown_trtllm_keys(key):
    with pytest.raises(KeyError, match="not a TensorRT-LLM QWen checkpoint weight"):
        hf_name(key)


def test_renamed_weights_compute_the_same_mlp_with_gated_mlp_math(tiny_model):
    """TensorRT-LLM's GatedMLP, proj(silu(fc(x)) * gate(x)), on the renamed weights equals Qwen's MLP."""
    weights = to_trtllm_names(tiny_model.state_dict())
    x = torch.randn(3, tiny_model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    fc, gate = weights["transformer.layers.0.mlp.fc.weight"], weights["transformer.layers.0.mlp.gate.weight"]
    proj = weights["transformer.layers.0.mlp.proj.weight"]
    gated_mlp = (F.silu(x @ fc.T) * (x @ gate.T)) @ proj.T
    with torch.no_grad():
        torch.testing.assert_close(gated_mlp, tiny_model.transformer.h[0].mlp(x))
