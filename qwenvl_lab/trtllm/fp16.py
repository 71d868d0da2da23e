"""Notebook 08 — the vision tower's graph in float16, the one a strongly typed plan follows, and run on a CPU.

A TensorRT fp16 plan cannot be built here; what can be measured is how far the same graph drifts when its weights
and arithmetic are float16: `onnx_runtime_encoders` gives the exported tower run by ONNX Runtime in float32, in
float16 throughout, and in float16 with LayerNorm kept in float32, each a vision engine to compare with PyTorch's
float32 tower (`factcheck.feature_drift`, notebook 08).
"""

from pathlib import Path

import onnx
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
from onnxruntime.transformers.onnx_model import OnnxModel

from .. import files
from ..checks.values import check_path
from .onnx_export import ONNX_WRITER, OnnxVisualEncoder, mark_as_ours, ours

KEEP_FP32 = ("LayerNormalization",)  # mean and variance over the width: the reduction fp16 is worst at
EXTERNAL_DATA_BYTES = 1 << 30  # a graph whose weights pass this is saved with its weights beside it (protobuf: 2 GB)


def to_float16_onnx(onnx_path, out_path, keep_fp32=KEEP_FP32, overwrite: bool = False) -> Path:
    """A float16 copy of an exported tower: float16 weights and arithmetic, float32 `input`/`output`, the op types in
    `keep_fp32` left in float32 (casts around them), as are those ONNX Runtime's converter never turns to float16
    (DEFAULT_OP_BLOCK_LIST). Checked with `onnx.checker`; large weights go beside the file (a new one, or one this
    package wrote, or with overwrite=True any)."""
    onnx_path, out_path = check_path("onnx_path", onnx_path), check_path("out_path", out_path)
    if not onnx_path.is_file():
        raise FileNotFoundError(f"ONNX file not found: {str(onnx_path)!r}; make it with export_visual_onnx")
    if out_path.resolve() == onnx_path.resolve():
        raise ValueError(f"to_float16_onnx would overwrite its input {onnx_path}; give another out_path")
    files.check_destination(out_path, ONNX_WRITER, folder=False, overwrite=overwrite, parents=True, made=ours)
    graph_model = onnx.load(str(onnx_path))  # weights stored beside the graph are read too
    blocked = [*DEFAULT_OP_BLOCK_LIST, *keep_fp32]
    half = OnnxModel(convert_float_to_float16(graph_model, keep_io_types=True, op_block_list=blocked))
    half.topological_sort()  # the converter appends its input casts last; ONNX (and TensorRT's parser) want order
    half = half.model
    mark_as_ours(half)
    weights = sum(t.ByteSize() for t in half.graph.initializer)
    with files.writing_file(
        out_path, ONNX_WRITER, overwrite=overwrite, need_bytes=weights, parents=True, made=ours
    ) as part:
        onnx.save_model(
            half,
            str(part),
            save_as_external_data=weights > EXTERNAL_DATA_BYTES,
            all_tensors_to_one_file=True,
            location=out_path.name + ".data",
        )
        onnx.checker.check_model(str(part))
    return out_path


def onnx_runtime_encoders(onnx_path, workdir) -> dict[str, OnnxVisualEncoder]:
    """The exported tower `onnx_path` (float32) as three CPU vision engines: the float32 graph, its float16 copy, and
    its float16 copy with LayerNorm in float32 (the float16 graphs are written under `workdir`)."""
    onnx_path, workdir = check_path("onnx_path", onnx_path), check_path("workdir", workdir)
    return {
        "ONNX Runtime float32 graph": OnnxVisualEncoder(onnx_path),
        "ONNX Runtime float16 graph": OnnxVisualEncoder(
            to_float16_onnx(onnx_path, workdir / "visual_fp16.onnx", keep_fp32=())
        ),
        "ONNX Runtime float16 graph, LayerNorm float32": OnnxVisualEncoder(
            to_float16_onnx(onnx_path, workdir / "visual_fp16_layernorm_fp32.onnx")
        ),
    }
