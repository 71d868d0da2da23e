"""Building the engine: the limits are checked, and the directory holds the LM in TensorRT-LLM's layout and dtype."""

import json
import os
import shutil
import stat
import struct
import threading
from pathlib import Path

import pytest
import torch
from conftest import refuse_writes_in
from safetensors import SafetensorError
from safetensors.torch import load_file

import qwenvl_lab.limits
from qwenvl_lab.checkpoint import (
    CheckpointError,
    load_checkpoint,
    make_tiny_checkpoint,
    read_state_dict,
    save_checkpoint,
)
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_engine_config, load_engine_vision_tower
from qwenvl_lab.engine import build as build_module
from qwenvl_lab.engine.build import ENGINE_VERSION, verify_engine
from qwenvl_lab.infer import QWenInfer
from qwenvl_lab.layout import to_trtllm_names


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be an int >= 1, got 0"),
        ({"max_input_len": True}, TypeError, "max_input_len must be an int, got bool"),
        ({"max_beam_width": 1.5}, TypeError, "max_beam_width must be an int, got float"),
        ({"max_prompt_embedding_table_size": -256}, ValueError, "max_prompt_embedding_table_size must be an int >= 0"),
        ({"max_input_len": 600, "max_seq_len": 500}, ValueError, "max_input_len 600 exceeds max_seq_len 500"),
        ({"max_prompt_embedding_table_size": 100}, ValueError, "100 rows cannot hold one image \\(256 rows\\)"),
        (
            {"max_input_len": 200, "max_prompt_embedding_table_size": 256},
            ValueError,
            "cannot hold one image span \\(258 ids",
        ),
        ({"dtype": "float64"}, ValueError, "dtype must be one of"),
    ],
)
def test_build_config_rejects_impossible_limits(kwargs, error, match):
    with pytest.raises(error, match=match):
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


