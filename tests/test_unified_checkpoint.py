"""Tests for step 9: the TensorRT-LLM unified checkpoint (names, tensor-parallel splits, config) and its round trip."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from qwenvl_lab.checkpoint import CheckpointError, read_state_dict
from qwenvl_lab.layout import trtllm_name
from qwenvl_lab.modeling import QWenVLConfig, apply_rope, rope_cos_sin
from qwenvl_lab.unified_checkpoint import (
    convert_to_trtllm_checkpoint,
    load_trtllm_checkpoint,
    read_trtllm_config,
    shard,
    trtllm_config,
    unshard,
)

V = 151936


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint, tiny_model, tmp_path_factory):
    """(checkpoint dir, fp32 model, {tp_size: fp32 TensorRT-LLM checkpoint dir})."""
    root = tmp_path_factory.mktemp("convert")
    converted = {
        tp: convert_to_trtllm_checkpoint(tiny_checkpoint, root / f"tp{tp}", dtype="float32", tp_size=tp)
        for tp in (1, 2)
    }
    return tiny_checkpoint, tiny_model, converted


def test_config_has_the_reference_fields_for_qwen_vl_chat():
    config = trtllm_config(QWenVLConfig(), dtype="float16", tp_size=2)  # defaults = Qwen-VL-Chat
    assert config["architecture"] == "QWenLMHeadModel" and config["qwen_type"] == "qwen"
    assert (config["dtype"], config["logits_dtype"]) == ("float16", "float32")
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (V, 4096, 32)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_size"]) == (32, 32, 128)
    assert config["intermediate_size"] == 22016  # the HF value, halved inside TensorRT-LLM
    assert (config["hidden_act"], config["position_embedding_type"]) == ("silu", "rope_gpt_neox")
    assert (config["rotary_base"], config["norm_epsilon"]) == (10000.0, 1e-6)
    assert (config["max_position_embeddings"], config["seq_length"]) == (8192, 2048)
    assert config["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    assert config["quantization"]["quant_algo"] is None
    assert json.loads(json.dumps(config)) == config  # plain JSON


@pytest.mark.parametrize("tp", [1, 2])
def test_rank_files_hold_the_language_model_only_with_split_shapes(tiny, tp):
    checkpoint, model, converted = tiny
    h, ff = model.config.hidden_size, model.config.intermediate_size // 2
    assert json.loads((converted[tp] / "config.json").read_text())["mapping"]["tp_size"] == tp
    hf = read_state_dict(checkpoint)
    names = {trtllm_name(k) for k in hf if not k.startswith("transformer.visual.")}
    for rank in range(tp):
        part = load_file(converted[tp] / f"rank{rank}.safetensors")
        assert set(part) == names  # every LM weight, no vision weight
        assert part["transformer.vocab_embedding.weight"].shape == (V, h)  # kept whole
        assert part["transformer.layers.0.attention.qkv.weight"].shape == (3 * h // tp, h)
        assert part["transformer.layers.0.attention.qkv.bias"].shape == (3 * h // tp,)
        assert part["transformer.layers.0.attention.dense.weight"].shape == (h, h // tp)
        assert part["transformer.layers.1.mlp.gate.weight"].shape == (ff // tp, h)
        assert part["transformer.layers.1.mlp.fc.weight"].shape == (ff // tp, h)
        assert part["transformer.layers.1.mlp.proj.weight"].shape == (h, ff // tp)
        assert part["lm_head.weight"].shape == (V // tp, h)
    assert not (converted[tp] / f"rank{tp}.safetensors").exists()


def test_w1_becomes_gate_and_w2_becomes_fc(tiny):
    checkpoint, model, converted = tiny
    part = load_file(converted[1] / "rank0.safetensors")
    mlp = model.transformer.h[0].mlp
    assert torch.equal(part["transformer.layers.0.mlp.gate.weight"], mlp.w1.weight)
    assert torch.equal(part["transformer.layers.0.mlp.fc.weight"], mlp.w2.weight)


def test_rank_parts_compute_the_layer_the_way_tensorrt_llm_does(tiny):
    """Each rank runs its heads and its MLP slice; the all-reduce (a sum) gives the HF layer's output."""
    _, model, converted = tiny
    cfg, block = model.config, model.transformer.h[0]
    parts = [load_file(converted[2] / f"rank{r}.safetensors") for r in range(2)]
    x = torch.randn(1, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(torch.arange(5)[None], cfg.kv_channels, cfg.rotary_emb_base, x.dtype)
    mask = torch.full((5, 5), float("-inf")).triu(1)

    def rank_attention(p):  # Attention with tp_size 2: qkv (ColumnLinear), heads, dense (RowLinear)
        qkv = F.linear(x, p["transformer.layers.0.attention.qkv.weight"], p["transformer.layers.0.attention.qkv.bias"])
        q, k, v = (t.view(1, 5, -1, cfg.kv_channels).transpose(1, 2) for t in qkv.chunk(3, -1))
        out = F.scaled_dot_product_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, attn_mask=mask)
        return F.linear(out.transpose(1, 2).reshape(1, 5, -1), p["transformer.layers.0.attention.dense.weight"])

    def rank_mlp(p):  # GatedMLP: proj(silu(fc(x)) * gate(x))
        fc = F.linear(x, p["transformer.layers.0.mlp.fc.weight"])
        gate = F.linear(x, p["transformer.layers.0.mlp.gate.weight"])
        return F.linear(F.silu(fc) * gate, p["transformer.layers.0.mlp.proj.weight"])

    with torch.no_grad():
        torch.testing.assert_close(sum(map(rank_attention, parts)), block.attn(x, cos, sin, mask, None))
        torch.testing.assert_close(sum(map(rank_mlp, parts)), block.mlp(x))
        logits = torch.cat([F.linear(x, p["lm_head.weight"]) for p in parts], dim=-1)  # gather_output=True
        torch.testing.assert_close(logits[..., :V], model.lm_head(x))


