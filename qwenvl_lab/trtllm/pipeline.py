"""Notebook 05 — the whole TensorRT path: export, plan, convert, build, answer one question (`make trtllm`).

    python -m qwenvl_lab.trtllm.pipeline --checkpoint DIR --image PATH --question "图片里是什么？" --workdir DIR

Two stages, because tensorrt_llm 1.2.x pins transformers 4.57 while this package needs 5.x: `--stage prepare`
(the course environment, any machine: ONNX export, checkpoint conversion, the trtllm-build command, saved and
printed) and `--stage gpu` (a TensorRT-LLM environment: vision plan, engine build, answer), which imports nothing
that needs transformers. `--stage all` runs both in one process; without the TensorRT stack it stops at the first
GPU step with an error saying what is missing, the prepare stage's files already written.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

from .. import chat
from ..limits import BuildConfig, dtype_name
from ..tokenizing import IMG_TOKEN_SPAN, load_tokenizer
from .build_command import run_trtllm_build, trtllm_build_command
from .gpu import GPUStackError
from .runner import TRTLLMRunner
from .visual_plan import TRTVisualEncoder, build_visual_plan

ONNX_FILE = Path("onnx") / "visual_encoder.onnx"  # weights past 2 GB go to files beside it
PLAN_FILE = Path("plan") / "visual_encoder_fp16.plan"
CHECKPOINT_DIR, ENGINE_DIR = Path("trtllm_checkpoint"), Path("engine")
COMMAND_FILE = Path("trtllm_build_command.json")
REFERENCE_FILE = Path("reference.json")  # our PyTorch model's answer, for the GPU stage to compare with
STOPPED = 3  # exit status when a GPU step cannot run on this machine


def default_build_config(dtype: str = "float16"):
    """The limits of TensorRT-LLM's Qwen-VL README build: 8 requests, input 2048, total 3072, one image each."""
    return BuildConfig(
        max_batch_size=8,
        max_input_len=2048,
        max_seq_len=3072,
        max_prompt_embedding_table_size=IMG_TOKEN_SPAN * 1 * 8,
        dtype=dtype,
    )


def prepare(checkpoint, workdir, build_config=None, reference=None, log=print) -> list[str]:
    """The CPU steps: vision tower → ONNX, language model → TensorRT-LLM checkpoint, the trtllm-build command.

    reference=(image, question, max_new_tokens) also saves our PyTorch model's greedy answer for the GPU stage.
    """
    # the model code needs transformers 5, absent from the TensorRT-LLM environment that runs the GPU stage
    from ..unified_checkpoint import convert_to_trtllm_checkpoint
    from .onnx_export import export_visual_onnx

    workdir = Path(workdir)
    build_config = default_build_config() if build_config is None else build_config
    onnx_path = export_visual_onnx(checkpoint, workdir / ONNX_FILE)
    log(f"[export, CPU] vision tower → {onnx_path}")
    trt_checkpoint = convert_to_trtllm_checkpoint(checkpoint, workdir / CHECKPOINT_DIR, dtype_name(build_config.dtype))
    log(f"[convert, CPU] language model → {trt_checkpoint} (config.json + rank0.safetensors, no vision weights)")
    command = trtllm_build_command(trt_checkpoint, workdir / ENGINE_DIR, build_config)
    (workdir / COMMAND_FILE).write_text(json.dumps(command) + "\n")
    log(f"[build command] saved to {workdir / COMMAND_FILE}:\n{shlex.join(command)}")
    if reference is not None:
        image, question, max_new_tokens = reference
        answer = pytorch_answer(checkpoint, image, question, max_new_tokens)
        record = dict(image=str(image), question=question, max_new_tokens=max_new_tokens, answer=answer)
        (workdir / REFERENCE_FILE).write_text(json.dumps(record, ensure_ascii=False))
        log(f"[reference, CPU] our PyTorch model answers: {answer}")
    return command


