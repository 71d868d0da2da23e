"""Tests for step 7: loading and checking checkpoints in Qwen-VL-Chat's layout, and making tiny ones."""

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qwenvl_lab.checkpoint import (
    TINY_CONFIG,
    CheckpointError,
    load_checkpoint,
    load_config,
    make_tiny_checkpoint,
    read_state_dict,
    save_checkpoint,
)
from qwenvl_lab.modeling import QWenLMHeadModel, QWenVLConfig
from qwenvl_lab.tokenizing import load_tokenizer

INDEX = "model.safetensors.index.json"
LAYER_KEYS = [
    "ln_1.weight",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "ln_2.weight",
    "mlp.w1.weight",
    "mlp.w2.weight",
    "mlp.c_proj.weight",
]
VISUAL_BLOCK_KEYS = [
    f"{m}.{p}"
    for m in ("ln_1", "attn.in_proj", "attn.out_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    for p in ("weight", "bias")
]
VISUAL_KEYS = [
    "conv1.weight",
    "positional_embedding",
    "ln_pre.weight",
    "ln_pre.bias",
    "ln_post.weight",
    "ln_post.bias",
    "proj",
] + [
    f"attn_pool.{k}"
    for k in (
        "query",
        "pos_embed",
        "kv_proj.weight",
        "attn.in_proj_weight",
        "attn.in_proj_bias",
        "attn.out_proj.weight",
        "attn.out_proj.bias",
        "ln_q.weight",
        "ln_q.bias",
        "ln_kv.weight",
        "ln_kv.bias",
    )
]


def reference_key_names(layers: int, visual_layers: int) -> set[str]:
    """Every key of a Qwen-VL-Chat checkpoint, as the reference lists them."""
    keys = {"transformer.wte.weight", "transformer.ln_f.weight", "lm_head.weight"}
    keys |= {f"transformer.h.{layer}.{k}" for layer in range(layers) for k in LAYER_KEYS}
    keys |= {f"transformer.visual.{k}" for k in VISUAL_KEYS}
    keys |= {
        f"transformer.visual.transformer.resblocks.{j}.{k}" for j in range(visual_layers) for k in VISUAL_BLOCK_KEYS
    }
    return keys


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A ~3 MB checkpoint (vocab 512) in many shards, cheap to copy and damage."""
    torch.manual_seed(1)
    model = QWenLMHeadModel(QWenVLConfig(**{**TINY_CONFIG, "vocab_size": 512}))
    return save_checkpoint(model, tmp_path_factory.mktemp("small-qwen-vl"), max_shard_size="300KB"), model.state_dict()


@pytest.fixture
def damaged(small_checkpoint, tmp_path):
    """A fresh copy of the small checkpoint to damage."""
    return shutil.copytree(small_checkpoint[0], tmp_path / "ckpt")


def shard_of(checkpoint_dir, key: str) -> str:
    return json.loads((checkpoint_dir / INDEX).read_text())["weight_map"][key]


def edit_shard(checkpoint_dir, key: str, edit) -> None:
    """Rewrite the shard holding `key` after `edit(tensors)`."""
    path = checkpoint_dir / shard_of(checkpoint_dir, key)
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_load_checkpoint_equals_from_pretrained(tiny_checkpoint, tiny_model):
    reference = QWenLMHeadModel.from_pretrained(tiny_checkpoint).state_dict()
    loaded = load_checkpoint(tiny_checkpoint)
    assert not loaded.training and loaded.lm_head.weight.device.type == "cpu"
    state = loaded.state_dict()
    assert state.keys() == reference.keys() == tiny_model.state_dict().keys()
    for key, value in state.items():
        assert value.dtype == torch.float32 and torch.equal(value, reference[key]), key


def test_tiny_checkpoint_has_the_qwen_vl_chat_key_names(tiny_checkpoint):
    state = read_state_dict(tiny_checkpoint)
    for key in [
        "transformer.visual.attn_pool.attn.in_proj_weight",
        "transformer.visual.transformer.resblocks.0.attn.in_proj.weight",
        "transformer.h.0.mlp.w2.weight",
        "lm_head.weight",
        "transformer.wte.weight",
        "transformer.h.1.attn.c_attn.bias",
        "transformer.visual.attn_pool.pos_embed",
        "transformer.visual.positional_embedding",
        "transformer.visual.proj",
        "transformer.ln_f.weight",
    ]:
        assert key in state, key
    assert set(state) == reference_key_names(2, 2)
    assert not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])  # untied
    index = json.loads((tiny_checkpoint / INDEX).read_text())
    assert set(index["weight_map"]) == set(state)
    assert state["transformer.wte.weight"].shape == (151936, 128)
    assert state["transformer.h.0.attn.c_attn.weight"].shape == (3 * 128, 128)
    assert state["transformer.h.0.mlp.w1.weight"].shape == (256, 128)  # intermediate_size 512 // 2
    assert state["transformer.visual.attn_pool.query"].shape == (256, 128)


def test_qwen_vl_chat_size_has_853_tensors():
    with torch.device("meta"):
        model = QWenLMHeadModel(QWenVLConfig())
    state = model.state_dict()
    assert len(state) == 853
    assert set(state) == reference_key_names(32, 48)
    assert state["transformer.h.0.attn.c_attn.weight"].shape == (3 * 4096, 4096)
    assert state["transformer.h.0.attn.c_attn.bias"].shape == (3 * 4096,)
    assert state["transformer.h.0.mlp.w1.weight"].shape == state["transformer.h.0.mlp.w2.weight"].shape == (11008, 4096)
    assert state["transformer.h.0.mlp.c_proj.weight"].shape == (4096, 11008)
    assert state["lm_head.weight"].shape == (151936, 4096)
    assert state["transformer.visual.attn_pool.kv_proj.weight"].shape == (4096, 1664)
    assert state["transformer.visual.attn_pool.attn.in_proj_weight"].shape == (3 * 4096, 4096)
    lm = sum(v.numel() for k, v in state.items() if not k.startswith("transformer.visual."))
    visual = sum(v.numel() for k, v in state.items() if k.startswith("transformer.visual."))
    assert round(lm / 1e9, 2) == 7.72 and round(visual / 1e9, 2) == 1.94  # the reference's 7.72 B + 1.94 B


def test_tiny_checkpoint_files(tiny_checkpoint):
    config = load_config(tiny_checkpoint)
    assert config.hidden_size == TINY_CONFIG["hidden_size"] and config.visual == TINY_CONFIG["visual"]
    assert config.vocab_size == 151936 and config.visual["image_start_id"] == 151857
    assert len(load_tokenizer(tiny_checkpoint)) == 151860  # its qwen.tiktoken is the real vocabulary
    generation = json.loads((tiny_checkpoint / "generation_config.json").read_text())
    assert {
        k: generation[k]
        for k in (
            "chat_format",
            "eos_token_id",
            "pad_token_id",
            "max_window_size",
            "max_new_tokens",
            "do_sample",
            "top_k",
            "top_p",
        )
    } == dict(
        chat_format="chatml",
        eos_token_id=151643,
        pad_token_id=151643,
        max_window_size=6144,
        max_new_tokens=512,
        do_sample=True,
        top_k=0,
        top_p=0.3,
    )


def test_make_tiny_checkpoint_without_vocab(small_checkpoint, tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr("qwenvl_lab.checkpoint.save_checkpoint", lambda model, path, **kw: saved.append(path))
    make_tiny_checkpoint(tmp_path, with_vocab=False)
    assert saved == [tmp_path] and not (tmp_path / "qwen.tiktoken").exists()


def test_small_checkpoint_round_trip(small_checkpoint):
    path, state = small_checkpoint
    assert len(json.loads((path / INDEX).read_text())["weight_map"]) == 61
    assert len({shard_of(path, k) for k in state}) > 2  # really sharded
    loaded = load_checkpoint(path).state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_load_with_dtype(small_checkpoint):
    path, state = small_checkpoint
    model = load_checkpoint(path, dtype="bfloat16")
    assert {p.dtype for p in model.state_dict().values()} == {torch.bfloat16}
    assert torch.equal(model.transformer.h[1].mlp.w2.weight, state["transformer.h.1.mlp.w2.weight"].bfloat16())
    assert not model.transformer.visual.attn_pool.pos_embed.requires_grad


def test_deleted_key(damaged):
    edit_shard(damaged, "transformer.h.1.mlp.w2.weight", lambda t: t.pop("transformer.h.1.mlp.w2.weight"))
    with pytest.raises(CheckpointError, match=r"missing keys: \['transformer.h.1.mlp.w2.weight'\]"):
        load_checkpoint(damaged)


def test_mis_shaped_tensor(damaged):
    key = "transformer.visual.attn_pool.query"
    edit_shard(damaged, key, lambda t: t.update({key: torch.zeros(100, 128)}))
    with pytest.raises(
        CheckpointError, match=r"mis-shaped: .*attn_pool.query: expected \(256, 128\), found \(100, 128\)"
    ):
        load_checkpoint(damaged)


def test_unexpected_key(damaged):
    key = "transformer.h.0.ln_1.weight"
    edit_shard(damaged, key, lambda t: t.update({"transformer.h.0.attn.rotary_emb.inv_freq": torch.zeros(32)}))
    with pytest.raises(CheckpointError, match=r"unexpected keys: \['transformer.h.0.attn.rotary_emb.inv_freq'\]"):
        load_checkpoint(damaged)


def test_missing_shard(damaged):
    shard = shard_of(damaged, "transformer.h.0.mlp.c_proj.weight")
    (damaged / shard).unlink()
    with pytest.raises(CheckpointError, match=f"names shards that are missing: .*{shard}"):
        load_checkpoint(damaged)


def test_bin_shards_with_their_index(small_checkpoint, damaged):
    index = json.loads((damaged / INDEX).read_text())
    renamed = {}
    for shard in sorted(set(index["weight_map"].values())):
        bin_name = shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        torch.save(load_file(damaged / shard), damaged / bin_name)
        (damaged / shard).unlink()
        renamed[shard] = bin_name
    (damaged / INDEX).unlink()
    weight_map = {k: renamed[v] for k, v in index["weight_map"].items()}
    (damaged / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = load_checkpoint(damaged).state_dict()
    state = small_checkpoint[1]
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


def test_single_file_checkpoint(small_checkpoint, damaged):
    state = read_state_dict(damaged)
    for path in damaged.glob("model*.safetensors*"):
        path.unlink()
    save_file(state, damaged / "model.safetensors", metadata={"format": "pt"})
    loaded = load_checkpoint(damaged).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in small_checkpoint[1].items())


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found: .*nowhere"):
        load_checkpoint(tmp_path / "nowhere")


def test_directory_without_config_or_weights(damaged, tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)
    for path in damaged.glob("model*"):
        path.unlink()
    with pytest.raises(CheckpointError, match="no weights in .*model.safetensors.index.json"):
        load_checkpoint(damaged)


def test_config_with_the_original_files_extra_fields(damaged):
    config = json.loads((damaged / "config.json").read_text())
    config.update(
        auto_map={"AutoConfig": "configuration_qwen.QWenConfig"},
        use_flash_attn="auto",
        bf16=False,
        fp16=False,
        fp32=False,
        tokenizer_type="QWenTokenizer",
        transformers_version="4.31.0",
    )
    (damaged / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(damaged).config.visual == TINY_CONFIG["visual"]


def edit_json(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("hidden_size", "128", r"config.json has a value of the wrong type: hidden_size must be an int, got str '128'"),
        ("visual.heads", "2", r"config.json has a value of the wrong type: visual.heads must be an int, got str '2'"),
        (
            "layer_norm_epsilon",
            0,
            r"config.json has a value a Qwen-VL model cannot use: layer_norm_epsilon must be a finite",
        ),
        ("rotary_emb_base", -1, r"config.json has a value a Qwen-VL model cannot use: rotary_emb_base must be"),
        ("visual", "abc", r"config.json has a value of the wrong type: visual must be a dict"),
        ("id2label", 5, r"config.json has a value a Qwen-VL model cannot use"),  # a transformers field
    ],
)
def test_config_values_are_checked_with_the_file_named(damaged, key, value, match):
    def edit(config):
        *parents, last = key.split(".")
        for parent in parents:
            config = config[parent]
        config[last] = value

    edit_json(damaged / "config.json", edit)
    with pytest.raises(CheckpointError, match=f"{damaged}/{match}"):
        load_checkpoint(damaged)


@pytest.mark.parametrize("name", ["config.json", INDEX, "generation_config.json"])
@pytest.mark.parametrize("content", [b'{"hidden_size": 128,', b"\xff\xfe not text", b"[" * 100_000])
def test_invalid_json_names_the_file(damaged, name, content):
    (damaged / name).write_bytes(content)
    with pytest.raises(
        CheckpointError, match=f"{damaged / name} is not valid JSON .*re-download the file or repair it"
    ):
        load_checkpoint(damaged)


def test_config_and_index_of_the_wrong_json_shape(damaged):
    (damaged / INDEX).write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=f"{damaged / INDEX} has no weight_map"):
        load_checkpoint(damaged)
    (damaged / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="config.json must hold a JSON object, found list"):
        load_checkpoint(damaged)


def test_a_file_is_not_a_checkpoint_directory(damaged):
    with pytest.raises(NotADirectoryError, match="config.json' is a file; point at the checkpoint directory"):
        load_checkpoint(damaged / "config.json")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_safetensors_shard_names_the_file(damaged, damage):
    shard = damaged / shard_of(damaged, "transformer.h.0.mlp.w1.weight")
    data = shard.read_bytes()
    shard.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not weights " * 100, "empty": b""}[damage])
    with pytest.raises(CheckpointError, match=f"{shard} cannot be read as a weight file .*re-download it"):
        load_checkpoint(damaged)


class RunsCode:
    """A pickled object that would run a shell command when unpickled without weights_only."""

    def __reduce__(self):
        return (os.system, ("echo loaded",))


@pytest.mark.parametrize(
    "damage, match",
    [
        ("truncated", "cannot be read as a weight file .*it is truncated or damaged: re-download it"),
        ("garbage", "cannot be read as a weight file .*re-download it"),
        ("not_tensors", "is not a state dict of named tensors \\('weights' is not a weight name with a tensor\\)"),
        ("legacy", "is intact but in PyTorch's legacy .* format, which cannot be memory-mapped: convert it once with"),
        (
            "runs code",
            "holds Python objects other than tensors .*posix.system.*: refused, as loading it could run code",
        ),
    ],
)
def test_damaged_bin_file_names_the_file(small_checkpoint, tmp_path, damage, match):
    model = small_checkpoint[0]
    state = read_state_dict(model)
    target = shutil.copytree(model, tmp_path / "bin", ignore=shutil.ignore_patterns("model*"))
    path = target / "pytorch_model.bin"
    torch.save(state, path)
    data = path.read_bytes()
    if damage == "not_tensors":
        torch.save({"weights": [1, 2, 3]}, path)
    elif damage == "legacy":
        torch.save(state, path, _use_new_zipfile_serialization=False)
    elif damage == "runs code":
        torch.save({**state, "transformer.wte.weight": RunsCode()}, path)
    else:
        path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"x" * 1000)
    with pytest.raises(CheckpointError, match=f"{path} {match}") as err:
        load_checkpoint(target)
    assert "weights_only=False" not in str(err.value) and "weights_only` set to `False" not in str(err.value)
    if damage == "legacy":  # the command in the message converts the file, and the checkpoint then loads
        command = re.search(r"convert it once with: (.*?) \(", str(err.value))[1]
        subprocess.run([sys.executable, *shlex.split(command)[1:]], check=True)
        assert all(torch.equal(load_checkpoint(target).state_dict()[k], v) for k, v in state.items())


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weight_is_named_by_its_key(damaged, value):
    key = "transformer.h.1.attn.c_attn.weight"

    def poison(tensors):
        tensors[key][3, 5] = value

    edit_shard(damaged, key, poison)
    with pytest.raises(CheckpointError, match=f"weight {key} in .* holds {value} at index \\[3, 5\\]"):
        load_checkpoint(damaged)
    with pytest.raises(CheckpointError, match=f"weight {key} in"):
        read_state_dict(damaged)


@pytest.fixture
def nothing_opened(monkeypatch):
    """Fail the test if a weight file is opened."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a weight file was opened: {args}")

    monkeypatch.setattr("qwenvl_lab.checkpoint.safe_open", refuse)
    monkeypatch.setattr("qwenvl_lab.checkpoint.torch.load", refuse)


