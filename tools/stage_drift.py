"""Normal drift, stage by stage: the package's engine in float16 against its eager model in float32, one answer each
recorded as a per-stage dump and compared (`qwenvl-lab diff`'s table), written as JSON (docs/diff.md).

    python tools/stage_drift.py --model qwen-vl-chat --device cuda --out DIR   # Qwen-VL-Chat's shapes, random weights
    python tools/stage_drift.py --model toy --device cpu --out DIR             # the shipped toy model on a CPU

The eager model runs float32 as float32 (TF32 off for matrix products and convolutions); the engine is built from it
in memory (`ModelRunner.from_model`) with every decode back end asked for, its vision tower cast to the engine's
dtype. `--vision-layers` and `--lm-layers` shorten Qwen-VL-Chat's depth (its widths kept) for a trial that fits a CPU.
"""

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from qwenvl_lab.answer_stages import record_answer, runner_probe
from qwenvl_lab.chat import ModelAsRunner
from qwenvl_lab.checkpoint import vision_tower_from
from qwenvl_lab.dump import DumpRecorder, read_dump, versions
from qwenvl_lab.engine import BuildConfig, ModelRunner
from qwenvl_lab.files import put_file
from qwenvl_lab.modeling import QWEN_VL_CHAT_VISUAL, QWenLMHeadModel, QWenVLConfig
from qwenvl_lab.resources import data_dir
from qwenvl_lab.stage_dumps import model_probe
from qwenvl_lab.stagediff import UNIT_ROUNDOFF, compare, report
from qwenvl_lab.tokenizing import IMG_TOKEN_SPAN, load_tokenizer
from qwenvl_lab.toy import TOY_DIR, load_course_model

PICTURE = data_dir() / "images" / "red_circle_blue_square.png"


def parse(argv=None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("toy", "qwen-vl-chat"), default="toy")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16", help="the engine's")
    parser.add_argument(
        "--backends", default="torch", help="decode back ends, comma-separated (torch, numba, triton); the first is B"
    )
    parser.add_argument("--vision-layers", type=int, help="qwen-vl-chat: the tower's layers (default 48)")
    parser.add_argument("--lm-layers", type=int, help="qwen-vl-chat: the language model's layers (default 32)")
    parser.add_argument("--picture", type=Path, default=PICTURE)
    parser.add_argument("--question", default="图片里是什么？")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed (qwen-vl-chat)")
    parser.add_argument("--out", type=Path, required=True, help="the folder the JSON goes to")
    args = parser.parse_args(argv)
    if args.model == "toy" and (args.vision_layers or args.lm_layers):
        parser.error("--vision-layers and --lm-layers shorten Qwen-VL-Chat's depth: use them with --model qwen-vl-chat")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    return args


def random_qwen_vl_chat(args, device) -> QWenLMHeadModel:
    """Qwen-VL-Chat's shapes (or its widths at the depths asked for) with random weights, made on the device."""
    torch.manual_seed(args.seed)
    visual = dict(QWEN_VL_CHAT_VISUAL, layers=args.vision_layers or QWEN_VL_CHAT_VISUAL["layers"])
    config = QWenVLConfig(visual=visual, num_hidden_layers=args.lm_layers or 32)
    with torch.device(device):
        model = QWenLMHeadModel(config)
    return model.eval().requires_grad_(False)


