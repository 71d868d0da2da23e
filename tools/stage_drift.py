"""Normal drift, stage by stage: the package's engine in float16 against its eager model in float32, one answer each
recorded as a per-stage dump and compared (`qwenvl-lab diff`'s table), written as JSON (docs/diff.md).

    python tools/stage_drift.py --model qwen-vl-chat --device cuda --out DIR   # Qwen-VL-Chat's shapes, random weights
    python tools/stage_drift.py --model toy --device cpu --out DIR             # the shipped toy model on a CPU

The eager model runs float32 as float32 (TF32 off for matrix products and convolutions); each engine of `--engines`
(DTYPE/BACKEND) is built from it in memory (`ModelRunner.from_model`), its vision tower cast to the engine's dtype,
and compared with it; the JSON is rewritten after every engine, so a run cut short keeps what it measured.
`--vision-layers` and `--lm-layers` shorten Qwen-VL-Chat's depth (its widths kept) for a trial that fits a CPU.
"""

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from qwenvl_lab import files
from qwenvl_lab.answer_stages import record_answer, runner_probe
from qwenvl_lab.chat import ModelAsRunner
from qwenvl_lab.checkpoint import vision_tower_from
from qwenvl_lab.dump import DumpRecorder, read_dump, versions
from qwenvl_lab.engine import BuildConfig, ModelRunner
from qwenvl_lab.engine.decode import BACKENDS
from qwenvl_lab.modeling import QWEN_VL_CHAT_VISUAL, QWenLMHeadModel, QWenVLConfig
from qwenvl_lab.resources import data_dir
from qwenvl_lab.stage_dumps import model_probe
from qwenvl_lab.stagediff import TOLERANCE_RULE, UNIT_ROUNDOFF, compare, report
from qwenvl_lab.tokenizing import IMG_TOKEN_SPAN, load_tokenizer
from qwenvl_lab.toy import TOY_DIR, load_course_model

PICTURE = data_dir() / "images" / "red_circle_blue_square.png"


