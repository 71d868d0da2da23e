"""`python -m qwenvl_lab.toy.evaluate --seed S --n N` — exact-match accuracy on a fresh held-out set.

By default the eager model in float32 answers. `--dtype` (and `--weight-only int8`) builds an engine of that precision
from the checkpoint in a temporary directory and asks it instead (its language model and vision part in that dtype,
the decode back end "torch"), and `--engine DIR` asks an engine built earlier: the same questions, so precisions can be
compared. `--json` also records the greedy answers to every question of the sample pictures (data/images/README.md).
"""

import json
import shlex
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from .. import files, options
from ..chat import ModelAsRunner, ask_batch
from ..checks.values import check_path
from ..engine import BuildConfig, build_engine
from ..infer import QWenInfer
from ..limits import prompt_table_size
from ..options import Parser
from ..resources import images_dir, machine
from ..tokenizing import IMG_TOKEN_SPAN, load_tokenizer
from .course import default_checkpoint_dir, load_toy_model
from .make_samples import sample_questions
from .shapes import LANGS, QUESTION_KINDS, answer_matches, grounding_score, make_dataset, no_picture

EVAL_BATCH = 32  # questions asked in one batch
# the engine `--dtype` builds: a batch of EVAL_BATCH questions of up to two pictures each
EVAL_BUILD = dict(max_batch_size=EVAL_BATCH, max_input_len=640, max_seq_len=704)

JSON_WRITER = files.writer("evaluate --json", "the toy model's held-out accuracies and sample answers")


def ask(model, tokenizer, pictures, questions, zero_table=False, max_new_tokens=32, history=None) -> list[str]:
    """Greedy answers of the eager model (or of an engine: a QWenInfer) for a batch: pictures[b] is a list of
    paths/PIL images for question b (zero_table: every picture's features replaced by zeros, so the model sees no
    picture content)."""
    if isinstance(model, QWenInfer):
        runner, vision, hidden = model.runner, model.vision, model.runner.hidden_size
    else:
        runner, vision, hidden = ModelAsRunner(model), model.transformer.visual, model.config.hidden_size
    input_vit = None
    if zero_table:
        count = sum(len(p) for p in pictures)
        input_vit = torch.zeros(count, IMG_TOKEN_SPAN, hidden)  # [N, 256, H]
    return ask_batch(
        runner,
        vision,
        tokenizer,
        list(zip(pictures, questions)),
        history,
        input_vit=input_vit,
        max_new_tokens=max_new_tokens,
    )


def is_right(answer: str, example) -> bool:
    """A hit: the exact answer, or for "where" a box that overlaps the shape's (IoU >= 0.5) with the right name."""
    if example.kind == "where":
        score = grounding_score(answer, example)
        return score["right_shape"] and score["iou"] >= 0.5
    return answer_matches(answer, example)


def evaluate(model, tokenizer, seed=1, n=500, zero_table=False, batch_size=EVAL_BATCH, examples=None) -> dict:
    """Accuracy per (kind, lang) and overall on `make_dataset(seed, n)` (or the given examples); `model` is the eager
    model or an engine (QWenInfer)."""
    examples = make_dataset(seed, n) if examples is None else examples
    if not examples:
        raise ValueError(f"no questions to evaluate (n={n}): ask for at least one (--n 1 or more)")
    hits = defaultdict(list)
    by_images = defaultdict(list)
    for e in examples:
        by_images[len(e.images)].append(e)
    for group in by_images.values():
        for start in range(0, len(group), batch_size):
            chunk = group[start : start + batch_size]
            answers = ask(model, tokenizer, [e.pictures() for e in chunk], [e.question for e in chunk], zero_table)
            for e, a in zip(chunk, answers):
                hits[(e.kind, e.lang)].append(is_right(a, e))
    result = {f"{k}/{lang}": sum(v) / len(v) for (k, lang), v in sorted(hits.items())}
    result["overall"] = sum(sum(v) for v in hits.values()) / sum(len(v) for v in hits.values())
    return result


