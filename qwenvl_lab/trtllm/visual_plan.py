"""Notebook 05 — the vision tower as a TensorRT plan: built from the ONNX file (FP16, batches 1/1/4), run on the GPU.

Two ways to an fp16 plan. Weakly typed (the default): the float32 graph and TensorRT's FP16 flag, the flag that
upstream's vit_onnx_trt.py and multimodal builder build with, TensorRT choosing each layer's precision. Strongly
typed: a float16 graph (`fp16.to_float16_onnx`, LayerNorm kept in float32) built with
NetworkDefinitionCreationFlag.STRONGLY_TYPED, so every layer runs in the type the graph gives it (docs/tensorrt.md,
"The fp16 vision plan").
"""

from pathlib import Path

import onnx
import torch

from .. import files
from ..checks.values import check_path, is_int
from ..vision import preprocess_images
from .gpu import require_gpu_stack
from .vision_graph import INPUT_NAME, OUTPUT_NAME, onnx_image_size

PLAN_WRITER = files.writer("vision plan", "a TensorRT plan of the vision tower")


def check_batch_profile(min_batch: int, opt_batch: int, max_batch: int) -> None:
    """Raise unless 1 <= min_batch <= opt_batch <= max_batch (integers)."""
    values = (min_batch, opt_batch, max_batch)
    integers = all(is_int(v) for v in values)
    if not integers or not 1 <= min_batch <= opt_batch <= max_batch:
        raise ValueError(f"the batch profile needs integers 1 <= min_batch <= opt_batch <= max_batch, got {values}")


def graph_float_types(onnx_path) -> set[str]:
    """The floating-point types of an ONNX graph's weights ({"FLOAT"}, {"FLOAT", "FLOAT16"}, …), read without them."""
    graph = onnx.load(str(check_path("onnx_path", onnx_path)), load_external_data=False).graph
    floating = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    return {onnx.TensorProto.DataType.Name(t.data_type) for t in graph.initializer if t.data_type in floating}


def build_visual_plan(
    onnx_path,
    plan_path,
    fp16: bool = True,
    min_batch: int = 1,
    opt_batch: int = 1,
    max_batch: int = 4,
    strongly_typed: bool = False,
    overwrite: bool = False,
) -> Path:
    """Build and save a TensorRT engine (`.plan`) of the exported vision tower with the `tensorrt` Python API (a new
    file, or with overwrite=True one replacing it).

    strongly_typed=True builds a float16 graph (`to_float16_onnx`) in the types it states, without precision flags.
    """
    check_batch_profile(min_batch, opt_batch, max_batch)
    need = 2 * Path(onnx_path).stat().st_size if Path(onnx_path).is_file() else 0  # float16 of a float32 graph, or so
    files.check_destination(plan_path, PLAN_WRITER, folder=False, overwrite=overwrite, need_bytes=need, parents=True)
    size = onnx_image_size(onnx_path)
    if strongly_typed and "FLOAT16" not in graph_float_types(onnx_path):
        raise ValueError(
            f"{onnx_path} holds float32 weights only: a strongly typed build runs every layer in the graph's own type, "
            "so it would give a float32 plan. Make the float16 graph first (to_float16_onnx), or leave "
            "strongly_typed off to build with TensorRT's FP16 flag"
        )
    require_gpu_stack("tensorrt", "cuda", step="build_visual_plan")
    import tensorrt as trt  # noqa: PLC0415 — optional: GPU machines

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)  # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # from the file, so weights stored beside it are found
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser rejected {onnx_path}: {errors}")
    config = builder.create_builder_config()
    if fp16 and not strongly_typed:  # precision flags do not apply to a strongly typed network: its types decide
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    profile.set_shape(INPUT_NAME, (min_batch, 3, size, size), (opt_batch, 3, size, size), (max_batch, 3, size, size))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"TensorRT could not build a plan from {onnx_path}; its log above says why")
    with files.writing_file(plan_path, PLAN_WRITER, overwrite=overwrite, need_bytes=plan.nbytes, parents=True) as part:
        with open(part, "wb") as f:
            f.write(plan)  # IHostMemory is a buffer: no copy of the (GB-sized) engine
    return Path(plan_path)


class TRTVisualEncoder:
    """A vision plan on the GPU with the interface of OnnxVisualEncoder: pixels → `input_vit`."""

    def __init__(self, plan_path):
        plan_path = Path(plan_path)
        if not plan_path.is_file():
            raise FileNotFoundError(f"plan file not found: {str(plan_path)!r}; make it with build_visual_plan")
        require_gpu_stack("tensorrt", "cuda", step="TRTVisualEncoder")
        import tensorrt as trt  # noqa: PLC0415 — optional: GPU machines

        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(plan_path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not load {plan_path} (built by another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        self.image_size = self.engine.get_tensor_shape(INPUT_NAME)[2]
        self.max_batch = self.engine.get_tensor_profile_shape(INPUT_NAME, 0)[2][0]  # (min, opt, max) shapes
        self.output_dtype = {trt.float32: torch.float32, trt.float16: torch.float16}[
            self.engine.get_tensor_dtype(OUTPUT_NAME)
        ]

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, S, S] → input_vit [B, 256, H] on the GPU, max_batch images per run."""
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (3, self.image_size, self.image_size):
            raise ValueError(
                f"expected pixels [B, 3, {self.image_size}, {self.image_size}], got {tuple(pixels.shape)}; "
                "use preprocess_images"
            )
        return torch.cat([self._run(chunk) for chunk in pixels.split(self.max_batch)])

    def _run(self, pixels: torch.Tensor) -> torch.Tensor:
        pixels = pixels.to("cuda", torch.float32).contiguous()  # [b, 3, S, S]
        self.context.set_input_shape(INPUT_NAME, tuple(pixels.shape))
        out = torch.empty(tuple(self.context.get_tensor_shape(OUTPUT_NAME)), dtype=self.output_dtype, device="cuda")
        self.context.set_tensor_address(INPUT_NAME, pixels.data_ptr())
        self.context.set_tensor_address(OUTPUT_NAME, out.data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT failed to run the vision plan")
        stream.synchronize()
        return out  # [b, 256, H]

    def encode(self, images) -> torch.Tensor:
        """Paths or PIL images → `input_vit` [N, 256, H]."""
        return self(preprocess_images(images, self.image_size))
