"""The per-stage dump format and its recorder: stages in pipeline order, one request each, the run in the header;
written the package's one way (beside the target, then renamed; a file it did not write never replaced)."""

import json
import os
import stat

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from qwenvl_lab.dump import (
    FORMAT,
    STAGES,
    DumpRecorder,
    as_stage_tensor,
    check_dump_target,
    is_dump,
    pipeline_order,
    read_dump,
    stage,
)


def recorder(**kwargs):
    return DumpRecorder("a test run", "float32", vocab_size=32, **kwargs)


def test_every_stage_is_named_once_in_pipeline_order():
    names = [s.name for s in STAGES]
    assert len(set(names)) == len(names)
    shuffled = ["output_ids", "layers.10", "logits", "layers.2", "pixels", "prompt_table", "input_ids", "layers.0"]
    assert pipeline_order(shuffled) == [
        "pixels",
        "input_ids",
        "prompt_table",
        "layers.0",
        "layers.2",
        "layers.10",
        "logits",
        "output_ids",
    ]
    assert stage("layers.31").step == "layers" and stage("logits").step == "logits"


@pytest.mark.parametrize("name", ["layers", "layers.", "layers.01", "layers.-1", "layer.0", "logit", "", None, 3])
def test_a_name_that_is_no_stage_is_refused_with_the_list(name):
    with pytest.raises(ValueError, match="is not a stage of a dump; the stages are pixels"):
        stage(name)


def test_one_request_is_kept_without_its_batch_dimension():
    assert as_stage_tensor("input_embeds", torch.ones(1, 5, 4)).shape == (5, 4)
    assert as_stage_tensor("output_ids", torch.ones(1, 1, 3, dtype=torch.int32)).dtype == torch.int64
    assert as_stage_tensor("prompt_ids", [1, 2, 3]).tolist() == [1, 2, 3]
    assert as_stage_tensor("pixels", np.zeros((1, 3, 4, 4), np.float32)).shape == (1, 3, 4, 4)  # N stays
    logits = torch.arange(12.0).reshape(1, 3, 4)  # [1, L, V]: the last position picks the first new token
    assert as_stage_tensor("logits", logits).tolist() == [8.0, 9.0, 10.0, 11.0]
    half = torch.ones(2, 3, dtype=torch.float16)
    assert as_stage_tensor("prompt_table", half).dtype == torch.float16  # features keep their dtype


@pytest.mark.parametrize(
    ("name", "value", "error", "message"),
    [
        ("input_embeds", torch.ones(2, 5, 4), ValueError, r"input_embeds is \[L, H\] \(one request\)"),
        ("input_ids", torch.ones(3), TypeError, "holds ids: give an integer tensor"),
        ("input_ids", torch.ones(3, dtype=torch.bool), TypeError, "holds ids"),
        ("input_vit", torch.ones(1, 2, 3, dtype=torch.int64), TypeError, "holds features"),
        ("input_vit", [[1.0]], TypeError, "give a torch.Tensor"),
        ("logits", torch.ones(2, 3, 4), ValueError, "one request's logits"),
    ],
)
def test_a_tensor_of_the_wrong_kind_is_refused(name, value, error, message):
    with pytest.raises(error, match=message):
        as_stage_tensor(name, value)


def test_a_dump_reads_back_what_was_recorded_with_its_header(tmp_path):
    rec = recorder(sampling={"greedy": True}, notes={"question": "图片里是什么？"})
    rec.record("logits", torch.randn(32))
    rec.record("prompt_ids", torch.tensor([[3, 4, 5]]))
    rec.record("layers.1", torch.randn(3, 8, dtype=torch.bfloat16))
    rec.record("layers.0", torch.randn(3, 8))
    path = rec.save(tmp_path / "run.safetensors")
    dump = read_dump(path)
    assert list(dump.tensors) == ["prompt_ids", "layers.0", "layers.1", "logits"]
    assert all(torch.equal(dump.tensors[k], rec.tensors[k]) for k in rec.tensors)
    assert dump.tensors["layers.1"].dtype == torch.bfloat16
    assert (dump.implementation, dump.dtype, dump.device, dump.vocab_size) == ("a test run", "float32", "cpu", 32)
    assert dump.sampling == {"greedy": True} and dump.notes == {"question": "图片里是什么？"}
    assert dump.header["format"] == FORMAT and "torch" in dump.versions and is_dump(path)


def test_a_stage_is_recorded_once():
    rec = recorder()
    rec.record("logits", torch.ones(4))
    with pytest.raises(ValueError, match="already recorded"):
        rec.record("logits", torch.ones(4))


class Block(torch.nn.Module):
    """A decoder block that returns a tuple, as Qwen-VL-Chat's remote code does: (hidden states, cache)."""

    def forward(self, x, scale=1.0):
        return x * scale + 1, None


def test_hooks_record_the_first_call_only_the_prefill():
    blocks = torch.nn.ModuleList([Block(), Block()])
    rec = recorder()
    rec.hook_input(blocks[0], "input_embeds")
    rec.hook_layers(blocks)
    prompt, step = torch.zeros(1, 4, 2), torch.full((1, 1, 2), 9.0)
    for x in (prompt, step):  # the prefill, then a decode step
        for block in blocks:
            x = block(x)[0]
    assert rec.tensors["input_embeds"].tolist() == [[0.0, 0.0]] * 4
    assert rec.tensors["layers.0"].tolist() == [[1.0, 1.0]] * 4 and rec.tensors["layers.1"].tolist() == [[2.0, 2.0]] * 4
    rec.remove_hooks()
    assert not rec.hooks and not blocks[0]._forward_hooks and not blocks[0]._forward_pre_hooks


