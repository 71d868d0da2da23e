"""Tests for step 12: the whole TensorRT path as one command, on a machine without the TensorRT stack."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

from qwenvl_lab.tokenizing import IM_END_ID, make_context
from qwenvl_lab.trtllm.gpu import missing_gpu_stack
from qwenvl_lab.trtllm.pipeline import (
    COMMAND_FILE,
    ONNX_FILE,
    ONNX_FP16_FILE,
    REFERENCE_FILE,
    STOPPED,
    main,
    run_gpu_steps,
)
from qwenvl_lab.trtllm.visual_plan import graph_float_types
from qwenvl_lab.unified_checkpoint import read_trtllm_config

IMAGE = Path(__file__).resolve().parents[1] / "data" / "images" / "blue_square.png"
MISSING = missing_gpu_stack("tensorrt", "tensorrt_llm", "cuda")


@pytest.mark.skipif(not MISSING, reason="the TensorRT stack is present: the GPU tests run the whole path")
def test_without_the_gpu_stack_it_writes_the_cpu_outputs_and_stops(
    tiny_checkpoint, tiny_model, tokenizer, tmp_path, capsys
):
    workdir = tmp_path / "work"
    status = main(
        [
            "--checkpoint",
            str(tiny_checkpoint),
            "--image",
            str(IMAGE),
            "--workdir",
            str(workdir),
            "--reference",
            "--max-new-tokens",
            "4",
        ]
    )
    out, err = capsys.readouterr()
    assert status == STOPPED == 3
    assert "stopped: build_visual_plan needs" in err and MISSING[0] in err  # names what is missing
    onnx.checker.check_model(str(workdir / ONNX_FILE))
    assert read_trtllm_config(workdir / "trtllm_checkpoint")["dtype"] == "float16"
    command = json.loads((workdir / COMMAND_FILE).read_text())
    assert command[:5] == [
        "trtllm-build",
        "--checkpoint_dir",
        str(workdir / "trtllm_checkpoint"),
        "--output_dir",
        str(workdir / "engine"),
    ]
    assert shlex.join(command) in out  # the exact command, printed
    assert not (workdir / "plan").exists() and not (workdir / "engine").exists()
    reference = json.loads((workdir / REFERENCE_FILE).read_text())
    assert reference == dict(image=str(IMAGE), question="图片里是什么？", max_new_tokens=4, answer=reference["answer"])
    assert reference["answer"] == greedy_answer(tiny_model, tokenizer, 4) and f"answers: {reference['answer']}" in out


def greedy_answer(model, tokenizer, max_new_tokens):
    """Our PyTorch model's greedy answer to the default question about IMAGE, computed here."""
    _, tokens = make_context(tokenizer, tokenizer.from_list_format([{"image": str(IMAGE)}, {"text": "图片里是什么？"}]))
    ids = torch.tensor([tokens])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=IM_END_ID,
        pad_token_id=IM_END_ID,
    )
    return tokenizer.decode(out[0, len(tokens) :].tolist(), skip_special_tokens=True)


def test_the_gpu_stage_needs_the_prepare_stage(tiny_checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="run the prepare stage first"):
        run_gpu_steps(tiny_checkpoint, IMAGE, "图片里是什么？", tmp_path)


@pytest.mark.skipif(not MISSING, reason="the TensorRT stack is present: the GPU tests run the whole path")
def test_strongly_typed_prepares_the_float16_graph_the_gpu_stage_builds(tiny_checkpoint, tmp_path, capsys):
    workdir = tmp_path / "work"
    args = ["--checkpoint", str(tiny_checkpoint), "--image", str(IMAGE), "--workdir", str(workdir)]
    assert main(["--stage", "prepare", *args]) == 0
    with pytest.raises(FileNotFoundError, match="run the prepare stage with --strongly-typed first"):
        run_gpu_steps(tiny_checkpoint, IMAGE, "图片里是什么？", workdir, strongly_typed=True)
    assert main(["--stage", "all", "--strongly-typed", *args]) == STOPPED
    assert "FLOAT16" in graph_float_types(workdir / ONNX_FP16_FILE)
    assert "float16 graph for a strongly typed plan" in capsys.readouterr().out


def test_bad_arguments_are_refused_before_any_work(tiny_checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(tiny_checkpoint), "--image", str(tmp_path / "none.png"), "--workdir", str(tmp_path)])
    assert exit_info.value.code == 2 and "--image '" in (err := capsys.readouterr().err) and "': no such file" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(tmp_path / "nowhere"), "--image", str(IMAGE), "--workdir", str(tmp_path)])
    assert (
        exit_info.value.code == 2
        and "--checkpoint '" in (err := capsys.readouterr().err)
        and "': no such folder" in err
    )
    assert list(tmp_path.iterdir()) == []


def test_the_gpu_stage_imports_nothing_that_needs_transformers():
    """tensorrt_llm 1.2.x pins transformers 4.57: the GPU stage must load without qwenvl_lab.modeling."""
    code = (
        "import sys, qwenvl_lab.trtllm.pipeline, qwenvl_lab.trtllm.runner, qwenvl_lab.trtllm.visual_plan; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers' or m == 'qwenvl_lab.modeling'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
