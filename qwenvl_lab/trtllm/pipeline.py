"""Notebook 05 — the whole TensorRT path: export, plan, convert, build, answer one question (`make trtllm`).

    python -m qwenvl_lab.trtllm.pipeline --checkpoint DIR --image PATH --question "图片里是什么？" --workdir DIR

Two stages, because tensorrt_llm 1.2.x pins transformers 4.57 while this package needs 5.x: `--stage prepare`
(the course environment, any machine: ONNX export, checkpoint conversion, the trtllm-build command, saved and
printed) and `--stage gpu` (a TensorRT-LLM environment: vision plan, engine build, answer), which imports nothing
that needs transformers. `--stage all` runs both in one process; without the TensorRT stack it stops at the first
GPU step with an error saying what is missing, the prepare stage's files already written.

Tensor parallelism: `--stage prepare --tp-size N` converts a checkpoint split for N GPUs; then
`mpirun -n N python -m qwenvl_lab.trtllm.pipeline --stage gpu --tp-size N …` runs the GPU stage once per rank.
Rank 0 builds the plan and the engine while the other ranks wait, every rank loads its own rank engine, and only
rank 0 runs the vision plan and gets the answer, as in TensorRT-LLM, whose executor hands rank 0's requests to the
other ranks itself.
"""

import json
import shlex
import subprocess
import sys
from pathlib import Path

from .. import chat, files, options
from ..answer_stages import record_answer
from ..checks.tensors import dtype_name, to_torch_dtype
from ..checks.values import check_path
from ..dump import DumpRecorder, check_dump_target, versions
from ..files import field, read_json
from ..limits import BuildConfig
from ..options import Parser
from ..tokenizing import IMG_TOKEN_SPAN, load_tokenizer
from .build_command import run_trtllm_build, trtllm_build_command
from .gpu import GPUStackError
from .mpi_world import BuildFailedError, WorldSizeError, build_once, check_world, launcher_world_size, mpi_world
from .runner import TRTLLMRunner
from .visual_plan import TRTVisualEncoder, build_visual_plan

ONNX_FILE = Path("onnx") / "visual_encoder.onnx"  # weights past 2 GB go to files beside it
ONNX_FP16_FILE = Path("onnx_fp16") / "visual_encoder_fp16.onnx"  # the graph a strongly typed plan follows
PLAN_FILE = Path("plan") / "visual_encoder_fp16.plan"
CHECKPOINT_DIR, ENGINE_DIR = Path("trtllm_checkpoint"), Path("engine")
COMMAND_FILE = Path("trtllm_build_command.json")
REFERENCE_FILE = Path("reference.json")  # our PyTorch model's answer, for the GPU stage to compare with
WRITER = files.writer("trtllm prepare", "the prepare stage's build command or reference answer")
PLAN_FOLDER_WRITER = files.writer("trtllm plan folder", "the GPU stage's folder of the vision plan")
STOPPED = 3  # exit status when a GPU step cannot run on this machine
WRONG_WORLD = 2  # exit status when the MPI world does not fit the checkpoint (or the prepare stage runs under MPI)


def default_build_config(dtype: str = "float16"):
    """The limits of TensorRT-LLM's Qwen-VL README build: 8 requests, input 2048, total 3072, one image each."""
    return BuildConfig(
        max_batch_size=8,
        max_input_len=2048,
        max_seq_len=3072,
        max_prompt_embedding_table_size=IMG_TOKEN_SPAN * 1 * 8,
        dtype=dtype,
    )