@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_gives_the_same_logits(tiny, tp):
    _, model, converted = tiny
    rebuilt = load_trtllm_checkpoint(converted[tp])
    assert not any(p.is_meta for p in rebuilt.parameters())
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(tp))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, model(ids).logits)
    for key, value in model.state_dict().items():
        if not key.startswith("transformer.visual."):
            assert torch.equal(rebuilt.state_dict()[key], value), key


def test_float16_conversion_stays_close(tiny, tmp_path):
    checkpoint, model, _ = tiny
    out = convert_to_trtllm_checkpoint(checkpoint, tmp_path / "fp16", dtype="float16", tp_size=2)
    assert {t.dtype for t in load_file(out / "rank1.safetensors").values()} == {torch.float16}
    assert load_trtllm_checkpoint(out).transformer.wte.weight.dtype == torch.float16
    rebuilt = load_trtllm_checkpoint(out, dtype="float32")
    ids = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, model(ids).logits, rtol=1e-2, atol=5e-3)


def test_vision_tower_comes_from_hf_dir_or_refuses_to_run(tiny):
    checkpoint, model, converted = tiny
    pixels = torch.randn(1, 3, 56, 56)
    with_tower = load_trtllm_checkpoint(converted[2], hf_dir=checkpoint)
    with torch.no_grad():
        assert torch.equal(with_tower.transformer.visual(pixels), model.transformer.visual(pixels))
    without = load_trtllm_checkpoint(converted[1])
    with pytest.raises(ValueError, match="holds no vision weights: pass hf_dir"):
        without.transformer.visual(torch.zeros(1, 3, 28, 28))


