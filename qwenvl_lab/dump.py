"""Per-stage dumps — one safetensors file per run: each stage of the pipeline a named tensor, what ran it in the file's
header metadata (docs/diff.md).

A dump holds, in pipeline order, whichever stages its run recorded: the preprocessed pixels, `input_vit`, the prompt
ids, `img_pos`, the ids with fake ids, the prompt table with `tasks` and `task_vocab_size`, the merged input
embeddings, each decoder layer's output, the first step's logits and the generated ids — one request, no batch
dimension. The header says what ran: implementation, dtype, device, versions, vocab_size and the decoding settings.
`DumpRecorder` writes one (`record` a tensor, or `hook_input` / `hook_output` / `hook_layers` a torch module so that
its first call, the prefill, is recorded; then `save`); `read_dump` reads one back. No model is imported here: a
user's own script, the TensorRT-LLM environment and the package's implementations all record through it.
"""

import json
import os
import re
from dataclasses import dataclass, field
from importlib import metadata as package_metadata
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes

from . import files
from .checks.tensors import DTYPES, dtype_name
from .checks.values import check_int, check_path

FORMAT = "qwenvl-lab-dump/1"  # the header's "format": marks a file this package (or its recorder) wrote
DUMP_WRITER = files.writer("stage dump", "a run's per-stage dump (safetensors)")


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline as a dump holds it: its name, shape, kind and the step it belongs to."""

    name: str
    shape: str  # the shape stored, one request: "[L, H]"
    ids: bool  # ids (compared exactly) or features (compared within the dtypes' tolerance)
    step: str  # the pipeline step whose usual causes of a divergence apply (stagediff.CAUSES)
    what: str


STAGES = (  # in pipeline order; "layers.{i}" stands for every decoder layer's output, i from 0
    Stage("pixels", "[N, 3, S, S]", False, "preprocessing", "the pictures resized and normalised"),
    Stage("input_vit", "[N, 256, H]", False, "vision", "the vision tower's features, 256 rows a picture"),
    Stage("prompt_ids", "[L]", True, "prompt", "the prompt's ids, each image span holding its picture's path"),
    Stage("img_pos", "[N, 3]", True, "prompt", "(request, <img>, </img>) of each picture"),
    Stage("input_ids", "[L]", True, "fake ids", "the ids the language model reads: fake ids in the image spans"),
    Stage("prompt_table", "[rows, H]", False, "table", "the prompt table"),
    Stage("tasks", "[B]", True, "table", "the table block each request reads"),
    Stage("task_vocab_size", "[1]", True, "table", "the rows of a block"),
    Stage("input_embeds", "[L, H]", False, "embeddings", "the merged input embeddings the first layer reads"),
    Stage("layers.{i}", "[L, H]", False, "layers", "decoder layer i's output"),
    Stage("logits", "[V]", False, "logits", "the logits that pick the first new token (the last prompt position's)"),
    Stage("output_ids", "[T]", True, "decoding", "the generated ids"),
)
LAYER_STAGE = "layers.{i}"
LAYER_NAME = re.compile(r"layers\.(0|[1-9][0-9]*)")
_BY_NAME = {stage.name: stage for stage in STAGES}
_ORDER = {stage.name: k for k, stage in enumerate(STAGES)}
_RANK = {stage.name: stage.shape.count(",") + 1 for stage in STAGES}  # dimensions stored
VERSIONED = ("qwenvl_lab", "torch", "transformers", "onnxruntime", "tensorrt", "tensorrt_llm")
MAKE_DUMPS = "make dumps with `qwenvl-lab dump` or qwenvl_lab.dump.DumpRecorder (docs/diff.md)"


def stage(name: str) -> Stage:
    """The Stage a dump's tensor name stands for ("layers.3" is a decoder layer's); a ValueError for any other."""
    if isinstance(name, str) and name in _BY_NAME and name != LAYER_STAGE:
        return _BY_NAME[name]
    if isinstance(name, str) and LAYER_NAME.fullmatch(name):
        return _BY_NAME[LAYER_STAGE]
    known = ", ".join(s.name for s in STAGES)
    raise ValueError(f"{name!r} is not a stage of a dump; the stages are {known} (layers.0, layers.1, …)")


def pipeline_order(names) -> list[str]:
    """Stage names sorted in pipeline order (the layers by their number)."""

    def key(name):
        found = LAYER_NAME.fullmatch(name)
        return (_ORDER[stage(name).name], int(found[1]) if found else 0)

    return sorted(names, key=key)


def versions() -> dict[str, str]:
    """The installed versions of the packages a run's numbers depend on (those present), read without importing them."""
    found = {}
    for name in VERSIONED:
        try:
            found[name] = package_metadata.version(name)
        except package_metadata.PackageNotFoundError:
            continue
    return found