@pytest.mark.parametrize(
    "escape", ["/etc/passwd", "../outside.safetensors", "sub/../../outside.safetensors", "absolute", "symlink", "", 5]
)
def test_index_paths_outside_the_directory_are_refused(damaged, nothing_opened, escape):
    outside = damaged.parent / "outside.safetensors"
    shard = shard_of(damaged, "lm_head.weight")
    shutil.copyfile(damaged / shard, outside)  # a real shard: opening it would succeed
    if escape == "absolute":
        escape = str(outside)
    elif escape == "symlink":
        (damaged / "linked.safetensors").symlink_to(outside)
        escape = "linked.safetensors"
    edit_json(damaged / INDEX, lambda index: index["weight_map"].update({"lm_head.weight": escape}))
    with pytest.raises(CheckpointError, match=f"names the weight file {escape!r}"):
        load_checkpoint(damaged)


def test_hugging_face_cache_snapshot_links_into_its_blobs(small_checkpoint, tmp_path):
    repo = tmp_path / "models--Qwen--Qwen-VL-Chat"
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for path in small_checkpoint[0].iterdir():
        blob = repo / "blobs" / f"sha-{path.name}"
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(Path("../..") / "blobs" / blob.name)
    loaded = load_checkpoint(snapshot).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in small_checkpoint[1].items())