def beside(folder: Path) -> list[str]:
    """What a folder holds, but the builds' lock files."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_rebuilding_needs_overwrite_and_replaces_the_engine_whole(tiny_checkpoint, tmp_path):
    engine = build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    with pytest.raises(FileExistsError, match="already holds an engine: pass overwrite=True"):
        build_engine(tiny_checkpoint, engine, SMALL)
    (engine / "tuning.json").write_text("{}")  # the runner's tuned kernel choices, beside the engine
    (engine / "llm" / ".DS_Store").write_bytes(b"")  # what macOS's Finder leaves in a folder it showed
    bigger = BuildConfig(max_batch_size=2, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=512)
    build_engine(tiny_checkpoint, engine, bigger, overwrite=True)
    assert load_engine_config(engine)[0] == bigger and not (engine / "tuning.json").exists()
    assert beside(tmp_path) == ["engine"]  # no temporary directories left


def test_overwrite_replaces_only_what_the_builder_wrote(tiny_checkpoint, tmp_path):
    work = tmp_path / "w"  # a folder of the user's that happens to hold a manifest.json
    (work / "src").mkdir(parents=True)
    (work / "manifest.json").write_text("{}")
    (work / "src" / "app.js").write_text("code")
    with pytest.raises(FileExistsError, match=r"w is not empty and holds no engine of this package \(manifest.json"):
        build_engine(tiny_checkpoint, work, SMALL, overwrite=True)
    forged = {"format": build_module.ENGINE_VERSION, "files": {"src/app.js": {"bytes": 4}}}
    (work / "manifest.json").write_text(json.dumps(forged))  # a manifest's word is not enough
    with pytest.raises(FileExistsError, match=r"holds files the engine builder did not write \(src/app.js\)"):
        build_engine(tiny_checkpoint, work, SMALL, overwrite=True)
    assert (work / "src" / "app.js").read_text() == "code"
    engine = build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    (engine / "notes.txt").write_text("mine")
    (engine / "llm" / "extra").mkdir()
    with pytest.raises(FileExistsError, match=r"did not write \(llm/extra/, notes.txt\): move them out"):
        build_engine(tiny_checkpoint, engine, SMALL, overwrite=True)
    assert (engine / "notes.txt").read_text() == "mine" and (engine / "llm" / "extra").is_dir()
    ModelRunner.from_dir(engine)  # untouched


def test_concurrent_builds_never_delete_each_others_work(tiny_checkpoint, tmp_path, monkeypatch):
    half_way, go_on = threading.Event(), threading.Event()
    vision_tower = build_module.load_visual_tower

    def slow(*args, **kwargs):  # the build of e.v2 waits with its llm/ written in its temporary folder
        if threading.current_thread().name == "slow":
            half_way.set()
            go_on.wait(120)
        return vision_tower(*args, **kwargs)

    monkeypatch.setattr(build_module, "load_visual_tower", slow)
    errors = []
    slow_build = threading.Thread(
        name="slow", target=lambda: errors.extend(_raised(build_engine, tiny_checkpoint, tmp_path / "e.v2", SMALL))
    )
    slow_build.start()
    try:
        assert half_way.wait(120)
        build_engine(tiny_checkpoint, tmp_path / "e", SMALL)  # a sibling, meanwhile
        with pytest.raises(FileExistsError, match=r"another build is writing .*e.v2 now: wait for it to finish"):
            build_engine(tiny_checkpoint, tmp_path / "e.v2", SMALL, overwrite=True)
    finally:
        go_on.set()
        slow_build.join(120)
    assert errors == []
    for name in ("e", "e.v2"):
        ModelRunner.from_dir(tmp_path / name)
    assert beside(tmp_path) == ["e", "e.v2"]


def _raised(call, *args, **kwargs) -> list:
    try:
        call(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - reported by the test
        return [err]
    return []


def test_building_into_a_symlinked_folder_writes_where_it_points(tiny_checkpoint, tmp_path, monkeypatch):
    disk, link = tmp_path / "disk", tmp_path / "engine"
    disk.mkdir()
    link.symlink_to(disk / "engines", target_is_directory=True)
    monkeypatch.setattr(build_module, "convert_to_trtllm_checkpoint", _not_now)
    with pytest.raises(FileNotFoundError, match=r"engine is a symbolic link to .*engines, which does not exist"):
        build_engine(tiny_checkpoint, link, SMALL)  # refused before building anything
    monkeypatch.undo()
    (disk / "engines").mkdir()
    for overwrite in (False, True):
        build_engine(tiny_checkpoint, link, SMALL, overwrite=overwrite)
        assert link.is_symlink() and (disk / "engines" / "manifest.json").is_file()
    ModelRunner.from_dir(link)
    assert beside(tmp_path) == ["disk", "engine"] and beside(disk) == ["engines"]


def _not_now(*args, **kwargs):
    raise AssertionError("the build started")


def test_the_current_folder_is_refused_before_the_build(tiny_checkpoint, tmp_path, monkeypatch):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setattr(build_module, "convert_to_trtllm_checkpoint", _not_now)
    for target in (".", "./", tmp_path / "here", ".."):
        with pytest.raises(ValueError, match=r"the current directory .*: give a new directory, e.g. \./engine"):
            build_engine(tiny_checkpoint, target, SMALL)


@pytest.mark.parametrize("umask, folders, files", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)])
def test_engine_folders_and_files_follow_the_umask(tiny_checkpoint, tmp_path, umask, folders, files):
    previous = os.umask(umask)
    try:
        engine = build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    finally:
        os.umask(previous)
    for path in [engine, *engine.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (folders if path.is_dir() else files), path


def test_a_full_disk_or_a_read_only_folder_is_one_clear_error(tiny_checkpoint, tmp_path, monkeypatch):
    engine = build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    before = {p.relative_to(engine): p.read_bytes() for p in engine.rglob("*") if p.is_file()}

    def full(*args, **kwargs):
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )

    monkeypatch.setattr(build_module, "save_file", full)
    full_disk = rf"could not write {engine} \(no space left on the device of {tmp_path}\): free some space"
    with pytest.raises(OSError, match=full_disk) as err:
        build_engine(tiny_checkpoint, engine, SMALL, overwrite=True)
    assert "\n" not in str(err.value) and ".tmp" not in str(err.value)
    monkeypatch.undo()
    refuse_writes_in(monkeypatch, tmp_path)
    with pytest.raises(
        PermissionError, match=rf"cannot write {engine} in {tmp_path} \(permission denied\): give a directory"
    ) as err:
        build_engine(tiny_checkpoint, engine, SMALL, overwrite=True)
    assert ".tmp" not in str(err.value) and ".lock" not in str(err.value)
    monkeypatch.undo()
    assert {p.relative_to(engine): p.read_bytes() for p in engine.rglob("*") if p.is_file()} == before
    assert beside(tmp_path) == ["engine"]


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
    assert beside(tmp_path) == ["engine"]  # the half-written copy is gone
    assert load_engine_config(engine)[0] == SMALL


def test_a_killed_builds_leftovers_are_removed_by_the_next_build_and_nothing_else(tiny_checkpoint, tmp_path):
    leftover = tmp_path / ".engine.k3j9.tmp"  # what a build killed before its rename leaves beside the engine
    (leftover / "llm").mkdir(parents=True)
    (leftover / "llm" / "rank0.safetensors").write_bytes(b"half")
    mark = {"made_by": "qwenvl-lab", "writer": "engine", "staging": True, "target": "engine", "pid": 1}
    (leftover / ".qwenvl-lab-made").write_text(json.dumps(mark))  # its mark, written first; its writer is gone
    for name in (".engine.old.tmp", ".engine.backup-2024.tmp"):  # the user's, named alike, without the mark
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text("mine")
    build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    assert beside(tmp_path) == [".engine.backup-2024.tmp", ".engine.old.tmp", "engine"]
    assert all((tmp_path / name / "keep.txt").read_text() == "mine" for name in beside(tmp_path)[:2])


def damage_in_place(path: Path, where: float) -> None:
    """Write NaN over 4 bytes of a safetensors file's tensor data at fraction `where` of it, the size unchanged."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # past the JSON header
    k = start + int((len(data) - start - 4) * where) // 4 * 4
    data[k : k + 4] = struct.pack("<f", float("nan"))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["llm/rank0.safetensors", "vision/model.safetensors"])
