"""Tests for notebook 08's fp16 measurement: the exported tower in float16 (ONNX Runtime) against PyTorch float32."""

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from qwenvl_lab.trtllm.fp16 import drift, measure_fp16_drift, to_float16_onnx
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


def test_float16_drifts_where_float32_does_not(graphs):
    model, fp32, half = graphs
    pixels = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model.transformer.visual(pixels).numpy()
    exact, rounded = (
        drift(OnnxVisualEncoder(fp32)(pixels).numpy(), reference),
        drift(OnnxVisualEncoder(half)(pixels).numpy(), reference),
    )
    assert exact.rel_l2 < 1e-5 < rounded.rel_l2 < 1e-2  # float16 keeps ~3 significant digits, not 7
    assert rounded.min_cosine > 0.999 and rounded.max_abs > 100 * exact.max_abs


def test_drift_measures_what_it_says():
    reference = np.ones((1, 2, 4))
    assert drift(reference, reference) == drift(reference.copy(), reference)
    d = drift(reference + np.array([0.5, 0, 0, 0]), reference)  # one feature of each row off by 0.5
    assert d.max_abs == 0.5 and d.rel_l2 == pytest.approx(np.sqrt(2 * 0.25) / np.sqrt(8))
    assert d.min_cosine == pytest.approx(4.5 / (np.sqrt(5.25) * 2))


@pytest.mark.skipif(not (TOY_DIR / "config.json").is_file(), reason="needs the toy checkpoint data/toy-qwen-vl")
def test_toy_model_drift_on_the_course_pictures(tmp_path):
    results = measure_fp16_drift(TOY_DIR, IMAGES, tmp_path)
    assert list(results) == ["onnxruntime float32", "onnxruntime float16", "onnxruntime float16, LayerNorm float32"]
    fp32, fp16, ln32 = results.values()
    assert fp32.rel_l2 < 1e-5 and fp16.rel_l2 > 10 * fp32.rel_l2 and ln32.rel_l2 > 10 * fp32.rel_l2
    assert all(r.min_cosine > 0.99 for r in results.values())


def test_bad_arguments_are_refused(graphs, tmp_path):
    _, fp32, _ = graphs
    with pytest.raises(FileNotFoundError, match="export_visual_onnx"):
        to_float16_onnx(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    with pytest.raises(ValueError, match="would overwrite its input"):
        to_float16_onnx(fp32, fp32)
    with pytest.raises(ValueError, match="float32 weights only: a strongly typed build"):
        build_visual_plan(fp32, tmp_path / "p.plan", strongly_typed=True)  # refused before TensorRT is needed
    assert not (tmp_path / "p.plan").exists()