def as_stage_tensor(name: str, value) -> torch.Tensor:
    """`value` as dump stage `name` holds it: on the CPU, a copy, one request (a leading batch of 1 dropped; for the
    logits, the last position's row), ids as int64, features in their own floating dtype."""
    spec = stage(name)
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    elif not isinstance(value, torch.Tensor):
        if not spec.ids:
            raise TypeError(f"stage {name}: give a torch.Tensor (or numpy array), got {type(value).__name__}")
        value = torch.as_tensor(value)
    tensor = value.detach().to("cpu")
    rank = _RANK[spec.name]
    if spec.name == "logits" and tensor.dim() > 1:
        if tensor.shape[0] != 1 and tensor.dim() > 2:
            raise ValueError(f"stage logits: one request's logits, got shape {tuple(tensor.shape)}")
        tensor = tensor.reshape(-1, tensor.shape[-1])[-1]  # [V]: the last prompt position picks the first new token
    while tensor.dim() > rank and tensor.shape[0] == 1:
        tensor = tensor[0]  # [1, L, H] → [L, H]; generate's [1, 1, T] → [T]
    if tensor.dim() != rank:
        raise ValueError(f"stage {name} is {spec.shape} (one request), got shape {tuple(tensor.shape)}")
    if spec.ids:
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise TypeError(f"stage {name} holds ids: give an integer tensor, got {tensor.dtype}")
        return tensor.to(torch.int64).clone()
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"stage {name} holds features: give a floating-point tensor, got {tensor.dtype}")
    return tensor.clone().contiguous()


def _json_field(text, key: str, where):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: header field {key!r} is not JSON ({str(text)[:60]!r}); {MAKE_DUMPS}") from None


@dataclass
class Dump:
    """A dump read back: its tensors by stage name in pipeline order, and its header."""

    path: Path
    tensors: dict  # stage name → tensor, in pipeline order
    header: dict  # the metadata as stored: str → str

    @property
    def implementation(self) -> str:
        """What ran (the recorder's implementation string)."""
        return self.header.get("implementation", "unknown")

    @property
    def dtype(self) -> str:
        """The dtype the run was asked to compute in: float32, float16 or bfloat16."""
        return self.header["dtype"]

    @property
    def device(self) -> str:
        """Where it ran."""
        return self.header.get("device", "unknown")

    @property
    def vocab_size(self) -> int | None:
        """The model's vocabulary size: ids from it on are fake ids (None when the run did not say)."""
        value = self.header.get("vocab_size")
        return int(value) if value not in (None, "") else None

    @property
    def sampling(self) -> dict | None:
        """How the run decoded ({"greedy": true} or the sampling knobs), None when it did not say."""
        value = self.header.get("sampling")
        return None if value in (None, "") else _json_field(value, "sampling", self.path)

    @property
    def notes(self) -> dict:
        """The run's other header fields (pictures, question, vision graph …)."""
        fixed = {"format", "implementation", "dtype", "device", "versions", "vocab_size", "sampling"}
        return {k: v for k, v in self.header.items() if k not in fixed}

    @property
    def versions(self) -> dict:
        """The versions the run recorded."""
        return _json_field(self.header.get("versions", "{}"), "versions", self.path)

    def describe(self) -> str:
        """One line: implementation (dtype, device)."""
        return f"{self.implementation} ({self.dtype}, {self.device})"