def prepare(  # noqa: PLR0913 — the prepare stage's options, one argument each
    checkpoint,
    workdir,
    build_config=None,
    reference=None,
    tp_size: int = 1,
    strongly_typed: bool = False,
    log=print,
    overwrite: bool = False,
) -> list[str]:
    """The CPU steps: vision tower → ONNX, language model → TensorRT-LLM checkpoint, the trtllm-build command.

    tp_size splits the checkpoint for that many GPUs (rank{N}.safetensors each); strongly_typed also writes the
    float16 ONNX graph that a strongly typed vision plan follows. reference=(image, question, max_new_tokens) also
    saves our PyTorch model's greedy answer for the GPU stage. Every output is checked before the first step (its
    place, its folder's rights and room); outputs of an earlier run are replaced only with overwrite=True.
    """
    # the model code needs transformers 5, absent from the TensorRT-LLM environment that runs the GPU stage
    from ..checkpoint import load_config  # noqa: PLC0415 — the course environment only
    from ..engine.build import engine_bytes  # noqa: PLC0415 — the course environment only
    from ..unified_checkpoint import (  # noqa: PLC0415 — the course environment only
        CHECKPOINT_WRITER,
        check_trtllm_destination,
        convert_to_trtllm_checkpoint,
    )
    from .fp16 import to_float16_onnx  # noqa: PLC0415 — onnx: the course environment
    from .onnx_export import ONNX_WRITER, export_visual_onnx, ours  # noqa: PLC0415 — the model: the course environment

    workdir = check_path("workdir", workdir)
    build_config = default_build_config() if build_config is None else build_config
    dtype = dtype_name(build_config.dtype)
    weights = engine_bytes(load_config(checkpoint), to_torch_dtype(dtype))  # an upper bound for each output
    outputs = [  # (path, writer, a folder?, recognises what this package wrote there)
        (ONNX_FILE, ONNX_WRITER, False, ours),
        (CHECKPOINT_DIR, CHECKPOINT_WRITER, True, None),  # a folder this package made is replaced, no other
        (COMMAND_FILE, WRITER, False, _is_command_file),
    ]
    outputs += [(ONNX_FP16_FILE, ONNX_WRITER, False, ours)] if strongly_typed else []
    outputs += [(REFERENCE_FILE, WRITER, False, _is_reference_file)] if reference is not None else []
    for path, writer, folder, made in outputs:  # refused now, not after minutes of export
        if folder:
            check_trtllm_destination(workdir / path, overwrite=True, need_bytes=weights)
        else:
            files.check_destination(
                workdir / path, writer, folder=False, overwrite=overwrite, need_bytes=weights, parents=True, made=made
            )
    onnx_path = export_visual_onnx(checkpoint, workdir / ONNX_FILE, overwrite=overwrite)
    log(f"[export, CPU] vision tower → {onnx_path}")
    if strongly_typed:
        fp16_path = to_float16_onnx(onnx_path, workdir / ONNX_FP16_FILE, overwrite=overwrite)
        log(f"[export, CPU] float16 graph for a strongly typed plan → {fp16_path}")
    trt_checkpoint = convert_to_trtllm_checkpoint(checkpoint, workdir / CHECKPOINT_DIR, dtype, tp_size, overwrite=True)
    ranks = " + ".join(f"rank{r}.safetensors" for r in range(tp_size))
    log(f"[convert, CPU] language model → {trt_checkpoint} (config.json + {ranks}, no vision weights)")
    command = trtllm_build_command(trt_checkpoint, workdir / ENGINE_DIR, build_config)
    files.write_text(
        workdir / COMMAND_FILE, json.dumps(command) + "\n", WRITER, overwrite=overwrite, made=_is_command_file
    )
    log(f"[build command] saved to {workdir / COMMAND_FILE}:\n{shlex.join(command)}")
    if reference is not None:
        image, question, max_new_tokens = reference
        answer = pytorch_answer(checkpoint, image, question, max_new_tokens)
        record = dict(image=str(image), question=question, max_new_tokens=max_new_tokens, answer=answer)
        text = json.dumps(record, ensure_ascii=False)
        files.write_text(workdir / REFERENCE_FILE, text, WRITER, overwrite=overwrite, made=_is_reference_file)
        log(f"[reference, CPU] our PyTorch model answers: {answer}")
    return command