def test_save_checkpoint_replaces_only_a_checkpoint_in_one_step(tmp_path, tiny_checkpoint):

    model = load_checkpoint(tiny_checkpoint)
    out = tmp_path / "out"
    previous = os.umask(0o027)
    try:
        save_checkpoint(model, out, max_shard_size="60MB")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o750  # the umask's, not mkdtemp's 0700
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o640}
    with pytest.raises(FileExistsError, match="is not empty"):
        save_checkpoint(model, out)
    save_checkpoint(model, out, max_shard_size="60MB", overwrite=True)  # an earlier checkpoint, replaced whole
    assert load_checkpoint(out).config.hidden_size == model.config.hidden_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it
    (out / "config.json").write_text("{}")  # changed since the save wrote it: no longer the package's to delete
    with pytest.warns(UserWarning, match=r"out: kept config.json, which the package did not write .*: moved to"):
        save_checkpoint(model, out, max_shard_size="60MB", overwrite=True)
    assert load_checkpoint(out).config.hidden_size == model.config.hidden_size
    [kept] = [p for p in tmp_path.iterdir() if p.name != "out"]
    assert kept.name.startswith("out.kept-") and [p.name for p in kept.iterdir()] == ["config.json"]
    assert (kept / "config.json").read_text() == "{}"