def read_dump(path) -> Dump:
    """The dump in file `path`, checked: a safetensors file whose header says it is a dump, every tensor a stage."""
    path = check_path("dump", path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder, not a dump: give a .safetensors file a dump wrote")
    if not path.is_file():
        raise FileNotFoundError(f"dump not found: {str(path)!r}; {MAKE_DUMPS}")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = dict(f.metadata() or {})
            names = list(f.keys())
            if header.get("format") != FORMAT:
                raise ValueError(
                    f"{path} is not a dump of this format (its header's format is {header.get('format')!r}, "
                    f"not {FORMAT!r}); {MAKE_DUMPS}"
                )
            for name in names:
                stage(name)
            tensors = {name: f.get_tensor(name) for name in pipeline_order(names)}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} cannot be read as a safetensors file ({err}); {MAKE_DUMPS}") from None
    except ValueError as err:
        if str(err).startswith(str(path)):
            raise
        raise ValueError(f"{path}: {err}") from None
    if header.get("dtype") not in DTYPES:
        raise ValueError(f"{path}: header dtype must be one of {sorted(DTYPES)}, got {header.get('dtype')!r}")
    for name, tensor in tensors.items():
        if stage(name).ids and tensor.dtype.is_floating_point:
            raise ValueError(f"{path}: stage {name} holds ids but is stored as {tensor.dtype}; {MAKE_DUMPS}")
    dump = Dump(path, tensors, header)
    _ = (dump.sampling, dump.versions)  # the JSON fields checked now, not halfway through a comparison
    if dump.vocab_size is not None:
        check_int("vocab_size", dump.vocab_size, 1)
    return dump