def test_an_engine_changed_in_place_is_refused(tiny_engine, tmp_path, name):
    engine = copy_of(tiny_engine, tmp_path)
    damage_in_place(engine / name, 0.5)
    with pytest.raises(CheckpointError, match=rf"{name} was changed after the build \(its checksum differs\)"):
        ModelRunner.from_dir(engine)
    if name.startswith("vision"):
        with pytest.raises(CheckpointError, match="was changed after the build"):
            load_engine_vision_tower(engine)


def test_a_quick_check_reads_sizes_small_files_and_the_ends_of_large_ones(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(build_module, "CHUNK_BYTES", 64 * 1024)  # so that the tiny engine's weights span many chunks
    engine = build_engine(tiny_checkpoint, tmp_path / "engine", SMALL)
    manifest = json.loads((engine / "manifest.json").read_text())
    weights = engine / "llm" / "rank0.safetensors"
    assert manifest["chunk_bytes"] == 64 * 1024 and len(manifest["files"]["llm/rank0.safetensors"]["sha256"]) > 3
    damage_in_place(weights, 0.5)  # a middle chunk: the quick check does not read it, the full one does
    ModelRunner.from_dir(engine, verify="quick")
    with pytest.raises(CheckpointError, match="rank0.safetensors was changed after the build"):
        ModelRunner.from_dir(engine, verify="full")
    with pytest.raises(CheckpointError, match="rank0.safetensors was changed after the build"):
        verify_engine(engine)  # on demand, after a quick load
    data = bytearray(weights.read_bytes())
    data[20] ^= 1  # the header: every tensor's name, dtype, shape and offsets
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="rank0.safetensors was changed after the build"):
        ModelRunner.from_dir(engine, verify="quick")
    with pytest.raises(ValueError, match="verify must be 'full', 'quick' or 'none'"):
        ModelRunner.from_dir(engine, verify=True)


# one way to delete: only what the build made; readers see one build; what a build cannot be


def test_a_file_written_into_the_engine_during_a_rebuild_is_kept_and_said(tiny_checkpoint, tmp_path, monkeypatch):
    engine = build_engine(tiny_checkpoint, tmp_path / "e1", SMALL)
    convert = build_module.convert_to_trtllm_checkpoint

    def meanwhile(*args, **kwargs):  # the user saves notes into the engine folder while it is being rebuilt
        (engine / "notes.txt").write_text("mine")
        return convert(*args, **kwargs)

    monkeypatch.setattr(build_module, "convert_to_trtllm_checkpoint", meanwhile)
    with pytest.warns(
        UserWarning, match=r"e1: kept notes.txt, which the package did not write .*: moved to .*e1\.kept-"
    ):
        build_engine(tiny_checkpoint, engine, SMALL, overwrite=True)
    [kept] = [p for p in tmp_path.iterdir() if p.name.startswith("e1.kept-")]
    assert [p.name for p in kept.iterdir()] == ["notes.txt"] and (kept / "notes.txt").read_text() == "mine"
    assert load_engine_config(engine)[0] == SMALL and not (engine / "notes.txt").exists()


