"""Building the engine: the limits are checked, and the directory holds the LM in TensorRT-LLM's layout and dtype."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qwenvl_lab.checkpoint import CheckpointError, read_state_dict
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_engine_config, load_engine_vision_tower
from qwenvl_lab.engine import build as build_module
from qwenvl_lab.engine.build import ENGINE_VERSION
from qwenvl_lab.layout import to_trtllm_names


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_batch_size": 0}, "max_batch_size must be a positive int"),
        ({"max_input_len": True}, "max_input_len must be a positive int"),
        ({"max_beam_width": 1.5}, "max_beam_width must be a positive int"),
        ({"max_prompt_embedding_table_size": -256}, "max_prompt_embedding_table_size must be an int >= 0"),
        ({"max_input_len": 600, "max_seq_len": 500}, "max_input_len 600 exceeds max_seq_len 500"),
        ({"max_prompt_embedding_table_size": 100}, "100 rows cannot hold one image \\(256 rows\\)"),
        ({"max_input_len": 200, "max_prompt_embedding_table_size": 256}, "cannot hold one image span \\(258 ids"),
        ({"dtype": "float64"}, "dtype must be one of"),
    ],
)
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
    assert config["pretrained_config"]["architecture"] == "QWenLMHeadModel"
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
    engine_dir = build_engine(
        tiny_checkpoint, tmp_path / "fp16", BuildConfig(max_input_len=64, max_seq_len=64, dtype="float16")
    )
    llm = load_file(str(engine_dir / "llm" / "rank0.safetensors"))
    state = to_trtllm_names(read_state_dict(tiny_checkpoint))
    assert all(t.dtype == torch.float16 and torch.equal(t, state[k].half()) for k, t in llm.items())
    runner = ModelRunner.from_dir(engine_dir)
    assert runner.dtype == torch.float16 and runner.engine.kv_cache.dtype == torch.float16
    assert runner.engine.kv_cache.shape == (2, 2, 8, 2, 64, 64)  # [layers, K/V, max_batch, heads, max_seq_len, hd]
    assert load_engine_vision_tower(engine_dir).conv1.weight.dtype == torch.float16


def test_vision_part_encodes_like_the_model(tiny_engine, tiny_model, image_files):
    pictures = [image_files["red"], image_files["noise"]]
    with torch.inference_mode():
        assert torch.equal(
            load_engine_vision_tower(tiny_engine).encode(pictures), tiny_model.transformer.visual.encode(pictures)
        )


def test_limits_that_do_not_fit_the_model(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="max_seq_len 9000 exceeds the model's max_position_embeddings 8192"):
        build_engine(tiny_checkpoint, tmp_path / "e", BuildConfig(max_seq_len=9000))
    with pytest.warns(UserWarning, match="max_seq_len 3072 > seq_length 2048: .* dynamic NTK"):
        build_engine(tiny_checkpoint, tmp_path / "long", BuildConfig(max_batch_size=1, max_seq_len=3072))
    with pytest.raises(TypeError, match="build_config must be a BuildConfig"):
        build_engine(tiny_checkpoint, tmp_path / "e", {"max_batch_size": 8})


def test_loading_checks_the_directory(tiny_engine, tmp_path):
    with pytest.raises(FileNotFoundError, match="build the engine first"):
        ModelRunner.from_dir(tmp_path / "none")
    config = json.loads((tiny_engine / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "version": "qwenvl-lab-engine/0"}))
    with pytest.raises(CheckpointError, match="engine version 'qwenvl-lab-engine/0'.*rebuild it"):
        load_engine_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="has no manifest.json: the build did not finish"):
        load_engine_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON .*rebuild it"):
        load_engine_config(tmp_path)


SMALL = BuildConfig(max_batch_size=1, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=256)


def copy_of(engine_dir, tmp_path):
    """A copy of an engine directory to damage."""
    return Path(shutil.copytree(engine_dir, tmp_path / "copy"))


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda e: (e / "manifest.json").unlink(), "no manifest.json"),
        (lambda e: (e / "llm" / "rank0.safetensors").unlink(), "rank0.safetensors is missing"),
        (
            lambda e: (e / "vision" / "model.safetensors").write_bytes(
                (e / "vision" / "model.safetensors").read_bytes()[:-100]
            ),
            "model.safetensors has .* bytes, the build wrote",
        ),
        (
            lambda e: (e / "llm" / "config.json").write_text(
                (e / "llm" / "config.json").read_text().replace('"hidden_size": 128', '"hidden_size": 256')
            ),
            "llm/config.json was changed after the build",
        ),
        (
            lambda e: (e / "config.json").write_text(
                json.dumps({**json.loads((e / "config.json").read_text()), "build_config": {"max_batch_size": 2}})
            ),
            "build_config differs from the one the engine was built with",
        ),
        (lambda e: (e / "manifest.json").write_text("[]"), "must hold a JSON object"),
    ],
)
def test_an_incomplete_or_changed_engine_is_refused(tiny_engine, tmp_path, damage, match):
    engine = copy_of(tiny_engine, tmp_path)
    ModelRunner.from_dir(engine)  # intact: loads
    damage(engine)
    with pytest.raises(CheckpointError, match=match):
        ModelRunner.from_dir(engine)


def test_the_checkpoint_is_never_the_engine_directory(tiny_checkpoint, tmp_path):
    before = {p.name: p.read_bytes() for p in tiny_checkpoint.iterdir() if p.is_file()}
    for target in (tiny_checkpoint, tiny_checkpoint / "engine", tiny_checkpoint.parent):
        with pytest.raises(ValueError, match="would overwrite the checkpoint"):
            build_engine(tiny_checkpoint, target, SMALL, overwrite=True)
    assert {p.name: p.read_bytes() for p in tiny_checkpoint.iterdir() if p.is_file()} == before


def test_a_directory_of_other_files_is_refused(tiny_checkpoint, tmp_path):
    target = tmp_path / "notes"
    target.mkdir()
    (target / "config.json").write_text('{"mine": true}')
    (target / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="notes holds a config.json that is not an engine of this package"):
        build_engine(tiny_checkpoint, target, SMALL, overwrite=True)
    (target / "config.json").unlink()
    with pytest.raises(FileExistsError, match=r"not empty and holds no engine of this package \(todo.txt\)"):
        build_engine(tiny_checkpoint, target, SMALL, overwrite=True)
    assert (target / "todo.txt").read_text() == "keep me"
    with pytest.raises(NotADirectoryError, match="is a file"):
        build_engine(tiny_checkpoint, target / "todo.txt", SMALL)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (build_engine(tiny_checkpoint, empty, SMALL) / "manifest.json").is_file()


def test_rebuilding_needs_overwrite_and_replaces_the_engine_whole(tiny_checkpoint, tmp_path):
    engine = build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    with pytest.raises(FileExistsError, match="already holds an engine: pass overwrite=True"):
        build_engine(tiny_checkpoint, engine, SMALL)
    (engine / "stray.txt").write_text("from the old engine")
    bigger = BuildConfig(max_batch_size=2, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=512)
    build_engine(tiny_checkpoint, engine, bigger, overwrite=True)
    assert load_engine_config(engine)[0] == bigger and not (engine / "stray.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]  # no temporary directories left


def test_a_failed_build_leaves_the_previous_engine_as_it_was(tiny_checkpoint, tmp_path, monkeypatch):
    engine = build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    before = {p.relative_to(engine): p.read_bytes() for p in engine.rglob("*") if p.is_file()}

    def fail(*args, **kwargs):
        raise RuntimeError("the vision tower failed half-way")

    monkeypatch.setattr(build_module, "load_visual_tower", fail)  # after llm/ was written
    with pytest.raises(RuntimeError, match="half-way"):
        build_engine(
            tiny_checkpoint,
            engine,
            BuildConfig(max_batch_size=2, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=512),
            overwrite=True,
        )
    assert {p.relative_to(engine): p.read_bytes() for p in engine.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]  # the half-written copy is gone
    assert load_engine_config(engine)[0] == SMALL


def test_a_killed_builds_leftovers_are_removed_by_the_next_build(tiny_checkpoint, tmp_path):
    leftover = tmp_path / ".engine.k3j9.tmp"  # what a build killed before its rename leaves beside the engine
    (leftover / "llm").mkdir(parents=True)
    (leftover / "llm" / "rank0.safetensors").write_bytes(b"half")
    build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]