def hardware(device: torch.device) -> str:
    """The card's name (torch.cuda.get_device_name), or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def stage_table(comparison) -> list[dict]:
    """Each stage's errors, with its relative error in units of its dtype's roundoff and as a share of its tolerance."""
    rows = []
    for r in comparison.results:
        row = {k: getattr(r, k) for k in ("name", "status", "max_abs", "mean_abs", "rel", "cosine", "tolerance")}
        row["dtype"] = r.dtype
        row["rel_over_u"] = None if r.rel is None or r.dtype is None else r.rel / UNIT_ROUNDOFF[r.dtype]
        row["rel_over_tolerance"] = None if not r.tolerance or r.rel is None else r.rel / r.tolerance
        rows.append(row)
    return rows


def main(argv=None) -> int:
    """Record the eager model and the engine, compare, write `stage_drift-<model>.json` in --out."""
    args = parse(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 is float32: no TF32 in the reference
    torch.backends.cudnn.allow_tf32 = False
    started = time.perf_counter()
    if args.model == "toy":
        model = load_course_model(TOY_DIR, dtype=torch.float32, device=device).requires_grad_(False)
        tokenizer = load_tokenizer(TOY_DIR)
    else:
        model, tokenizer = random_qwen_vl_chat(args, device), load_tokenizer()
    config = model.config
    notes = {
        "vision_layers": str(config.visual["layers"]),
        "lm_layers": str(config.num_hidden_layers),
        "hidden_size": str(config.hidden_size),
        "pictures": args.picture.name,
        "question": args.question,
    }
    built = time.perf_counter() - started
    results = {}
    with tempfile.TemporaryDirectory(prefix="stage-drift-") as work:
        folder = Path(work)

        def record(name: str, runner, vision, probe, dtype) -> Path:
            """One answer through `runner` and `vision`, every stage (every layer too) recorded: the dump's path."""
            recorder = DumpRecorder(name, dtype, args.device, notes=dict(notes))
            start = time.perf_counter()
            record_answer(
                recorder, runner, vision, tokenizer, [args.picture], args.question, probe, args.max_new_tokens
            )
            recorder.notes["seconds"] = f"{time.perf_counter() - start:.1f}"
            return recorder.save(folder / f"{name.replace(' ', '-')}.safetensors")

        eager = record("eager float32", ModelAsRunner(model), model.transformer.visual, model_probe(model), "float32")
        prompt_len = len(read_dump(eager).tensors["prompt_ids"])
        build = BuildConfig(
            max_batch_size=1,
            max_input_len=prompt_len,
            max_seq_len=prompt_len + args.max_new_tokens,
            max_prompt_embedding_table_size=IMG_TOKEN_SPAN,  # one picture
            dtype=args.dtype,
        )
        prefix = "transformer.visual."
        state = {k[len(prefix) :]: v for k, v in model.state_dict().items() if k.startswith(prefix)}
        tower = vision_tower_from(config.visual, state, args.dtype).to(device)  # the engine's vision part
        dumps = {}
        for backend in args.backends.split(","):
            runner = ModelRunner.from_model(model, build, device, backend=backend)
            name = f"engine {args.dtype} {backend}"
            dumps[backend] = record(name, runner, tower, runner_probe(runner), args.dtype)
            del runner
            if device.type == "cuda":
                torch.cuda.empty_cache()
        first = args.backends.split(",")[0]
        comparison = compare(read_dump(eager), read_dump(dumps[first]))
        print(report(comparison))
        results = {
            "hardware": hardware(device),
            "command": " ".join([sys.executable, *sys.argv]) if argv is None else " ".join(["stage_drift.py", *argv]),
            "model": args.model,
            "sizes": notes,
            "engine_dtype": args.dtype,
            "versions": versions(),
            "tf32": False,
            "seconds_to_build_the_model": round(built, 1),
            "a": comparison.a.describe(),
            "b": comparison.b.describe(),
            "stages": stage_table(comparison),
            "first_diverging_stage": None if comparison.first is None else comparison.first.name,
            "diagnosis": comparison.diagnosis,
            "same_answer": {r.name: r.status for r in comparison.results}.get("output_ids") == "same",
            "tolerance_rule": comparison.to_json()["tolerance_rule"],
            "back_ends": {
                backend: {
                    "first_diverging_stage_against_eager": (lambda c: None if c.first is None else c.first.name)(
                        compare(read_dump(eager), read_dump(path))
                    ),
                    "output_ids": read_dump(path).tensors["output_ids"].tolist(),
                }
                for backend, path in dumps.items()
            },
        }
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"stage_drift-{args.model}.json"
    put_file((json.dumps(results, indent=1, ensure_ascii=False, default=str) + "\n").encode(), target)
    print(f"written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
