"""Building the engine: the limits are checked, and the directory holds the LM in TensorRT-LLM's layout and dtype."""

import json

import pytest
import torch
from safetensors.torch import load_file

from qwenvl_lab.checkpoint import CheckpointError, read_state_dict
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_engine_config, load_vision_tower
from qwenvl_lab.engine.build import ENGINE_VERSION
from qwenvl_lab.layout import to_trtllm_names


@pytest.mark.parametrize("kwargs, match", [
    ({"max_batch_size": 0}, "max_batch_size must be a positive int"),
    ({"max_input_len": True}, "max_input_len must be a positive int"),
    ({"max_beam_width": 1.5}, "max_beam_width must be a positive int"),
    ({"max_prompt_embedding_table_size": -256}, "max_prompt_embedding_table_size must be an int >= 0"),
    ({"max_input_len": 600, "max_seq_len": 500}, "max_input_len 600 exceeds max_seq_len 500"),
    ({"max_prompt_embedding_table_size": 100}, "100 rows cannot hold one image \\(256 rows\\)"),
    ({"max_input_len": 200, "max_prompt_embedding_table_size": 256}, "cannot hold one image span \\(258 ids"),
    ({"dtype": "float64"}, "dtype must be one of"),
])
def test_build_config_rejects_impossible_limits(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BuildConfig(**kwargs)


def test_build_config_defaults_and_dtypes():
    config = BuildConfig(dtype=torch.bfloat16)
    assert config.dtype == "bfloat16" and config.torch_dtype is torch.bfloat16
    assert config.max_prompt_embedding_table_size == 0  # like trtllm-build: no table unless asked


def test_engine_directory_layout(tiny_checkpoint, tiny_engine):
    config = json.loads((tiny_engine / "config.json").read_text())
    assert config["version"] == ENGINE_VERSION
    assert config["build_config"]["max_prompt_embedding_table_size"] == 4096
    assert config["pretrained_config"]["architecture"] == "QWenForCausalLM"
    state = read_state_dict(tiny_checkpoint)
    llm = load_file(str(tiny_engine / "llm" / "rank0.safetensors"))
    expected = to_trtllm_names(state)
    assert llm.keys() == expected.keys() and not any("visual" in k for k in llm)
    assert all(torch.equal(llm[k], expected[k]) for k in llm)  # qkv stays fused as in c_attn
    assert llm["transformer.layers.0.attention.qkv.weight"].shape == (3 * 128, 128)
    vision = load_file(str(tiny_engine / "vision" / "model.safetensors"))
    assert all(torch.equal(v, state["transformer.visual." + k]) for k, v in vision.items())
    assert (tiny_engine / "qwen.tiktoken").is_file()


def test_engine_weights_are_in_the_engine_dtype(tiny_checkpoint, tmp_path):
    engine_dir = build_engine(tiny_checkpoint, tmp_path / "fp16", BuildConfig(max_input_len=64, max_seq_len=64,
                                                                              dtype="float16"))
    llm = load_file(str(engine_dir / "llm" / "rank0.safetensors"))
    state = to_trtllm_names(read_state_dict(tiny_checkpoint))
    assert all(t.dtype == torch.float16 and torch.equal(t, state[k].half()) for k, t in llm.items())
    runner = ModelRunner.from_dir(engine_dir)
    assert runner.dtype == torch.float16 and runner.engine.kv_cache.dtype == torch.float16
    assert runner.engine.kv_cache.shape == (2, 2, 8, 2, 64, 64)  # [layers, K/V, max_batch, heads, max_seq_len, hd]
    assert load_vision_tower(engine_dir).conv1.weight.dtype == torch.float16


def test_vision_part_encodes_like_the_model(tiny_engine, tiny_model, image_files):
    pictures = [image_files["red"], image_files["noise"]]
    with torch.inference_mode():
        assert torch.equal(load_vision_tower(tiny_engine).encode(pictures), tiny_model.transformer.visual.encode(pictures))


def test_limits_that_do_not_fit_the_model(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="max_seq_len 9000 exceeds the model's max_position_embeddings 8192"):
        build_engine(tiny_checkpoint, tmp_path / "e", BuildConfig(max_seq_len=9000))
    with pytest.warns(UserWarning, match="max_seq_len 3072 > seq_length 2048: .* dynamic NTK"):
        build_engine(tiny_checkpoint, tmp_path / "long", BuildConfig(max_batch_size=1, max_seq_len=3072))
    with pytest.raises(TypeError, match="build_config must be a BuildConfig"):
        build_engine(tiny_checkpoint, tmp_path / "e", {"max_batch_size": 8})


def test_loading_checks_the_directory(tiny_engine, tmp_path):
    with pytest.raises(FileNotFoundError, match="build the engine first"):
        ModelRunner.from_dir(tmp_path)
    config = json.loads((tiny_engine / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "version": "qwenvl-lab-engine/0"}))
    with pytest.raises(CheckpointError, match="engine version 'qwenvl-lab-engine/0'"):
        load_engine_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="rank0.safetensors is missing"):
        load_engine_config(tmp_path)