def no_picture_accuracy(model, tokenizer, examples, batch_size=EVAL_BATCH) -> dict:
    """Per language ("none/en", "none/zh"), the share of the examples' questions, asked with no picture, that get the
    no-picture answer in their own language."""
    hits = defaultdict(list)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        answers = ask(model, tokenizer, [[] for _ in chunk], [e.question for e in chunk])
        for e, a in zip(chunk, answers):
            hits[e.lang].append(a.strip() == no_picture(e.lang))
    return {f"none/{lang}": sum(v) / len(v) for lang, v in sorted(hits.items())}


def sample_answers(model, tokenizer, batch_size=EVAL_BATCH) -> list[dict]:
    """The greedy answer to every question of the sample pictures (data/images/README.md), with the trained one."""
    rows, folder = sample_questions(), images_dir()
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        for size in sorted({len(names) for names, _, _ in chunk}):  # one picture count a batch
            same = [r for r in chunk if len(r[0]) == size]
            answers = ask(
                model, tokenizer, [[str(folder / n) for n in names] for names, _, _ in same], [q for _, q, _ in same]
            )
            out += [
                {"pictures": names, "question": q, "trained": a, "answer": got}
                for (names, q, a), got in zip(same, answers)
            ]
    return out


def engine_config(dtype: str, weight_only=None) -> BuildConfig:
    """The limits of the engine `--dtype` builds (EVAL_BUILD: a batch of questions of up to two pictures)."""
    config = BuildConfig(**EVAL_BUILD, dtype=dtype, weight_only=weight_only)
    return BuildConfig(
        **EVAL_BUILD, dtype=dtype, weight_only=weight_only, max_prompt_embedding_table_size=prompt_table_size(config, 2)
    )


MOST_QUESTIONS = 1_000_000  # --n: a held-out set of a million questions takes days on a CPU already