def test_an_input_given_by_keyword_is_recorded_too():
    block, rec = Block(), recorder()
    rec.hook_input(block, "input_embeds")
    block(x=torch.ones(1, 2, 3))
    assert rec.tensors["input_embeds"].shape == (2, 3)


def test_the_run_must_be_described():
    with pytest.raises(ValueError, match="implementation must name what ran"):
        DumpRecorder(" ", "float32")
    with pytest.raises(ValueError, match="dtype must be one of"):
        DumpRecorder("x", "float64")
    with pytest.raises(ValueError, match="vocab_size must be an int >= 1"):
        DumpRecorder("x", "float32", vocab_size=0)
    with pytest.raises(TypeError, match="notes must map str to str"):
        DumpRecorder("x", "float32", notes={"layers": 4})
    with pytest.raises(ValueError, match="notes may not use the header's own fields"):
        DumpRecorder("x", "float32", notes={"dtype": "float16"}).header()
    with pytest.raises(ValueError, match="nothing was recorded"):
        DumpRecorder("x", "float32").save("unused.safetensors")


def test_a_file_the_package_did_not_write_is_never_replaced(tmp_path):
    mine = tmp_path / "notes.safetensors"
    mine.write_text("my own notes")
    other = tmp_path / "weights.safetensors"
    save_file({"w": torch.ones(2)}, str(other))  # safetensors, but not a dump
    rec = recorder()
    rec.record("logits", torch.ones(4))
    for path in (mine, other):
        before = path.read_bytes()
        for overwrite in (False, True):
            with pytest.raises(FileExistsError, match="not a dump this package wrote: it is not replaced"):
                rec.save(path, overwrite=overwrite)
        assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.safetensors", "weights.safetensors"]  # no leftovers


def test_an_earlier_dump_is_replaced_only_when_asked(tmp_path):
    first, second = recorder(), recorder()
    first.record("logits", torch.zeros(4))
    second.record("logits", torch.ones(4))
    path = first.save(tmp_path / "run.safetensors")
    with pytest.raises(FileExistsError, match="already holds a dump: pass overwrite=True"):
        second.save(path)
    assert read_dump(path).tensors["logits"].tolist() == [0.0] * 4
    second.save(path, overwrite=True)
    assert read_dump(path).tensors["logits"].tolist() == [1.0] * 4
    assert [p.name for p in tmp_path.iterdir()] == ["run.safetensors"]


def test_the_target_is_checked_before_any_work(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder: give a file name"):
        check_dump_target(tmp_path)
    with pytest.raises(ValueError, match="file name is empty"):
        check_dump_target("  ")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, so"):
        check_dump_target(tmp_path / "a_file" / "run.safetensors")
    assert check_dump_target(tmp_path / "new" / "deeper" / "run.safetensors").name == "run.safetensors"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_folder_one_cannot_write_in_is_refused_before_the_work(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(PermissionError, match="cannot write in"):
        check_dump_target(locked / "run.safetensors")


def test_the_file_gets_the_umask_permissions(tmp_path):
    rec = recorder()
    rec.record("logits", torch.ones(4))
    old = os.umask(0o022)
    try:
        path = rec.save(tmp_path / "run.safetensors")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_what_is_not_a_dump_is_refused_when_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="dump not found"):
        read_dump(tmp_path / "none.safetensors")
    with pytest.raises(IsADirectoryError, match="is a folder, not a dump"):
        read_dump(tmp_path)
    text = tmp_path / "text.safetensors"
    text.write_text("hello")
    with pytest.raises(ValueError, match="cannot be read as a safetensors file"):
        read_dump(text)
    plain = tmp_path / "plain.safetensors"
    save_file({"logits": torch.ones(2)}, str(plain))
    with pytest.raises(ValueError, match="not a dump of this format"):
        read_dump(plain)
    odd = tmp_path / "odd.safetensors"
    save_file({"hidden": torch.ones(2)}, str(odd), metadata={"format": FORMAT, "dtype": "float32"})
    with pytest.raises(ValueError, match="'hidden' is not a stage of a dump"):
        read_dump(odd)
    bad = tmp_path / "bad.safetensors"
    save_file({"logits": torch.ones(2)}, str(bad), metadata={"format": FORMAT, "dtype": "float8"})
    with pytest.raises(ValueError, match="header dtype must be one of"):
        read_dump(bad)
    floats = tmp_path / "floats.safetensors"
    save_file({"input_ids": torch.ones(2)}, str(floats), metadata={"format": FORMAT, "dtype": "float32"})
    with pytest.raises(ValueError, match="holds ids but is stored as torch.float32"):
        read_dump(floats)
    garbled = tmp_path / "garbled.safetensors"
    header = {"format": FORMAT, "dtype": "float32", "sampling": "{greedy"}
    save_file({"logits": torch.ones(2)}, str(garbled), metadata=header)
    with pytest.raises(ValueError, match="header field 'sampling' is not JSON"):
        read_dump(garbled)
    assert json.loads(json.dumps(header))  # the test's own header is valid JSON around the broken field


def test_a_hook_on_the_output_layer_keeps_the_prefills_last_row():
    """hook_output(model.lm_head, "logits"): the prefill's logits [1, L, V] give the row that picks the first token."""
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(4, 6, bias=False)
    rec = recorder()
    rec.hook_output(lm_head, "logits")
    hidden = torch.randn(1, 5, 4)
    expected = lm_head(hidden)[0, -1]
    lm_head(torch.randn(1, 1, 4))  # a decode step: not recorded
    assert torch.equal(rec.tensors["logits"], expected.detach())
