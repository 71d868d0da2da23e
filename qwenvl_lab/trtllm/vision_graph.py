"""The exported vision tower's interface: opset, tensor names and image size, shared by the ONNX and TensorRT steps."""

import onnx

from ..checks.values import check_path

OPSET = 17
INPUT_NAME, OUTPUT_NAME = "input", "output"  # input [batch, 3, S, S] → output [batch, 256, H]


def onnx_image_size(onnx_path) -> int:
    """S of the `input` [batch, 3, S, S] of an exported vision tower (read without loading the weights)."""
    onnx_path = check_path("onnx_path", onnx_path)
    if not onnx_path.is_file():
        raise FileNotFoundError(f"ONNX file not found: {str(onnx_path)!r}; make it with export_visual_onnx")
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    inputs = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.input}
    shape = inputs.get(INPUT_NAME)
    if shape is None or len(shape) != 4 or shape[1] != 3 or not isinstance(shape[2], int) or shape[2] != shape[3]:
        raise ValueError(
            f"{onnx_path} is not a vision tower from export_visual_onnx: expected an input {INPUT_NAME!r} "
            f"[batch, 3, S, S], found inputs {inputs}"
        )
    return shape[2]
