"""Tests for notebook 08's fp16 measurement: the exported tower in float16 (ONNX Runtime) against PyTorch float32."""

from pathlib import Path

import onnx
import pytest
import torch

from qwenvl_lab.checkpoint import load_checkpoint
from qwenvl_lab.course.factcheck import feature_drift
from qwenvl_lab.trtllm.fp16 import onnx_runtime_encoders, to_float16_onnx
from qwenvl_lab.trtllm.onnx_export import OnnxVisualEncoder, export_visual_onnx
from qwenvl_lab.trtllm.visual_plan import build_visual_plan, graph_float_types

IMAGES = sorted((Path(__file__).resolve().parents[1] / "data" / "images").glob("*.png"))
TOY_DIR = Path(__file__).resolve().parents[1] / "data" / "toy-qwen-vl"


@pytest.fixture(scope="module")
def graphs(tiny_model, tmp_path_factory):
    """(model, float32 ONNX, float16 ONNX with LayerNorm in float32) of the tiny random checkpoint."""
    root = tmp_path_factory.mktemp("fp16")
    fp32 = export_visual_onnx(tiny_model, root / "visual.onnx")
    return tiny_model, fp32, to_float16_onnx(fp32, root / "half" / "visual_fp16.onnx")


def test_the_float16_graph_keeps_layernorm_and_its_interface_in_float32(graphs):
    _, fp32, half = graphs
    graph = onnx.load(str(half)).graph
    assert graph_float_types(fp32) == {"FLOAT"} and "FLOAT16" in graph_float_types(half)
    io_types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    assert io_types == {"input": onnx.TensorProto.FLOAT, "output": onnx.TensorProto.FLOAT}
    norms = [n for n in graph.node if n.op_type == "LayerNormalization"]
    scales = {i.name: i.data_type for i in graph.initializer}
    assert norms and all(scales.get(n.input[1], onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT for n in norms)
    matmul_weights = [scales[i] for n in graph.node if n.op_type in ("MatMul", "Gemm") for i in n.input if i in scales]
    assert matmul_weights and set(matmul_weights) == {onnx.TensorProto.FLOAT16}


def relative_error(values: torch.Tensor, reference: torch.Tensor) -> float:
    return float((values.double() - reference.double()).norm() / reference.double().norm())


def test_float16_drifts_where_float32_does_not(graphs):
    model, fp32, half = graphs
    pixels = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model.transformer.visual(pixels)
    exact = relative_error(OnnxVisualEncoder(fp32)(pixels), reference)
    rounded = relative_error(OnnxVisualEncoder(half)(pixels), reference)
    assert exact < 1e-5 < rounded < 1e-2  # float16 keeps ~3 significant digits, float32 ~7


@pytest.mark.skipif(not (TOY_DIR / "config.json").is_file(), reason="needs the toy checkpoint data/toy-qwen-vl")
def test_toy_model_on_the_course_pictures(tmp_path):
    """Notebook 08's measurement: the toy tower's three ONNX Runtime engines against its PyTorch float32 tower."""
    visual = load_checkpoint(TOY_DIR, dtype="float32").transformer.visual
    encoders = onnx_runtime_encoders(export_visual_onnx(visual, tmp_path / "visual.onnx"), tmp_path)
    assert list(encoders) == [
        "ONNX Runtime float32 graph",
        "ONNX Runtime float16 graph",
        "ONNX Runtime float16 graph, LayerNorm float32",
    ]
    with torch.no_grad():
        reference = visual.encode(IMAGES)  # [12, 256, H]
    drift = {name: feature_drift(reference, encoder.encode(IMAGES)) for name, encoder in encoders.items()}
    fp32, fp16, layernorm32 = drift.values()
    assert fp32["max_abs"] < 1e-4 < layernorm32["max_abs"] and fp16["max_abs"] > 100 * fp32["max_abs"]
    assert all(d["cosine"] > 0.999 for d in drift.values())


def test_bad_arguments_are_refused(graphs, tmp_path):
    _, fp32, _ = graphs
    with pytest.raises(FileNotFoundError, match="export_visual_onnx"):
        to_float16_onnx(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    with pytest.raises(ValueError, match="would overwrite its input"):
        to_float16_onnx(fp32, fp32)
    with pytest.raises(ValueError, match="float32 weights only: a strongly typed build"):
        build_visual_plan(fp32, tmp_path / "p.plan", strongly_typed=True)  # refused before TensorRT is needed
    assert not (tmp_path / "p.plan").exists()