def parse(argv=None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("toy", "qwen-vl-chat"), default="toy")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--engines",
        default="float16/torch",
        help="the engines compared with the eager model, comma-separated DTYPE/BACKEND (float32, float16, bfloat16; "
        "torch, numba, triton); default %(default)s",
    )
    parser.add_argument("--vision-layers", type=int, help="qwen-vl-chat: the tower's layers (default 48)")
    parser.add_argument("--lm-layers", type=int, help="qwen-vl-chat: the language model's layers (default 32)")
    parser.add_argument("--picture", type=Path, default=PICTURE)
    parser.add_argument("--question", default="图片里是什么？")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed (qwen-vl-chat)")
    parser.add_argument("--out", type=Path, required=True, help="the folder the JSON goes to")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier run's JSON in --out")
    args = parser.parse_args(argv)
    if args.model == "toy" and (args.vision_layers or args.lm_layers):
        parser.error("--vision-layers and --lm-layers shorten Qwen-VL-Chat's depth: use them with --model qwen-vl-chat")
    args.engines = [tuple(spec.split("/")) for spec in args.engines.split(",")]
    for spec in args.engines:
        if len(spec) != 2 or spec[0] not in ("float32", "float16", "bfloat16") or spec[1] not in BACKENDS:
            parser.error(f"--engines: {'/'.join(spec)!r} is not DTYPE/BACKEND, e.g. float16/torch")
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
    """Record the eager model and the engine in each dtype and back end, compare each with the eager model, write
    `stage_drift-<model>.json` in --out."""
    args = parse(argv)
    args.argv = sys.argv[1:] if argv is None else [str(a) for a in argv]  # the command, as JSON records it
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
    runs = []
    with tempfile.TemporaryDirectory(prefix="stage-drift-") as work:
        folder = Path(work)

        def record(name: str, runner, vision, probe, dtype) -> Path:
            """One answer through `runner` and `vision`, every stage (every layer too) recorded: the dump's path."""
            recorder = DumpRecorder(name, dtype, args.device, notes=dict(notes))
            record_answer(
                recorder, runner, vision, tokenizer, [args.picture], args.question, probe, args.max_new_tokens
            )
            return recorder.save(folder / f"{name.replace(' ', '-')}.safetensors")

        eager = read_dump(
            record("eager float32", ModelAsRunner(model), model.transformer.visual, model_probe(model), "float32")
        )
        prompt_len = len(eager.tensors["prompt_ids"])
        prefix = "transformer.visual."
        state = {k[len(prefix) :]: v for k, v in model.state_dict().items() if k.startswith(prefix)}
        towers = {}
        for dtype, backend in args.engines:
            build = BuildConfig(
                max_batch_size=1,
                max_input_len=prompt_len,
                max_seq_len=prompt_len + args.max_new_tokens,
                max_prompt_embedding_table_size=IMG_TOKEN_SPAN,  # one picture
                dtype=dtype,
            )
            if dtype not in towers:  # the engine's vision part, in its dtype (float32: the eager tower's own weights)
                towers = {dtype: vision_tower_from(config.visual, state, dtype).to(device)}
            start = time.perf_counter()
            try:
                runner = ModelRunner.from_model(model, build, device, backend=backend)
                engine = read_dump(
                    record(f"engine {dtype} {backend}", runner, towers[dtype], runner_probe(runner), dtype)
                )
            except (RuntimeError, ValueError) as err:  # e.g. out of GPU memory: the other runs still count
                runs.append({"engine_dtype": dtype, "backend": backend, "error": " ".join(str(err).split())[:500]})
                print(f"engine {dtype} {backend}: {runs[-1]['error']}", flush=True)
                runner = engine = None
            seconds = time.perf_counter() - start
            del runner
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if engine is None:
                write(args, results_of(args, device, notes, built, runs), overwrite=bool(runs) or args.overwrite)
                continue
            comparison = compare(eager, engine)
            print(report(comparison), flush=True)
            runs.append(
                {
                    "engine_dtype": dtype,
                    "backend": backend,
                    "a": eager.describe(),
                    "b": engine.describe(),
                    "stages": stage_table(comparison),
                    "first_diverging_stage": None if comparison.first is None else comparison.first.name,
                    "diagnosis": comparison.diagnosis,
                    "same_answer": {r.name: r.status for r in comparison.results}.get("output_ids") == "same",
                    "output_ids": {
                        "a": eager.tensors["output_ids"].tolist(),
                        "b": engine.tensors["output_ids"].tolist(),
                    },
                    "seconds": round(seconds, 1),
                }
            )
            write(
                args, results_of(args, device, notes, built, runs), overwrite=len(runs) > 1 or args.overwrite
            )  # a cut-off run keeps the rest
    return 0


def results_of(args, device, notes: dict, built: float, runs: list) -> dict:
    """The JSON written: the hardware, the command, the model, the versions, and each engine's comparison."""
    return {
        "hardware": hardware(device),
        "command": "python tools/stage_drift.py " + shlex.join(args.argv),
        "model": args.model,
        "sizes": notes,
        "versions": versions(),
        "tf32": False,
        "seconds_to_build_the_model": round(built, 1),
        "tolerance_rule": TOLERANCE_RULE,
        "runs": runs,
    }


DRIFT_WRITER = files.writer("stage drift --json", "the per-stage drift measurement's results")


def write(args, results: dict, overwrite: bool = False) -> Path:
    """results as `stage_drift-<model>.json` in --out, written the package's one way: a new file, or with overwrite
    (--overwrite, or this run's own file written after an earlier engine) replacing one."""
    target = args.out / f"stage_drift-{args.model}.json"
    text = json.dumps(results, indent=1, ensure_ascii=False, default=str) + "\n"
    files.write_text(target, text, DRIFT_WRITER, overwrite=overwrite, parents=True)
    print(f"written to {target}", flush=True)
    return target


if __name__ == "__main__":
    sys.exit(main())