def pytorch_answer(checkpoint, image, question: str, max_new_tokens: int) -> str:
    """Greedy answer of our PyTorch model, the original Qwen-VL way (it reads the picture itself)."""
    from ..checkpoint import load_checkpoint  # transformers 5: the course environment only

    tokenizer, model = load_tokenizer(checkpoint), load_checkpoint(checkpoint)
    return chat.ask(chat.ModelAsRunner(model), None, tokenizer, [str(image)], question, max_new_tokens=max_new_tokens)[
        0
    ]


def answer_question(runner, visual_encoder, tokenizer, image, question: str, max_new_tokens: int = 64) -> str:
    """One picture and a question through a vision engine and a runner, decoded (None on ranks other than 0)."""
    return chat.ask(runner, visual_encoder, tokenizer, [image], question, max_new_tokens=max_new_tokens)[0]


def run_gpu_steps(checkpoint, image, question: str, workdir, max_new_tokens: int = 64, log=print) -> str:
    """The GPU steps: vision plan, engine build (the saved command), answer; needs tensorrt, tensorrt_llm, a GPU."""
    workdir = Path(workdir)
    if not (workdir / COMMAND_FILE).is_file():
        raise FileNotFoundError(f"{workdir / COMMAND_FILE} not found: run the prepare stage first (--stage prepare)")
    tokenizer = load_tokenizer(checkpoint)
    plan = build_visual_plan(workdir / ONNX_FILE, workdir / PLAN_FILE)
    log(f"[plan, GPU] vision tower → {plan}")
    engine_dir = run_trtllm_build(json.loads((workdir / COMMAND_FILE).read_text()))
    log(f"[build, GPU] engine → {engine_dir}")
    answer = answer_question(
        TRTLLMRunner.from_dir(engine_dir), TRTVisualEncoder(plan), tokenizer, image, question, max_new_tokens
    )
    log(f"[answer, GPU]\nQ: {question}\nA: {answer}")
    if (workdir / REFERENCE_FILE).is_file():
        ref = json.loads((workdir / REFERENCE_FILE).read_text())
        if (ref["image"], ref["question"], ref["max_new_tokens"]) == (str(image), question, max_new_tokens):
            log(f"PyTorch's answer: {ref['answer']}\nsame answer: {'yes' if ref['answer'] == answer else 'NO'}")
    return answer


def main(argv=None) -> int:
    """The command line; exit status 3 when it stops at a GPU step on a machine without the TensorRT stack."""
    parser = argparse.ArgumentParser(prog="python -m qwenvl_lab.trtllm.pipeline", description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a Qwen-VL checkpoint directory (the course's)")
    parser.add_argument("--image", required=True, help="a picture file")
    parser.add_argument("--question", default="图片里是什么？")
    parser.add_argument("--workdir", required=True, help="where the ONNX file, checkpoint, command, plan and engine go")
    parser.add_argument("--stage", choices=("all", "prepare", "gpu"), default="all")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--reference",
        action="store_true",
        help="prepare stage: also save our PyTorch model's answer (slow on CPU for the full model)",
    )
    args = parser.parse_args(argv)
    if not Path(args.image).is_file():
        parser.error(f"image not found: {args.image!r}")
    if not Path(args.checkpoint).is_dir():
        parser.error(f"checkpoint directory not found: {args.checkpoint!r} (a Qwen-VL checkpoint: data/toy-qwen-vl?)")
    load_tokenizer(args.checkpoint)  # an unusable vocabulary fails here, before minutes of export
    try:
        if args.stage in ("all", "prepare"):
            reference = (args.image, args.question, args.max_new_tokens) if args.reference else None
            prepare(args.checkpoint, args.workdir, reference=reference)
        if args.stage in ("all", "gpu"):
            run_gpu_steps(args.checkpoint, args.image, args.question, args.workdir, args.max_new_tokens)
    except GPUStackError as err:
        print(f"stopped: {err}", file=sys.stderr)
        return STOPPED
    return 0


if __name__ == "__main__":
    sys.exit(main())