def test_a_rebuild_between_the_check_and_the_load_cannot_mix_two_builds(tiny_checkpoint, tmp_path, monkeypatch):
    """The race of a reader and `build --overwrite`, made deterministic: a whole rebuild (other weights) runs right
    after the loader checked the checksums and before it reads the weights."""
    first = build_engine(tiny_checkpoint, tmp_path / "e", SMALL)
    expected_llm = load_file(str(first / "llm" / "rank0.safetensors"))
    expected_vision = load_file(str(first / "vision" / "model.safetensors"))
    other = make_tiny_checkpoint(tmp_path / "other", seed=1)
    check = build_module._check_files
    rebuilt = []

    def check_then_rebuild(*args, **kwargs):
        check(*args, **kwargs)
        if not rebuilt:
            rebuilt.append(build_engine(other, first, SMALL, overwrite=True))

    monkeypatch.setattr(build_module, "_check_files", check_then_rebuild)
    infer = QWenInfer.from_dir(first)
    weights = infer.runner.engine.vocab_embedding
    assert rebuilt and torch.equal(weights, expected_llm["transformer.vocab_embedding.weight"])  # the first build's
    vision = infer.vision.state_dict()
    assert all(torch.equal(vision[k], v) for k, v in expected_vision.items())  # and its vision part too
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="rebuilt after its language model was loaded"):
        QWenInfer(infer.runner)  # the vision part read now is the second build's: refused, not mixed


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m["files"].pop("llm/rank0.safetensors"), r"leaves out llm/rank0.safetensors, which a load reads"),
        (lambda m: m["files"].pop("vision/model.safetensors"), r"leaves out vision/model.safetensors"),
        (lambda m: m["files"].__setitem__("../outside.bin", {"bytes": 1, "sha256": ["0"]}), r"lists '../outside.bin'"),
        (lambda m: m["files"].__setitem__("/etc/passwd", {"bytes": 1, "sha256": ["0"]}), r"lists '/etc/passwd'"),
    ],
)
def test_a_manifest_that_leaves_a_file_out_or_points_outside_is_refused(tiny_engine, tmp_path, edit, match):
    engine = copy_of(tiny_engine, tmp_path)
    manifest = json.loads((engine / "manifest.json").read_text())
    edit(manifest)
    (engine / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=match):
        ModelRunner.from_dir(engine)


def test_a_float16_build_of_weights_past_its_range_is_refused_naming_the_weight(tiny_checkpoint, tmp_path):
    state = read_state_dict(tiny_checkpoint)
    state["transformer.h.1.mlp.c_proj.weight"][0, :3] = torch.tensor([7e4, -1e5, 3.0])  # finite in float32
    model = load_checkpoint(tiny_checkpoint)
    model.load_state_dict(state)
    big = save_checkpoint(model, tmp_path / "big", copy_in=[tiny_checkpoint / "qwen.tiktoken"])
    fp16 = BuildConfig(max_batch_size=1, max_input_len=300, max_seq_len=320, dtype="float16")
    with pytest.raises(
        ValueError,
        match=r"transformer.h.1.mlp.c_proj.weight .*2 finite value\(s\) overflow to inf in "
        r"float16 \(largest magnitude 1e\+05.*build in bfloat16 \(--dtype bfloat16\)",
    ):
        build_engine(big, tmp_path / "fp16", fp16)
    assert not (tmp_path / "fp16").exists()
    bf16 = build_engine(
        big, tmp_path / "bf16", BuildConfig(max_batch_size=1, max_input_len=300, max_seq_len=320, dtype="bfloat16")
    )
    assert torch.isfinite(
        load_file(str(bf16 / "llm" / "rank0.safetensors"))["transformer.layers.1.mlp.proj.weight"].float()
    ).all()
    visual = read_state_dict(tiny_checkpoint)  # the language model back in range, a vision weight out of it
    visual["transformer.visual.proj"][0, 0] = 1e6
    model.load_state_dict(visual)
    save_checkpoint(model, tmp_path / "big", overwrite=True, copy_in=[tiny_checkpoint / "qwen.tiktoken"])
    with pytest.raises(ValueError, match=r"transformer.visual.proj: 1 finite value\(s\) overflow to inf in float16"):
        build_engine(big, tmp_path / "fp16", fp16)


def test_the_memory_limits_ask_for_is_named_at_build_and_refused_at_load(tiny_checkpoint, tmp_path, monkeypatch):
    gib = 2**30
    monkeypatch.setattr(build_module, "device_memory", lambda device: (6 * gib, 8 * gib))
    monkeypatch.setattr(qwenvl_lab.limits, "device_memory", lambda device: (6 * gib, 8 * gib))
    huge = BuildConfig(max_batch_size=1_000_000, max_input_len=640, max_seq_len=704)
    with pytest.warns(
        UserWarning,
        match=r"these limits ask for 1.44e\+03 GB where the engine loads: KV cache 1.44e\+03 GB "
        r"\(max_batch_size 1000000 × max_beam_width 1 rows × max_seq_len 704 positions × 2 layers × K and "
        r"V × 2 heads × 64 × float32\) \+ weights .* this machine has 8.59 GB",
    ):
        engine = build_engine(tiny_checkpoint, tmp_path / "huge", huge)
    with pytest.raises(
        ValueError,
        match=r"this engine needs 1.44e\+03 GB on cpu: KV cache .*; cpu has 6.44 GB available "
        r"\(8.59 GB in all\). Rebuild it with smaller limits \(--max-batch-size",
    ):
        ModelRunner.from_dir(engine)
