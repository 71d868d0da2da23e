"""Tests for step 8a: the vision tower exported to ONNX and run by onnxruntime on the CPU."""

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from qwenvl_lab.checkpoint import load_checkpoint
from qwenvl_lab.trtllm.onnx_export import OnnxVisualEncoder, declare_output_shape, export_visual_onnx, visual_tower_of
from qwenvl_lab.trtllm.vision_graph import onnx_image_size

IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"
TOY_DIR = Path(__file__).resolve().parents[1] / "data" / "toy-qwen-vl"


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint, tiny_model, tmp_path_factory):
    """(checkpoint dir, model, ONNX file exported from the directory) of the tiny random checkpoint."""
    onnx_path = export_visual_onnx(tiny_checkpoint, tmp_path_factory.mktemp("onnx") / "visual.onnx")
    return tiny_checkpoint, tiny_model, onnx_path


def dims(value_info) -> list:
    return [d.dim_value or d.dim_param for d in value_info.type.tensor_type.shape.dim]


def test_graph_is_opset_17_with_a_dynamic_batch(tiny):
    _, model, onnx_path = tiny
    graph_model = onnx.load(str(onnx_path))
    onnx.checker.check_model(graph_model, full_check=True)
    assert {o.domain: o.version for o in graph_model.opset_import}[""] == 17
    (inp,), (out,) = graph_model.graph.input, graph_model.graph.output
    size, hidden = model.config.visual["image_size"], model.config.hidden_size
    assert inp.name == "input" and dims(inp)[1:] == [3, size, size] and isinstance(dims(inp)[0], str)
    assert out.name == "output" and dims(out)[1:] == [256, hidden] and dims(out)[0] == dims(inp)[0]


@pytest.mark.parametrize("batch", [1, 3])
def test_onnxruntime_matches_pytorch(tiny, batch):
    _, model, onnx_path = tiny
    pixels = torch.randn(batch, 3, 56, 56, generator=torch.Generator().manual_seed(batch))
    with torch.no_grad():
        expected = model.transformer.visual(pixels)  # [B, 256, H]
    got = OnnxVisualEncoder(onnx_path)(pixels)
    assert got.shape == (batch, 256, model.config.hidden_size)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_batch_rows_are_independent(tiny):
    """Image k's features do not depend on the other images of the batch (nothing mixes the batch axis)."""
    _, _, onnx_path = tiny
    encoder = OnnxVisualEncoder(onnx_path)
    pixels = torch.randn(3, 3, 56, 56, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(encoder(pixels)[1:2], encoder(pixels[1:2]), rtol=1e-5, atol=1e-5)


def test_encode_pictures_like_the_pytorch_tower(tiny):
    _, model, onnx_path = tiny
    pictures = sorted(IMAGES.glob("*.png"))[:2]
    with torch.no_grad():
        expected = model.transformer.visual.encode(pictures)
    torch.testing.assert_close(OnnxVisualEncoder(onnx_path).encode(pictures), expected, rtol=1e-4, atol=1e-4)


def test_export_from_a_half_precision_model_uses_a_float32_copy(tiny, tmp_path):
    _, model, onnx_path = tiny
    half = load_checkpoint(tiny[0], dtype="bfloat16")
    exported = export_visual_onnx(half, tmp_path / "half.onnx")
    assert half.transformer.visual.conv1.weight.dtype == torch.bfloat16  # the model itself is untouched
    pixels = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = visual_tower_of(half)(pixels)
    torch.testing.assert_close(OnnxVisualEncoder(exported)(pixels), expected, rtol=1e-4, atol=1e-4)
    graph = onnx.load(str(exported)).graph
    floating = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    assert {init.data_type for init in graph.initializer} & floating == {onnx.TensorProto.FLOAT}


def test_export_from_the_tower_and_from_the_model_agree(tiny, tmp_path):
    _, model, onnx_path = tiny
    from_tower = export_visual_onnx(model.transformer.visual, tmp_path / "tower.onnx")
    pixels = torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(5))
    a, b = OnnxVisualEncoder(from_tower)(pixels), OnnxVisualEncoder(onnx_path)(pixels)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.skipif(not (TOY_DIR / "config.json").is_file(), reason="needs the toy checkpoint data/toy-qwen-vl")
def test_toy_model_parity(tmp_path):
    model = load_checkpoint(TOY_DIR, dtype="float32")  # stored in bfloat16
    onnx_path = export_visual_onnx(model, tmp_path / "toy.onnx")
    size = model.config.visual["image_size"]
    pixels = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model.transformer.visual(pixels)
    torch.testing.assert_close(OnnxVisualEncoder(onnx_path)(pixels), expected, rtol=1e-4, atol=1e-4)


def test_bad_inputs_get_clear_errors(tiny, tmp_path):
    _, _, onnx_path = tiny
    with pytest.raises(TypeError, match="QWenLMHeadModel, a VisionTransformer or a checkpoint directory"):
        export_visual_onnx(42, tmp_path / "x.onnx")
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        export_visual_onnx(tmp_path / "nowhere", tmp_path / "x.onnx")
    with pytest.raises(FileNotFoundError, match="export_visual_onnx"):
        OnnxVisualEncoder(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match=r"expected pixels \[B, 3, 56, 56\]"):
        OnnxVisualEncoder(onnx_path)(torch.zeros(1, 3, 448, 448))
    other = tmp_path / "other.onnx"
    x, y = (onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 4]) for n in "xy")
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph), other)
    with pytest.raises(ValueError, match="not a vision tower"):
        onnx_image_size(other)


def test_weights_stored_beside_the_graph_still_load(tiny, tmp_path):
    """Past 2 GB (the real 448-px tower) the weights live in files beside the .onnx: every reader must follow them."""

    _, model, onnx_path = tiny
    external = tmp_path / "external.onnx"
    onnx.save_model(
        onnx.load(str(onnx_path)),
        str(external),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="external.onnx.data",
    )
    assert external.stat().st_size < 100_000 < (tmp_path / "external.onnx.data").stat().st_size
    declare_output_shape(external, model.config.hidden_size)  # rewrites the graph, keeps the weights where they are
    onnx.checker.check_model(str(external))
    assert onnx_image_size(external) == 56
    pixels = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(OnnxVisualEncoder(external)(pixels), OnnxVisualEncoder(onnx_path)(pixels))
