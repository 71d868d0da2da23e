"""Every public function that takes a path refuses one the file system cannot take, with the package's own message.

The walker finds the functions by their parameters' names (a path is named `…_dir`, `…_path`, `…_file`, `folder`,
`workdir`, `checkpoint`, `image`, …), calls each with a path holding a lone surrogate ("\\ud800": text no file system
encodes) in that parameter and good values in the others, and expects a ValueError saying it "cannot be encoded"
(never a UnicodeEncodeError from deep inside, a "not found", or a silent success). A new function with a path
parameter is tried unasked; one whose parameter only looks like a path is listed in NOT_PATHS with the reason.
"""

import importlib
import inspect
import pkgutil
import re
import types

import pytest
import torch

import qwenvl_lab
from qwenvl_lab.chat import Conversation, ModelAsRunner
from qwenvl_lab.checks.values import check_path
from qwenvl_lab.infer import QWenInfer
from qwenvl_lab.limits import BuildConfig
from qwenvl_lab.toy import TOY_DIR

BAD = "bad\ud800path"
PATH_NAME = re.compile(
    r"(_dir|_path|_file|^path|^folder|^directory|^workdir|^root|^course|^mine|^out|^source|^target|checkpoint|^image|"
    r"^images|^picture|^pictures)$"
)
# parameters named like a path that hold something else, and the functions the walker cannot call on their own
NOT_PATHS = {
    "qwenvl_lab.grounding.to_list_format": "source: the answer text or its ids",
    "qwenvl_lab.grounding.parse_boxes": "source: the answer text (picture= is walked through boxes_picture)",
    "qwenvl_lab.grounding.draw_boxes": "image: a PIL image to draw on",
    "qwenvl_lab.grounding.Box.__init__": "picture: the index of a picture in a request",
    "qwenvl_lab.prompt_table.TableBlock.__init__": "picture: the index of a picture in a request",
    "qwenvl_lab.course.diagrams.request_color": "picture: an index",
    "qwenvl_lab.course.widgets.show_png": "image: PNG bytes shown in a notebook",
    "qwenvl_lab.course.widgets.picture_png": "picture: a PIL image",
    "qwenvl_lab.course.widgets.thumbnail_html": "picture: a PIL image",
    "qwenvl_lab.course.course_map.Step.__init__": "path: a notebook's name on the course map",
    "qwenvl_lab.chat.picture_name": "picture: named, not read",
    "qwenvl_lab.chat.picture_key": "picture: keyed by its pixels after it was read",
    "qwenvl_lab.toy.shapes.Example.__init__": "images: the rendered scenes of an example",
    "qwenvl_lab.toy.batches.Turn.__init__": "pictures: rendered scenes",
    "qwenvl_lab.toy.batches.make_conversation": "pictures: rendered scenes",
    "qwenvl_lab.clip.small_clip": "images: a count of random pictures",
    "qwenvl_lab.course.exercises.nb06.short_path": "picture: a path shown, not opened",
    "qwenvl_lab.course.lab.lab_command": "root: written into a command line, not opened",
    "qwenvl_lab.course.lab.lab_environment": "root: written into the environment, not opened",
    "qwenvl_lab.trtllm.build_command.trtllm_build_command": "paths written into trtllm-build's command line",
    "qwenvl_lab.files.writing_file": "a context manager: walked through every writer (tests/test_writers.py)",
    "qwenvl_lab.files.writing_folder": "a context manager: walked through every writer (tests/test_writers.py)",
    "qwenvl_lab.files.remove_made": "only ever given a folder it made",
    "qwenvl_lab.files.check_room": "only ever given a checked destination's folder",
    "qwenvl_lab.files.free_bytes": "only ever given a checked destination's folder",
    "qwenvl_lab.files.read_mark": "reads a mark in a folder it was given, refusing nothing",
    "qwenvl_lab.files.made_files": "reads a mark in a folder it was given, refusing nothing",
    "qwenvl_lab.files.backup_name": "a name, not opened",
    "qwenvl_lab.trtllm.onnx_export.ours": "a recogniser: False for anything it cannot read",
    "qwenvl_lab.toy.train.is_state": "a recogniser: False for anything it cannot read",
    "qwenvl_lab.engine.decode.DecodeStep.__init__": "tuning_file: a runner's own, beside its checked engine",
    "qwenvl_lab.engine.decode.numba_step.NumbaDecode.__init__": "tuning_file: a runner's own",
    "qwenvl_lab.engine.decode.torch_ops.TorchDecode.__init__": "tuning_file: a runner's own",
    "qwenvl_lab.engine.decode.triton_step.TritonDecode.__init__": "tuning_file: a runner's own",
    "qwenvl_lab.engine.runner.ModelRunner.__init__": "engine_dir, tuning_file: a loaded engine's, already checked",
    "qwenvl_lab.engine.runner.ModelRunner.from_model": "tuning_file: the benchmark's own",
    "qwenvl_lab.chat.as_pictures": "pictures: only made a list; each is read through pictures.load_image",
    "qwenvl_lab.cli.answer_turn": "pictures: attached by /image, each checked there (cli.attach)",
    "qwenvl_lab.bench.first_answers": "workdir: the benchmark's own temporary folder",
    "qwenvl_lab.bench.load_model": "workdir: the benchmark's own temporary folder",
    "qwenvl_lab.bench.measure_all": "workdir: the benchmark's own temporary folder",
    "qwenvl_lab.bench.weight_only_runner": "checkpoint, workdir: the benchmark's own, checked where it loads them",
    "qwenvl_lab.course.doctor.check_install_disk": "folder: the doctor's own, read with the standard library only",
    "qwenvl_lab.course.doctor.check_wheelhouse": "folder: WHEELHOUSE= or the clone's; a folder it cannot use is a fail line",
    "qwenvl_lab.course.doctor.check_package_index": "folder: the wheelhouse check_wheelhouse reports on",
    "qwenvl_lab.course.lab.missing_jupyterlab": "root: the clone, found by course_root",
    "qwenvl_lab.engine.block_reuse.RequestKey.__init__": "pictures: (start, end, hash) of each picture's span",
    "qwenvl_lab.checks.values.unusable_path": "path: one the system already refused, named in the reason it gives",
    "qwenvl_lab.toy.train.foreign_state": "path: named in the refusal of a file read_state read",
    "qwenvl_lab.toy.train.resume": "state_dir: read by read_state, which checks it",
    "qwenvl_lab.answer_stages.record_vision": "pictures: read by the vision encoder through pictures.load_image",
    "qwenvl_lab.answer_stages.record_answer": "pictures: read by the vision encoder through pictures.load_image",
    "qwenvl_lab.trtllm.pipeline.dumped_answer": "image: read through record_answer (pictures.load_image)",
    "qwenvl_lab.cli.check_dump_sources": "an argparse helper: its options are walked through the commands",
    "qwenvl_lab.dump.Dump.__init__": "path: the file read_dump opened (walked there)",
    "qwenvl_lab.dump.is_dump": "a recogniser: False for anything it cannot read",
    "qwenvl_lab.dump.DumpRecorder.save": "walked through the stage dump writer (tests/test_writers.py)",
    "qwenvl_lab.stage_dumps.sampling_settings": "directory: an engine or checkpoint folder already loaded by the caller",
    "qwenvl_lab.stage_dumps.implementation_dump": "checkpoint: loaded by load_checkpoint, which checks it",
    "qwenvl_lab.fonts.course_characters": "root: the checkout, found by the package itself",
    "qwenvl_lab.trtllm.visual_plan.TRTVisualEncoder.encode": "needs a TensorRT plan (GPU machines)",
    "qwenvl_lab.trtllm.visual_plan.TRTVisualEncoder.__init__": "needs TensorRT (GPU machines)",
    "qwenvl_lab.trtllm.visual_plan.build_visual_plan": "walked below with its own arguments",
    "qwenvl_lab.trtllm.runner.TRTLLMRunner.from_dir": "needs TensorRT-LLM (GPU machines); read_engine_config is walked",
    "qwenvl_lab.engine.decode.triton_linear.fused_linear": "out: a tensor to write into",
    "qwenvl_lab.course.course_map.pipeline_steps": "images: a count of pictures",
    "qwenvl_lab.course.course_map.pipeline_map": "images: a count of pictures",
    "qwenvl_lab.course.exercises.nb04.picture_row": "pictures: a count of pictures",
    "qwenvl_lab.course.exercises.nb06.request": "picture: a sample picture's name in data/images; read by load_image",
    "qwenvl_lab.course.exercises.nb06.engine_output": "picture: a sample picture's name in data/images",
    "qwenvl_lab.course.exercises.nb06.model_logits": "picture: a sample picture's name in data/images",
    "qwenvl_lab.course.exercises.nb06.capstone_reference": "pictures: sample pictures' names in data/images",
    "qwenvl_lab.course.widgets.ask_panel": "a widget: its picture is read by ask_panel_result (walked)",
    "qwenvl_lab.course.widgets.chat_panel": "a widget: its picture is read by chat_turn (walked)",
    "qwenvl_lab.course.factcheck.memory_by_dtype": "starts a process per dtype; load_config, its first step, is walked",
    "qwenvl_lab.course.factcheck.loaded_memory": "measures memory; load_checkpoint, its first step, is walked",
    "qwenvl_lab.trtllm.pipeline.run_gpu_steps": "needs TensorRT (GPU machines); its checkpoint and image: prepare",
    "qwenvl_lab.trtllm.pipeline.answer_question": "image: read by the runner's vision encoder (chat.ask, walked)",
    "qwenvl_lab.cli.save_new_picture:picture": "picture: a PIL image to save",
    "qwenvl_lab.files.check_destination:folder": "folder: a flag (a folder or a file)",
    "qwenvl_lab.trtllm.onnx_export.OnnxVisualEncoder.encode": "reads pictures through vision.preprocess_images (walked)",
    "qwenvl_lab.unified_checkpoint.check_trtllm_config": "checkpoint_dir: where a config already read lies, for messages",
}
# good values that differ by function (keyed by the function's dotted name)
GOOD_FOR = {
    "qwenvl_lab.files.check_destination": {"name": "engine"},
    "qwenvl_lab.files.write_text": {"name": "bench --json"},
    "qwenvl_lab.unified_checkpoint.load_trtllm_checkpoint": {"checkpoint_dir": "ENGINE/llm"},
}