def parser() -> Parser:
    """`qwenvl-lab evaluate`'s options."""

    def check(parser, args):
        if args.weight_only is not None and args.dtype is None:
            parser.error("--weight-only needs --dtype: the dtype of the activations beside the int8 weights")
        if args.engine is not None and (args.dtype is not None or args.checkpoint is not None):
            parser.error("--engine names a built engine: leave out --dtype, --weight-only and --checkpoint")
        if args.json is not None:
            try:  # checked before the questions are asked, not after
                files.check_destination(
                    args.json, JSON_WRITER, folder=False, overwrite=args.overwrite, need_bytes=2**20
                )
            except (OSError, ValueError) as err:
                parser.error(f"--json: {err}")

    parser = Parser(prog="qwenvl-lab evaluate", description=__doc__.splitlines()[0], check=check)
    parser.add_argument("--seed", type=options.whole(0, options.SEED_MAX), default=1)
    parser.add_argument("--n", type=options.whole(1, MOST_QUESTIONS), default=500, help="questions (default: 500)")
    parser.add_argument(
        "--checkpoint",
        type=options.folder_with("config.json", "a Qwen-VL checkpoint directory"),
        default=None,
        help="checkpoint directory (default: the shipped toy model)",
    )
    parser.add_argument("--device", type=options.device, default="cpu", help="cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="ask an engine of this dtype, built from the checkpoint in a temporary directory (default: the eager "
        "model in float32)",
    )
    parser.add_argument(
        "--weight-only",
        choices=("int8",),
        help="with --dtype: the engine's layer matrices in int8, one scale per output channel",
    )
    parser.add_argument(
        "--engine",
        type=options.folder_with("manifest.json", "an engine directory (qwenvl-lab build's)"),
        help="ask this engine directory (build_engine's) instead",
    )
    parser.add_argument(
        "--json",
        type=options.output_file,
        help="write the accuracies and the sample pictures' answers here (a new file, or --overwrite)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the --json file if it exists")
    parser.add_argument(
        "--skip-controls",
        action="store_true",
        help="leave out the two control passes (the tables zeroed, no picture): a third of the time",
    )
    return parser


def engine_bytes(engine_dir: Path) -> dict:
    """Bytes of an engine directory's files (the language model's weights file apart) and of the weights its runner
    holds."""
    engine_dir = check_path("engine_dir", engine_dir)
    sizes = {p.relative_to(engine_dir).as_posix(): p.stat().st_size for p in engine_dir.rglob("*") if p.is_file()}
    return {"files": sum(sizes.values()), "llm/rank0.safetensors": sizes.get("llm/rank0.safetensors")}


def report(model, tokenizer, args, precision: str) -> dict:
    """The accuracies (with the table, with it zeroed, with no picture) and the sample answers, as printed and saved
    (with an engine, its files' bytes and the bytes of the weights it holds)."""
    examples = make_dataset(args.seed, args.n)
    real = evaluate(model, tokenizer, examples=examples)
    controls = {}
    if not args.skip_controls:
        controls = {
            "accuracy_table_zeroed": evaluate(model, tokenizer, examples=examples, zero_table=True),
            "no_picture": no_picture_accuracy(model, tokenizer, examples),
        }
    sizes = {}
    if isinstance(model, QWenInfer):
        sizes = {
            "engine_bytes": {**engine_bytes(model.runner.engine_dir), "weights_held": model.runner.engine.stacked_bytes}
        }
    return {
        **sizes,
        "command": "python -m qwenvl_lab.toy.evaluate " + shlex.join(sys.argv[1:] if args.argv is None else args.argv),
        "precision": precision,
        "hardware": {**machine(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "held_out": {"seed": args.seed, "n": args.n},
        "accuracy": real,
        **controls,
        "samples": sample_answers(model, tokenizer),
    }


def summary(result: dict, args, precision: str) -> str:
    """The report as printed: accuracy per question kind and language (and with the tables zeroed, and with no
    picture, when those passes ran), and how many sample answers are the trained text."""
    real, zero = result["accuracy"], result.get("accuracy_table_zeroed")
    lines = [
        f"held-out set: seed {args.seed}, {args.n} questions ('where': a box of IoU >= 0.5 with the shape's); "
        f"{precision}",
        f"{'question':<12}{'accuracy':>10}" + (f"{'table zeroed':>14}" if zero else ""),
    ]
    for key in [f"{k}/{lang}" for k in QUESTION_KINDS for lang in LANGS] + ["overall"]:
        if key in real:
            lines.append(f"{key:<12}{real[key]:>10.3f}" + (f"{zero[key]:>14.3f}" if zero else ""))
    for key, value in result.get("no_picture", {}).items():
        lines.append(f"{key:<12}{value:>10.3f}   the same questions with no picture: '{no_picture(key[-2:])}'")
    exact = sum(s["answer"] == s["trained"] for s in result["samples"])
    lines.append(f"sample pictures: {exact} of {len(result['samples'])} answers are the trained text to the letter")
    return "\n".join(lines)


def main(argv=None):
    """Command line: print accuracy per question kind and language, with the prompt table and zeroed."""
    args = parser().parse_args(argv)
    args.argv = argv
    with tempfile.TemporaryDirectory(prefix="qwenvl-evaluate-") as workdir:
        if args.engine is not None or args.dtype is not None:
            engine_dir = args.engine
            if engine_dir is None:
                checkpoint = args.checkpoint or default_checkpoint_dir()
                engine_dir = build_engine(
                    checkpoint, Path(workdir) / "engine", engine_config(args.dtype, args.weight_only)
                )
            model = QWenInfer.from_dir(engine_dir, device=args.device)
            b = model.runner.build_config
            precision = b.dtype + (f", weight-only {b.weight_only}" if b.weight_only else "") + " engine"
            tokenizer = model.tokenizer
        else:
            model, tokenizer, precision = (
                load_toy_model(args.checkpoint, device=args.device),
                load_tokenizer(),
                "float32 eager",
            )
        result = report(model, tokenizer, args, precision)
    if args.json is not None:  # written first: a long run's results are kept whatever the printing does
        text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
        files.write_text(args.json, text, JSON_WRITER, overwrite=args.overwrite)
    print(summary(result, args, precision))
    return result


if __name__ == "__main__":
    main()