def _json_of(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _is_command_file(path) -> bool:
    """True for a build command the prepare stage saved (a JSON list: trtllm-build and its arguments)."""
    command = _json_of(path)
    return isinstance(command, list) and command[:1] == ["trtllm-build"]


def _is_reference_file(path) -> bool:
    """True for a reference answer the prepare stage saved."""
    record = _json_of(path)
    return isinstance(record, dict) and set(record) == {"image", "question", "max_new_tokens", "answer"}


def pytorch_answer(checkpoint, image, question: str, max_new_tokens: int) -> str:
    """Greedy answer of our PyTorch model, the original Qwen-VL way (it reads the picture itself)."""
    from ..checkpoint import load_checkpoint  # noqa: PLC0415 — transformers 5: the course environment only

    tokenizer, model = load_tokenizer(checkpoint), load_checkpoint(checkpoint)
    return chat.ask(chat.ModelAsRunner(model), None, tokenizer, [str(image)], question, max_new_tokens=max_new_tokens)[
        0
    ]


def answer_question(runner, visual_encoder, tokenizer, image, question: str, max_new_tokens: int = 64) -> str:
    """One picture and a question through a vision engine and a runner, decoded (None on ranks other than 0)."""
    return chat.ask(runner, visual_encoder, tokenizer, [image], question, max_new_tokens=max_new_tokens)[0]


def dumped_answer(runner, plan, tokenizer, image, question: str, max_new_tokens: int, dump) -> str:
    """answer_question's answer, every stage the TensorRT path exposes recorded in the dump `dump` (written at the
    end): pixels, input_vit from the vision plan, prompt ids, img_pos, fake ids, the table and the generated ids.
    ModelRunnerCpp returns no embeddings, layers or logits (they would need gather flags at build time)."""
    trt_version = versions().get("tensorrt_llm", "unknown")
    recorder = DumpRecorder(
        f"TensorRT-LLM {trt_version} ModelRunnerCpp, vision plan {Path(plan).name}",
        runner.dtype,
        "cuda",
        runner.vocab_size,
        notes={"question": question, "pictures": Path(image).name, "vision": f"TensorRT plan {Path(plan).name}"},
    )
    new = record_answer(recorder, runner, TRTVisualEncoder(plan), tokenizer, [image], question, None, max_new_tokens)
    recorder.save(dump, overwrite=True)  # its target was checked before the build (check_dump_target)
    return chat.answer_text(tokenizer, new)


def checkpoint_mapping(workdir) -> tuple[int, int]:
    """(tp_size, pp_size) of the TensorRT-LLM checkpoint the prepare stage wrote in `workdir`."""
    config_file = Path(workdir) / CHECKPOINT_DIR / "config.json"
    fix = "run the prepare stage first (--stage prepare)"
    mapping = field(read_json(config_file, fix), "mapping", "dict", config_file, fix)
    return field(mapping, "tp_size", "int", config_file, fix), mapping.get("pp_size", 1)


def _plans(folder: Path) -> dict | None:
    """The plans a GPU stage wrote in `folder`: its mark's list, or (written before marks) its .plan files when that
    is all it holds."""
    listed = files.made_files(folder)
    if listed is not None:
        return listed
    names = {p.name for p in folder.iterdir()} - files.DISPOSABLE
    return {name: [] for name in names} if names and all(n.endswith(".plan") for n in names) else None


def _plan_folder(folder: Path, overwrite: bool) -> None:
    """Refuse a plan folder holding anything but plans of this package."""
    if _plans(folder) is None:
        raise FileExistsError(f"{folder} holds files the GPU stage did not write: move them, or give another --workdir")


def write_plan(onnx_path, workdir: Path, strongly_typed: bool = False) -> Path:
    """The vision plan of `onnx_path` in workdir/plan/: the folder written whole, replacing one an earlier GPU stage
    made (and nothing else)."""
    with files.writing_folder(
        workdir / PLAN_FILE.parent, PLAN_FOLDER_WRITER, overwrite=True, allow=_plan_folder, made=_plans
    ) as staging:
        build_visual_plan(onnx_path, staging / PLAN_FILE.name, strongly_typed=strongly_typed)
    return workdir / PLAN_FILE


def run_gpu_steps(  # noqa: PLR0913 — the pipeline command line's options, one argument each
    checkpoint,
    image,
    question: str,
    workdir,
    max_new_tokens: int = 64,
    tp_size=None,
    strongly_typed: bool = False,
    world=None,
    log=print,
    dump=None,
) -> str | None:
    """The GPU steps: vision plan, engine build (the saved command), answer; needs tensorrt, tensorrt_llm, a GPU.

    Under MPI, rank 0 builds while the other ranks wait; every rank loads its rank engine; rank 0 returns the
    answer and the other ranks None (TensorRT-LLM gives outputs on rank 0 only). `dump`: a file where rank 0 records
    the answer's stages (`dumped_answer`), for `qwenvl-lab diff`.
    """
    workdir = Path(workdir)
    if not (workdir / COMMAND_FILE).is_file():
        raise FileNotFoundError(f"{workdir / COMMAND_FILE} not found: run the prepare stage first (--stage prepare)")
    onnx_path = workdir / (ONNX_FP16_FILE if strongly_typed else ONNX_FILE)
    if strongly_typed and not onnx_path.is_file():
        raise FileNotFoundError(f"{onnx_path} not found: run the prepare stage with --strongly-typed first")
    ckpt_tp, ckpt_pp = checkpoint_mapping(workdir)
    if tp_size is not None and tp_size != ckpt_tp:
        raise WorldSizeError(
            f"--tp-size {tp_size}, but the checkpoint in {workdir / CHECKPOINT_DIR} was converted for tp_size "
            f"{ckpt_tp}: run the prepare stage again with --tp-size {tp_size}"
        )
    world = mpi_world() if world is None else world
    check_world(world, ckpt_tp, ckpt_pp, what=f"the checkpoint in {workdir / CHECKPOINT_DIR}")
    tokenizer = load_tokenizer(checkpoint)

    def build() -> tuple[str, str]:
        plan = write_plan(onnx_path, workdir, strongly_typed)
        log(f"[plan, GPU] vision tower → {plan}{' (strongly typed)' if strongly_typed else ''}")
        engine_dir = run_trtllm_build(json.loads((workdir / COMMAND_FILE).read_text()))
        log(f"[build, GPU] engine → {engine_dir}")
        return str(plan), str(engine_dir)

    plan, engine_dir = build_once(world, build, log)
    runner = TRTLLMRunner.from_dir(engine_dir, rank=world.rank)
    if world.rank != 0:  # TensorRT-LLM's executor hands this rank rank 0's requests, prompt tables included
        log(f"[rank {world.rank}] rank{world.rank}.engine loaded; the answer comes out on rank 0")
        return None
    if dump is None:
        answer = answer_question(runner, TRTVisualEncoder(plan), tokenizer, image, question, max_new_tokens)
    else:
        answer = dumped_answer(runner, plan, tokenizer, image, question, max_new_tokens, dump)
        log(f"[dump] every stage of the answer → {dump}")
    log(f"[answer, GPU]\nQ: {question}\nA: {answer}")
    if (workdir / REFERENCE_FILE).is_file():
        ref = json.loads((workdir / REFERENCE_FILE).read_text())
        if (ref["image"], ref["question"], ref["max_new_tokens"]) == (str(image), question, max_new_tokens):
            log(f"PyTorch's answer: {ref['answer']}\nsame answer: {'yes' if ref['answer'] == answer else 'NO'}")
    return answer


def parser() -> Parser:
    """`qwenvl-lab trtllm`'s options."""

    def check(parser, args):
        if args.dump is not None:
            if args.stage == "prepare":
                parser.error("--dump records the GPU stage's answer: use it with --stage gpu or all")
            try:
                check_dump_target(args.dump, args.overwrite_dump)
            except (OSError, ValueError) as err:
                parser.error(f"--dump {' '.join(str(err).split())}")

    parser = Parser(prog="qwenvl-lab trtllm", description=__doc__.split("\n")[0], check=check)
    parser.add_argument(
        "--checkpoint",
        type=options.folder_with("config.json", "a Qwen-VL checkpoint directory (data/toy-qwen-vl?)"),
        required=True,
        help="a Qwen-VL checkpoint directory (the course's)",
    )
    parser.add_argument("--image", type=options.picture, required=True, help="a picture file")
    parser.add_argument("--question", type=options.text, default="图片里是什么？")
    parser.add_argument(
        "--workdir",
        type=options.output_folder,
        required=True,
        help="where the ONNX file, checkpoint, command, plan and engine go",
    )
    parser.add_argument("--stage", choices=("all", "prepare", "gpu"), default="all")
    parser.add_argument("--max-new-tokens", type=options.whole(1), default=64)
    parser.add_argument(
        "--tp-size",
        type=options.whole(1, 64),
        default=None,
        help="tensor parallelism: prepare splits the checkpoint for this many GPUs (default 1); the GPU stage, run "
        "under mpirun -n TP_SIZE, checks it against the prepared checkpoint",
    )
    parser.add_argument(
        "--strongly-typed",
        action="store_true",
        help="vision plan: a float16 ONNX graph (LayerNorm kept in float32) built strongly typed, instead of a "
        "float32 graph built with TensorRT's FP16 flag (docs/tensorrt.md)",
    )
    parser.add_argument(
        "--dump",
        type=options.output_file,
        help="GPU stage: record the answer's stages in this per-stage dump (qwenvl-lab diff compares it)",
    )
    parser.add_argument("--overwrite-dump", action="store_true", help="replace a dump written earlier at --dump")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="prepare stage: also save our PyTorch model's answer (slow on CPU for the full model)",
    )
    return parser