def public_functions():
    """(dotted name, function, its path parameters) of every public function and method of the package."""
    found = []
    for info in pkgutil.walk_packages(qwenvl_lab.__path__, "qwenvl_lab."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional GPU stack
            continue
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            candidates = [(name, obj)]
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    member = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                    candidates.append((f"{name}.{attr}", member))
            for qualified, function in candidates:
                if not isinstance(function, types.FunctionType):
                    continue
                params = [p for p in inspect.signature(function).parameters if PATH_NAME.search(p)]
                if params:
                    found.append((f"{module.__name__}.{qualified}", function, params))
    return found


FUNCTIONS = public_functions()


@pytest.fixture(scope="module")
def good(tmp_path_factory, tiny_checkpoint, tiny_engine, tiny_model, tokenizer):
    """A good value for each parameter the walked functions take besides the path, and the instances whose methods
    are walked."""
    folder = tmp_path_factory.mktemp("good")
    runner = ModelAsRunner(tiny_model)
    values = {
        "model": tiny_model,
        "build_config": BuildConfig(max_batch_size=1, max_input_len=300, max_seq_len=320),
        "state": {},
        "characters": ["a"],
        "question": "图片里是什么？",
        "questions": ["图片里是什么？"],
        "answer": "<ref>a</ref><box>(1,2),(3,4)</box>",
        "name": "03",
        "fix": "repair it",
        "text": "text",
        "hidden": 128,
        "backup": folder / "backup",
        "image_size": 56,
        "tokenizer": tokenizer,
        "runner": runner,
        "vision": tiny_model.transformer.visual,
        "config": {},
        "checkpoint_dir": tiny_checkpoint,
        "engine_dir": tiny_engine,
        "course": qwenvl_lab.resources.checkout_dir() / "notebooks",
        "mine": folder / "mine",
        "root": qwenvl_lab.resources.checkout_dir(),
        "workdir": folder / "work",
        "output_dir": folder / "out",
        "checkpoint": TOY_DIR,
        "onnx_path": folder / "x.onnx",
        "out_path": folder / "y.onnx",
        "model_or_checkpoint": tiny_model,
        "out": folder / "font.ttf",
        "picture": qwenvl_lab.resources.images_dir() / "blue_square.png",
        "max_new_tokens": 4,
        "image": qwenvl_lab.resources.images_dir() / "blue_square.png",
        "source": qwenvl_lab.resources.data_dir() / "fonts" / "qwenvl-lab-cjk.ttf",
        "target": folder / "t",
        "folder": False,
        "path": folder / "p",
    }
    values["conversation"] = Conversation(runner, tiny_model.transformer.visual, tokenizer)
    values["instances"] = {
        "Conversation": lambda: Conversation(runner, tiny_model.transformer.visual, tokenizer),
        "QWenInfer": lambda: QWenInfer.from_dir(tiny_engine),
        "QWenTokenizer": lambda: tokenizer,
        "VisionTransformer": lambda: tiny_model.transformer.visual,
    }
    return values


def call_with_bad_path(dotted, function, param, good):
    """Call `function` with BAD in `param` (a list of it for a plural), its other required parameters good."""
    signature = inspect.signature(function)
    overrides = {k: good["engine_dir"] / "llm" if v == "ENGINE/llm" else v for k, v in GOOD_FOR.get(dotted, {}).items()}
    args = {}
    for name, parameter in signature.parameters.items():
        if name in ("self", "cls"):
            continue
        if name == param:
            args[name] = [BAD] if name.endswith(("images", "pictures", "paths")) else BAD
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            args[name] = overrides.get(name, good[name])
    owner = function.__qualname__.split(".")[0]
    cls = vars(inspect.getmodule(function)).get(owner)
    if function.__name__ == "__init__":
        return cls(**args)
    if "." in function.__qualname__:
        member = inspect.getattr_static(cls, function.__name__)
        if isinstance(member, classmethod):
            return getattr(cls, function.__name__)(**args)
        result = getattr(good["instances"][owner](), function.__name__)(**args)
    else:
        result = function(**args)
    if hasattr(result, "__enter__"):  # a context manager checks as it is entered
        with result:
            return result
    return list(result) if inspect.isgenerator(result) else result


WALKED = [
    pytest.param(name, function, param, id=f"{name}:{param}")
    for name, function, params in FUNCTIONS
    if name not in NOT_PATHS
    for param in params
    if f"{name}:{param}" not in NOT_PATHS
]


def test_the_walker_finds_the_path_taking_functions():
    names = {name for name, _, _ in FUNCTIONS}
    for expected in (
        "qwenvl_lab.pictures.load_image",
        "qwenvl_lab.engine.build.build_engine",
        "qwenvl_lab.checkpoint.load_checkpoint",
        "qwenvl_lab.toy.train.train",
        "qwenvl_lab.course.lab.copy_course_notebooks",
        "qwenvl_lab.infer.QWenInfer.from_dir",
        "qwenvl_lab.chat.Conversation.ask",
    ):
        assert expected in names
    assert len(WALKED) >= 60
    stale = sorted({key.split(":")[0] for key in NOT_PATHS} - names)
    assert stale == [], "NOT_PATHS names a function that no longer takes a path"


@pytest.mark.parametrize("name, function, param", WALKED)
def test_a_path_that_cannot_be_encoded_is_refused_with_the_packages_message(name, function, param, good):
    try:
        result = call_with_bad_path(name, function, param, good)
    except ValueError as err:
        assert not isinstance(err, UnicodeError), f"{name}({param}=…): the system's error, not the package's: {err}"
        assert "cannot be encoded" in str(err), f"{name}({param}=…): {type(err).__name__}: {err}"
        return
    except Exception as err:  # noqa: BLE001 — reported as the failure
        pytest.fail(f"{name}({param}={BAD!r}) raised {type(err).__name__}: {err}")
    pytest.fail(f"{name}({param}={BAD!r}) was not refused: {result!r}")


def test_the_one_check_says_what_it_refuses():
    for bad, message in (
        ("", "is empty"),
        ("a\0b", "holds a NUL character"),
        ("x\ud800", r"cannot be encoded as a file name \(surrogates not allowed: '\\ud800' at character 1\)"),
    ):
        with pytest.raises(ValueError, match=message):
            check_path("path", bad)
    with pytest.raises(TypeError, match="must be a path"):
        check_path("path", 3)
    assert str(check_path("path", "\udc80")) == "\udc80"  # a byte that is not UTF-8, as Linux gives it: a real name
    assert check_path("path", torch.__file__).is_file()
