"""Notebook 08 — fp16 drift of the vision tower, measured on a CPU: ONNX Runtime in float32 and float16 vs PyTorch.

A TensorRT fp16 plan cannot be built here; what can be measured is how far the same graph drifts when its weights
and arithmetic are float16: the exported tower run by ONNX Runtime in float32, in float16 throughout, and in float16
with LayerNorm kept in float32 (the graph a strongly typed plan follows), each against PyTorch in float32.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
from onnxruntime.transformers.onnx_model import OnnxModel

from ..vision import preprocess_images
from .onnx_export import OnnxVisualEncoder, export_visual_onnx, visual_tower_of

KEEP_FP32 = ("LayerNormalization",)  # mean and variance over the width: the reduction fp16 is worst at
EXTERNAL_DATA_BYTES = 1 << 30  # a graph whose weights pass this is saved with its weights beside it (protobuf: 2 GB)


def to_float16_onnx(onnx_path, out_path, keep_fp32=KEEP_FP32) -> Path:
    """A float16 copy of an exported tower: float16 weights and arithmetic, float32 `input`/`output`, the op types in
    `keep_fp32` left in float32 (casts around them), as are those ONNX Runtime's converter never turns to float16
    (DEFAULT_OP_BLOCK_LIST). Checked with `onnx.checker`; large weights go beside the file."""
    onnx_path, out_path = Path(onnx_path), Path(out_path)
    if not onnx_path.is_file():
        raise FileNotFoundError(f"ONNX file not found: {str(onnx_path)!r}; make it with export_visual_onnx")
    if out_path.resolve() == onnx_path.resolve():
        raise ValueError(f"to_float16_onnx would overwrite its input {onnx_path}; give another out_path")
    graph_model = onnx.load(str(onnx_path))  # weights stored beside the graph are read too
    blocked = [*DEFAULT_OP_BLOCK_LIST, *keep_fp32]
    half = OnnxModel(convert_float_to_float16(graph_model, keep_io_types=True, op_block_list=blocked))
    half.topological_sort()  # the converter appends its input casts last; ONNX (and TensorRT's parser) want order
    half = half.model
    out_path.parent.mkdir(parents=True, exist_ok=True)
    large = sum(t.ByteSize() for t in half.graph.initializer) > EXTERNAL_DATA_BYTES
    onnx.save_model(
        half,
        str(out_path),
        save_as_external_data=large,
        all_tensors_to_one_file=True,
        location=out_path.name + ".data",
    )
    onnx.checker.check_model(str(out_path))
    return out_path


@dataclass(frozen=True)
class Drift:
    """How far one run's `input_vit` lies from PyTorch's float32 `input_vit` for the same pixels."""

    max_abs: float  # largest |difference| of any feature
    rel_l2: float  # ||difference|| / ||reference|| over the whole batch
    min_cosine: float  # the worst cosine similarity of one query row (a [H] feature vector) with its reference


def drift(values: np.ndarray, reference: np.ndarray) -> Drift:
    """Drift of `values` [N, 256, H] from `reference` [N, 256, H] (both computed in float64 here)."""
    values, reference = values.astype(np.float64), reference.astype(np.float64)
    diff = values - reference
    norms = np.linalg.norm(values, axis=-1) * np.linalg.norm(reference, axis=-1)
    cosine = (values * reference).sum(-1) / np.maximum(norms, np.finfo(np.float64).tiny)
    return Drift(
        float(np.abs(diff).max()), float(np.linalg.norm(diff) / np.linalg.norm(reference)), float(cosine.min())
    )


def measure_fp16_drift(model_or_checkpoint, images, workdir) -> dict[str, Drift]:
    """Drift of `input_vit` from PyTorch float32 for ONNX Runtime in float32, in float16 throughout, and in float16
    with LayerNorm in float32, on `images` (paths or PIL images). Writes the three ONNX files under `workdir`."""
    tower = visual_tower_of(model_or_checkpoint)
    workdir = Path(workdir)
    pixels = preprocess_images(images, tower.image_size)  # [N, 3, S, S]
    with torch.no_grad():
        reference = tower(pixels).numpy()  # [N, 256, H]
    fp32 = export_visual_onnx(tower, workdir / "visual_fp32.onnx")
    graphs = {
        "onnxruntime float32": fp32,
        "onnxruntime float16": to_float16_onnx(fp32, workdir / "visual_fp16.onnx", keep_fp32=()),
        "onnxruntime float16, LayerNorm float32": to_float16_onnx(fp32, workdir / "visual_fp16_ln32.onnx"),
    }
    return {name: drift(OnnxVisualEncoder(path)(pixels).numpy(), reference) for name, path in graphs.items()}
