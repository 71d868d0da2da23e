"""Tests of the GPU steps: the vision plan on real TensorRT, and the engine path on real TensorRT-LLM.

Each is skipped with the missing pieces named when the stack is absent (always on the course's CPU machines). The
engine test runs in a TensorRT-LLM environment, where qwenvl_lab.modeling cannot be imported (transformers 4.57):
it reads a workdir that `python -m qwenvl_lab.trtllm.pipeline --stage prepare --reference` made in the course
environment, named by the QWENVL_TRTLLM_WORKDIR variable (with QWENVL_TRTLLM_CHECKPOINT, the checkpoint used):
there, run `pytest --noconftest tests/test_trtllm_gpu.py -k engine` (conftest.py imports the model).
"""

import json
import os
from pathlib import Path

import pytest
import torch

from qwenvl_lab.trtllm.fp16 import to_float16_onnx
from qwenvl_lab.trtllm.gpu import GPUStackError, missing_gpu_stack
from qwenvl_lab.trtllm.onnx_export import export_visual_onnx
from qwenvl_lab.trtllm.pipeline import REFERENCE_FILE, run_gpu_steps
from qwenvl_lab.trtllm.visual_plan import TRTVisualEncoder, build_visual_plan

PLAN_NEEDS = missing_gpu_stack("tensorrt", "cuda")
WORKDIR = os.environ.get("QWENVL_TRTLLM_WORKDIR")
ENGINE_NEEDS = missing_gpu_stack("tensorrt", "tensorrt_llm", "cuda") + (
    [] if WORKDIR else ["QWENVL_TRTLLM_WORKDIR (a workdir from `--stage prepare --reference`)"]
)


def skip_reason(missing: list[str]) -> str:
    return "needs " + "; ".join(missing)


@pytest.fixture(scope="module")
def tiny_onnx(tiny_model, tmp_path_factory):
    """(model, exported ONNX) of the tiny random checkpoint (imports qwenvl_lab.modeling: course environment)."""

    return tiny_model, export_visual_onnx(tiny_model, tmp_path_factory.mktemp("gpu") / "visual.onnx")


@pytest.mark.gpu
@pytest.mark.skipif(bool(PLAN_NEEDS), reason=skip_reason(PLAN_NEEDS))
@pytest.mark.parametrize(
    "fp16, strongly_typed, tolerance", [(False, False, 1e-3), (True, False, 3e-2), (True, True, 3e-2)]
)
def test_visual_plan_matches_pytorch(tiny_onnx, tmp_path, fp16, strongly_typed, tolerance):

    model, onnx_path = tiny_onnx
    if strongly_typed:  # the float16 graph (LayerNorm in float32), built in its own types
        onnx_path = to_float16_onnx(onnx_path, tmp_path / "half" / "visual_fp16.onnx")
    plan = build_visual_plan(onnx_path, tmp_path / "visual.plan", fp16=fp16, max_batch=4, strongly_typed=strongly_typed)
    encoder = TRTVisualEncoder(plan)
    assert (encoder.image_size, encoder.max_batch) == (56, 4)
    pixels = torch.randn(5, 3, 56, 56, generator=torch.Generator().manual_seed(0))  # 5 > max_batch: two runs
    with torch.no_grad():
        expected = model.transformer.visual(pixels)
    got = encoder(pixels).float().cpu()
    assert got.shape == (5, 256, model.config.hidden_size)
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.skipif(not PLAN_NEEDS, reason="tensorrt and a GPU are present: the plan is built by the test above")
def test_without_tensorrt_the_plan_step_says_what_is_missing(tiny_onnx, tmp_path):
    _, onnx_path = tiny_onnx
    with pytest.raises(GPUStackError, match="build_visual_plan needs " + PLAN_NEEDS[0].split(" ")[0]):
        build_visual_plan(onnx_path, tmp_path / "visual.plan")
    assert not (tmp_path / "visual.plan").exists()
    (tmp_path / "some.plan").write_bytes(b"\0")
    with pytest.raises(GPUStackError, match="TRTVisualEncoder needs"):
        TRTVisualEncoder(tmp_path / "some.plan")


def test_plan_step_argument_errors(tiny_onnx, tmp_path):
    _, onnx_path = tiny_onnx
    with pytest.raises(ValueError, match="1 <= min_batch <= opt_batch <= max_batch"):
        build_visual_plan(onnx_path, tmp_path / "p.plan", min_batch=2, opt_batch=1)
    with pytest.raises(FileNotFoundError, match="export_visual_onnx"):
        build_visual_plan(tmp_path / "missing.onnx", tmp_path / "p.plan")
    with pytest.raises(FileNotFoundError, match="build_visual_plan"):
        TRTVisualEncoder(tmp_path / "missing.plan")


@pytest.mark.gpu
@pytest.mark.skipif(bool(ENGINE_NEEDS), reason=skip_reason(ENGINE_NEEDS))
def test_engine_answers_like_pytorch():

    reference = json.loads((Path(WORKDIR) / REFERENCE_FILE).read_text())
    answer = run_gpu_steps(
        os.environ["QWENVL_TRTLLM_CHECKPOINT"],
        reference["image"],
        reference["question"],
        WORKDIR,
        reference["max_new_tokens"],
    )
    assert answer == reference["answer"]