def test_shard_pads_the_vocabulary_to_a_multiple_of_tp():
    lm_head = torch.arange(10.0).reshape(5, 2)  # 5 rows, tp 2 → 3 + 3 rows, the last one zero
    parts = [shard("lm_head.weight", lm_head, 2, r) for r in range(2)]
    assert [p.shape[0] for p in parts] == [3, 3] and torch.equal(parts[1][-1], torch.zeros(2))
    assert torch.equal(unshard("lm_head.weight", parts, vocab_size=5), lm_head)


def test_qkv_is_split_per_head_for_each_of_q_k_v():
    h, tp = 4, 2  # q rows 0-3, k rows 4-7, v rows 8-11
    qkv = torch.arange(3 * h).float()[:, None].expand(-1, 2)
    parts = [shard("transformer.layers.0.attention.qkv.weight", qkv, tp, r)[:, 0].tolist() for r in range(tp)]
    assert parts == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 11]]


def test_bad_inputs_get_clear_errors(tiny, tmp_path):
    checkpoint, _, converted = tiny
    with pytest.raises(ValueError, match="tp_size 3 must divide the 2 attention heads"):
        convert_to_trtllm_checkpoint(checkpoint, tmp_path / "x", tp_size=3)
    with pytest.raises(ValueError, match="dtype must be one of"):
        convert_to_trtllm_checkpoint(checkpoint, tmp_path / "x", dtype="int8")
    with pytest.raises(ValueError, match="tp_size must be a positive int"):
        convert_to_trtllm_checkpoint(checkpoint, tmp_path / "x", tp_size=0)
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        convert_to_trtllm_checkpoint(tmp_path / "nowhere", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="convert_to_trtllm_checkpoint"):
        load_trtllm_checkpoint(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((converted[2] / "config.json").read_text())
    (broken / "rank0.safetensors").write_bytes((converted[2] / "rank0.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"lacks \['rank1.safetensors'\]"):
        read_trtllm_config(broken)
    (broken / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM"}))
    with pytest.raises(CheckpointError, match="not a Qwen"):
        read_trtllm_config(broken)


def test_a_checkpoint_named_the_older_way_still_loads(tiny, tmp_path):
    """Both names map to TensorRT-LLM's QWenForCausalLM (tensorrt_llm/models/__init__.py, MODEL_MAP)."""
    _, model, converted = tiny
    older = tmp_path / "older"
    older.mkdir()
    config = json.loads((converted[1] / "config.json").read_text())
    (older / "config.json").write_text(json.dumps(dict(config, architecture="QWenForCausalLM")))
    (older / "rank0.safetensors").write_bytes((converted[1] / "rank0.safetensors").read_bytes())
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(load_trtllm_checkpoint(older)(ids).logits, load_trtllm_checkpoint(converted[1])(ids).logits)


def test_a_checkpoint_missing_weights_is_refused(tiny, tmp_path):

    checkpoint, model, _ = tiny
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    save_file({"lm_head.weight": model.lm_head.weight.detach()}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing keys"):
        convert_to_trtllm_checkpoint(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_conversion_replaces_only_a_conversion_of_this_package(tiny_checkpoint, tmp_path):
    out = convert_to_trtllm_checkpoint(tiny_checkpoint, tmp_path / "trt", "float32")
    with pytest.raises(FileExistsError, match="already holds a TensorRT-LLM checkpoint: pass overwrite=True"):
        convert_to_trtllm_checkpoint(tiny_checkpoint, out, "float32")
    (out / ".qwenvl-lab-made").unlink()  # converted before the package marked its folders: recognised by its content
    convert_to_trtllm_checkpoint(tiny_checkpoint, out, "float16", overwrite=True)
    assert read_trtllm_config(out)["dtype"] == "float16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trt"]
    (out / "notes.txt").write_text("mine")
    (out / ".qwenvl-lab-made").unlink()
    with pytest.raises(FileExistsError, match="holds no TensorRT-LLM checkpoint this package wrote"):
        convert_to_trtllm_checkpoint(tiny_checkpoint, out, "float32", overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