def is_dump(path) -> bool:
    """True when `path` is a file whose safetensors header says it is a dump (written by this package's recorder)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("format") == FORMAT
    except (SafetensorError, OSError, ValueError):
        return False


def check_dump_target(path, overwrite: bool = False) -> Path:
    """Where a dump may be written, checked before any work: not a folder, not a file this package did not write (never
    replaced), an earlier dump only with overwrite, in a folder one can write to."""
    if not str(path).strip():
        raise ValueError("the dump's file name is empty: give one, e.g. run.safetensors")
    path = check_path("dump", path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{str(path)!r} is a folder: give a file name for the dump, e.g. {path / 'run.safetensors'}"
        )
    if path.exists() and not path.is_symlink():  # a link is refused as every writer refuses one (files.py)
        if not is_dump(path):
            raise FileExistsError(
                f"{path} exists and is not a dump this package wrote: it is not replaced; give a new file name"
            )
        if not overwrite:
            raise FileExistsError(f"{path} already holds a dump: pass overwrite=True (--overwrite) to replace it")
    folder = next(p for p in [path.parent, *path.parent.parents] if p.exists())
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file, so {path} cannot be made: give a path in a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write in {folder}: give a path in a folder you can write to")
    return path


@dataclass
class DumpRecorder:
    """Collects one run's stages and writes them as a dump.

    `implementation` names what ran; `dtype` the precision the run was asked for (float32, float16, bfloat16: the
    comparison's tolerances follow it); `vocab_size` the model's, from which ids are fake ids; `sampling` how it
    decoded ({"greedy": True} or the knobs); `notes` any other facts (str) for the header.
    """

    implementation: str
    dtype: str
    device: str = "cpu"
    vocab_size: int | None = None
    sampling: dict | None = None
    notes: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    hooks: list = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.implementation, str) or not self.implementation.strip():
            raise ValueError("implementation must name what ran, e.g. 'Qwen-VL-Chat remote code, transformers 4.36'")
        self.dtype = dtype_name(self.dtype)
        self.device = str(self.device)
        if self.vocab_size is not None:
            check_int("vocab_size", self.vocab_size, 1)
        if self.sampling is not None and not isinstance(self.sampling, dict):
            raise TypeError(f"sampling must be a dict such as {{'greedy': True}}, got {type(self.sampling).__name__}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.notes.items()):
            raise TypeError("notes must map str to str")

    def record(self, name: str, value) -> None:
        """Keep `value` as stage `name` (see STAGES; "layers.3" for decoder layer 3); each stage once."""
        if name in self.tensors:
            raise ValueError(f"stage {name} is already recorded: each stage holds one tensor")
        self.tensors[name] = as_stage_tensor(name, value)

    def _first(self, name: str, value) -> None:
        if name not in self.tensors:  # the first call is the prefill; decode steps after it are not recorded
            self.record(name, value[0] if isinstance(value, (tuple, list)) else value)

    def hook_output(self, module: torch.nn.Module, name: str):
        """Record stage `name` from the output of `module`'s first call (a tuple's first element: the hidden states)."""
        stage(name)
        handle = module.register_forward_hook(lambda _module, _args, output: self._first(name, output))
        self.hooks.append(handle)
        return handle

    def hook_input(self, module: torch.nn.Module, name: str):
        """Record stage `name` from the first input of `module`'s first call (positional, or its first tensor
        keyword: e.g. the merged embeddings that the first decoder layer reads)."""
        stage(name)

        def first_input(_module, args, kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)] + [
                v for v in kwargs.values() if isinstance(v, torch.Tensor)
            ]
            if tensors:
                self._first(name, tensors[0])

        handle = module.register_forward_pre_hook(first_input, with_kwargs=True)
        self.hooks.append(handle)
        return handle

    def hook_layers(self, blocks) -> list:
        """Record every decoder layer's output (layers.0, layers.1, …) from the blocks' first calls."""
        return [self.hook_output(block, f"layers.{i}") for i, block in enumerate(blocks)]

    def remove_hooks(self) -> None:
        """Detach every hook this recorder placed."""
        for handle in self.hooks:
            handle.remove()
        self.hooks.clear()

    def header(self) -> dict[str, str]:
        """The dump's header metadata (str → str)."""
        header = {
            "format": FORMAT,
            "implementation": self.implementation,
            "dtype": self.dtype,
            "device": self.device,
            "versions": json.dumps(versions(), sort_keys=True),
        }
        if self.vocab_size is not None:
            header["vocab_size"] = str(self.vocab_size)
        if self.sampling is not None:
            header["sampling"] = json.dumps(self.sampling, sort_keys=True)
        reserved = sorted(set(self.notes) & (set(header) | {"vocab_size", "sampling"}))
        if reserved:
            raise ValueError(f"notes may not use the header's own fields {reserved}")
        return {**header, **self.notes}

    def save(self, path, overwrite: bool = False) -> Path:
        """Write the dump to `path` (checked as `check_dump_target` says; then written the package's one way)."""
        if not self.tensors:
            raise ValueError("nothing was recorded: record(...) a stage or run the hooked model before save")
        need = sum(t.numel() * t.element_size() for t in self.tensors.values()) + 2**16  # the header's room too
        path = check_dump_target(path, overwrite)  # an earlier dump only with overwrite; any other file never
        files.check_destination(path, DUMP_WRITER, folder=False, overwrite=overwrite, need_bytes=need, parents=True)
        data = safetensors_bytes(pipeline_ordered(self.tensors), metadata=self.header())
        with files.writing_file(path, DUMP_WRITER, overwrite=overwrite, need_bytes=len(data), parents=True) as part:
            part.write_bytes(data)
        return path


def pipeline_ordered(tensors: dict) -> dict:
    """`tensors` (stage name → tensor) in pipeline order."""
    return {name: tensors[name] for name in pipeline_order(tensors)}