def main(argv=None) -> int:
    """The command line; exit status 3 when it stops at a GPU step on a machine without the TensorRT stack."""
    args = parser().parse_args(argv)
    if args.stage != "gpu" and launcher_world_size() > 1:
        print(
            f"error: --stage {args.stage} runs once, in one process: run --stage prepare without mpirun, then the "
            "GPU stage under mpirun (--stage gpu)",
            file=sys.stderr,
        )
        return WRONG_WORLD
    load_tokenizer(args.checkpoint)  # an unusable vocabulary fails here, before minutes of export
    try:
        if args.stage in ("all", "prepare"):
            reference = (args.image, args.question, args.max_new_tokens) if args.reference else None
            prepare(
                args.checkpoint,
                args.workdir,
                reference=reference,
                tp_size=args.tp_size or 1,
                strongly_typed=args.strongly_typed,
            )
        if args.stage in ("all", "gpu"):
            run_gpu_steps(
                args.checkpoint,
                args.image,
                args.question,
                args.workdir,
                args.max_new_tokens,
                tp_size=args.tp_size,
                strongly_typed=args.strongly_typed,
                dump=args.dump,
            )
    except GPUStackError as err:
        print(f"stopped: {err}", file=sys.stderr)
        return STOPPED
    except WorldSizeError as err:
        print(f"error: {err}", file=sys.stderr)
        return WRONG_WORLD
    except BuildFailedError as err:
        print(f"stopped: {err}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as err:
        print(
            f"stopped: trtllm-build failed (exit status {err.returncode}); its output above says why", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
