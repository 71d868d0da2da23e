"""Notebook 05 — the vision tower as ONNX (opset 17, `input` [B, 3, S, S] → `output` [B, 256, H]), run on a CPU."""

import copy
import warnings
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

from .. import files
from ..checkpoint import load_visual_tower
from ..checks.values import check_path
from ..modeling import QWenLMHeadModel
from ..vision import N_QUERIES, VisionTransformer, preprocess_images
from .vision_graph import INPUT_NAME, OPSET, OUTPUT_NAME, onnx_image_size

ONNX_WRITER = files.writer("ONNX graph", "an ONNX graph of the vision tower")
WRITTEN_BY = ("written_by", "qwenvl-lab")  # the graphs' metadata: an export of this package, replaced without asking


def mark_as_ours(graph_model: onnx.ModelProto) -> None:
    """Record in `graph_model`'s metadata that this package wrote it."""
    if not ours_metadata(graph_model):
        entry = graph_model.metadata_props.add()
        entry.key, entry.value = WRITTEN_BY


def ours_metadata(graph_model: onnx.ModelProto) -> bool:
    """True when `graph_model`'s metadata says this package wrote it."""
    return any((p.key, p.value) == WRITTEN_BY for p in graph_model.metadata_props)


def ours(path) -> bool:
    """True for an ONNX file this package wrote: its metadata says so, or (written before the metadata) it is a vision
    tower with export_visual_onnx's input and output, [batch, 3, S, S] → [batch, 256, H]. Its weights are not read."""
    try:
        graph_model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 — anything onnx cannot read is not ours
        return False
    if ours_metadata(graph_model):
        return True
    shapes = {
        value.name: [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
        for value in [*graph_model.graph.input, *graph_model.graph.output]
    }
    size = (shapes.get(INPUT_NAME) or [None] * 4)[2]
    return shapes.get(INPUT_NAME) == ["batch", 3, size, size] and (shapes.get(OUTPUT_NAME) or [0, 0])[:2] == [
        "batch",
        N_QUERIES,
    ]


def visual_tower_of(model_or_checkpoint) -> VisionTransformer:
    """The float32 vision tower of a QWenLMHeadModel, a VisionTransformer or a checkpoint directory."""
    if isinstance(model_or_checkpoint, QWenLMHeadModel):
        tower = model_or_checkpoint.transformer.visual
    elif isinstance(model_or_checkpoint, VisionTransformer):
        tower = model_or_checkpoint
    elif isinstance(model_or_checkpoint, (str, Path)):
        return load_visual_tower(model_or_checkpoint, dtype=torch.float32)
    else:
        raise TypeError(
            "export_visual_onnx takes a QWenLMHeadModel, a VisionTransformer or a checkpoint directory, "
            f"got {type(model_or_checkpoint).__name__}"
        )
    if tower.conv1.weight.dtype != torch.float32:
        tower = copy.deepcopy(tower).float()  # an fp32 graph: onnxruntime parity, TensorRT picks fp16 itself
    return tower.eval()


def export_visual_onnx(model_or_checkpoint, onnx_path, overwrite: bool = False) -> Path:
    """Export `transformer.visual` to ONNX with a dynamic batch (a new file and the weights beside it past 2 GB; an
    earlier export of this package there is replaced, anything else only with overwrite=True); checked with
    `onnx.checker` before it is put in place."""
    onnx_path = check_path("onnx_path", onnx_path)
    files.check_destination(onnx_path, ONNX_WRITER, folder=False, overwrite=overwrite, parents=True, made=ours)
    tower = visual_tower_of(model_or_checkpoint)
    need = 2 * sum(t.numel() * 4 for t in tower.state_dict().values())  # float32 weights, and the graph's rewrite
    with files.writing_file(
        onnx_path, ONNX_WRITER, overwrite=overwrite, need_bytes=need, parents=True, made=ours
    ) as part:
        _export(tower, part)
    return onnx_path


def _export(tower, onnx_path: Path) -> None:
    """Write the ONNX graph of `tower` as `onnx_path` (large weights beside it), its output shape declared, checked."""
    size = tower.image_size
    pixels = torch.zeros(2, 3, size, size, device=tower.conv1.weight.device)  # [2, 3, S, S]: batch 2 keeps B symbolic
    with warnings.catch_warnings(), torch.no_grad():
        # the TorchScript exporter (and its internals) warn that they are deprecated, but torch.export's
        # exporter (dynamo=True) needs onnxscript and writes opset-18 Split nodes that fail opset-17 checks
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)  # the input-shape check in forward
        torch.onnx.export(
            tower,
            (pixels,),
            str(onnx_path),
            dynamo=False,
            opset_version=OPSET,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )  # past 2 GB (the real 448-px tower) the weights go to files beside onnx_path
    declare_output_shape(onnx_path, tower.output_dim)
    onnx.checker.check_model(str(onnx_path))


def declare_output_shape(onnx_path, hidden: int) -> None:
    """Write `output`'s shape as [batch, 256, H]: shape inference loses the 256 queries inside the resampler."""
    graph_model = onnx.load(str(check_path("onnx_path", onnx_path)), load_external_data=False)  # weights stay beside
    dims = graph_model.graph.output[0].type.tensor_type.shape.dim
    dims[1].dim_value, dims[2].dim_value = N_QUERIES, hidden
    mark_as_ours(graph_model)
    with files.writing_file(onnx_path, ONNX_WRITER, overwrite=True, need_bytes=graph_model.ByteSize()) as part:
        onnx.save(graph_model, str(part))  # the weights stored beside it stay there, named relative to it


class OnnxVisualEncoder:
    """The exported vision tower as an onnxruntime session: the CPU vision engine, pixels → `input_vit`."""

    def __init__(self, onnx_path, providers=("CPUExecutionProvider",)):
        self.image_size = onnx_image_size(onnx_path)
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: constant folding's notes on the Resize nodes are no results
        self.session = ort.InferenceSession(str(onnx_path), options, providers=list(providers))

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, S, S] → input_vit [B, 256, H] (float32, CPU)."""
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (3, self.image_size, self.image_size):
            raise ValueError(
                f"expected pixels [B, 3, {self.image_size}, {self.image_size}], got {tuple(pixels.shape)}; "
                "use preprocess_images"
            )
        feed = {INPUT_NAME: pixels.detach().float().cpu().contiguous().numpy()}
        return torch.from_numpy(self.session.run([OUTPUT_NAME], feed)[0])  # [B, 256, H]

    def encode(self, images) -> torch.Tensor:
        """Paths or PIL images → `input_vit` [N, 256, H]."""
        return self(preprocess_images(images, self.image_size))
