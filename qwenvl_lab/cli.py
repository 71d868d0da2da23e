"""`qwenvl-lab` — the command line: ask about a picture, build an engine, benchmark, train, evaluate, check the setup.

Each subcommand is one step of the course run from a terminal; `qwenvl-lab SUBCOMMAND --help` lists its options.
The heavy imports (torch, transformers) happen only once a subcommand runs, so `--help` answers at once.
"""

import argparse
import errno
import importlib
import io
import json
import re
import sys
from pathlib import Path

from . import files, options
from .options import Parser

# the one dispatch table: subcommand → (the function that runs it, as "module:function", one line of help). Each
# module loads only when its subcommand runs; `doctor` and `lab` are the course's own commands (qwenvl_lab.course)
SUBCOMMANDS = {
    "ask": ("qwenvl_lab.cli:ask_main", "answer a question about pictures with the course's model or an engine"),
    "chat": (
        "qwenvl_lab.cli:chat_main",
        "chat about pictures with an engine: streamed answers, boxes saved as pictures",
    ),
    "build": ("qwenvl_lab.cli:build_main", "build an engine directory from a Qwen-VL checkpoint"),
    "bench": ("qwenvl_lab.bench:main", "eager transformers against the engine: speed, memory, the bandwidth limit"),
    "train": ("qwenvl_lab.toy.train:main", "train the toy model on shape pictures"),
    "evaluate": (
        "qwenvl_lab.toy.evaluate:main",
        "held-out accuracy of the toy model, with its prompt table and zeroed",
    ),
    "trtllm": (
        "qwenvl_lab.trtllm.pipeline:main",
        "the TensorRT path: ONNX, plan, checkpoint, trtllm-build, one answer",
    ),
    "dump": (
        "qwenvl_lab.cli:dump_main",
        "record every stage of one answer, pixels to generated ids, as a per-stage dump (safetensors)",
    ),
    "diff": ("qwenvl_lab.cli:diff_main", "compare two per-stage dumps and name the first stage that diverges"),
    "doctor": ("qwenvl_lab.course.doctor:main", "check this machine for the course, one line per check"),
    "lab": ("qwenvl_lab.course.lab:main", "open the course in JupyterLab on your own copies of the notebooks"),
}


CHECKPOINT = options.folder_with("config.json", "a Qwen-VL checkpoint directory")
ENGINE = options.folder_with("manifest.json", "an engine directory (qwenvl-lab build's)")  # written last


def command_function(name: str):
    """The function that runs subcommand `name` (its module imported now)."""
    module, _, function = SUBCOMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(module), function)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The argument parser of subcommand `name`: its module's function named as the one that runs it, with `parser`
    for `main` (ask_main → ask_parser, main → parser). Parsing a list with it checks every option as running the
    subcommand does, and runs nothing."""
    module, _, function = SUBCOMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(module), function.replace("main", "parser"))()


def ask_parser() -> Parser:
    """`qwenvl-lab ask`'s options."""

    def check(parser, args):
        if args.engine is not None and args.checkpoint is not None:
            parser.error("--engine and --checkpoint both given: give one of them")

    parser = Parser(prog="qwenvl-lab ask", description=ask_main.__doc__, check=check)
    parser.add_argument(
        "--image", type=options.picture, action="append", default=[], help="a picture file (repeat for several)"
    )
    parser.add_argument(
        "--question", type=options.text, default="图片里是什么？", help="the question (default: %(default)s)"
    )
    parser.add_argument(
        "--engine", type=ENGINE, help="an engine directory (build_engine's); default: the course's model, eager"
    )
    parser.add_argument(
        "--checkpoint", type=CHECKPOINT, help="a Qwen-VL checkpoint directory (default: the shipped toy model)"
    )
    parser.add_argument(
        "--device", type=options.device, default="cpu", help="cpu, or cuda for an NVIDIA GPU (default: %(default)s)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=options.whole(1),
        default=64,
        help="the most tokens the answer may have (default: %(default)s)",
    )
    return parser


def ask_main(argv=None) -> int:
    """`qwenvl-lab ask`: one question about zero or more pictures, answered greedily."""
    args = ask_parser().parse_args(argv)
    from . import chat
    from .tokenizing import load_tokenizer

    if args.engine is not None:
        from .infer import QWenInfer

        infer = QWenInfer.from_dir(args.engine, device=args.device)
        answer, _ = infer.qwen_infer(args.image, args.question, max_new_tokens=args.max_new_tokens)
    else:
        from .toy import default_checkpoint_dir, load_course_model

        checkpoint = default_checkpoint_dir() if args.checkpoint is None else args.checkpoint
        model = load_course_model(checkpoint, device=args.device)
        answer, _ = chat.ask(
            chat.ModelAsRunner(model),
            model.transformer.visual,
            load_tokenizer(checkpoint),
            args.image,
            args.question,
            max_new_tokens=args.max_new_tokens,
        )
    print(answer)
    return 0


CHAT_HELP = """Type a question and press Enter; the answer streams in. Commands:
  /image PATH   attach a picture to your next question (repeat for several)
  /drop         forget the pictures attached to your next question
  /clear        forget the conversation
  /help         show this help
  /quit         leave (so do Ctrl-D and Ctrl-C)"""
CLOSED_STDIN = (
    "standard input is closed: run qwenvl-lab chat in a terminal, or pipe your questions into it "
    "(echo 图片里是什么？ | qwenvl-lab chat)"
)


PICTURE_WRITER = files.writer("chat picture", "a picture with boxes (turn-N.png)")


def save_new_picture(folder: Path, picture) -> Path:
    """Save `picture` as the next turn-N.png in `folder`, after the highest number there: never over an earlier one."""
    folder = files.make_folder(folder, parents=True)
    png = io.BytesIO()
    picture.save(png, format="PNG")
    taken = (re.fullmatch(r"turn-([0-9]+)\.png", p.name) for p in folder.iterdir())
    n = 1 + max((int(m[1]) for m in taken if m), default=0)
    while True:
        path = folder / f"turn-{n}.png"
        try:
            if not (path.exists() or path.is_symlink()):
                with files.writing_file(path, PICTURE_WRITER, need_bytes=png.tell()) as part:
                    part.write_bytes(png.getvalue())
                return path
        except FileExistsError:  # a file that appeared meanwhile is never written over
            pass
        n += 1


def attach(rest: str, write) -> list[Path]:
    """`/image PATH`: [the picture's path] once it reads as a picture, else [] and a line saying why."""
    from .pictures import load_image  # the course's picture reader (PIL): loaded by the chat command only

    path = Path(rest.strip().strip("'\"")).expanduser()
    if not rest.strip():
        write("(give the picture's path: /image PATH)")
        return []
    try:
        load_image(path)
    except (ValueError, TypeError, FileNotFoundError, IsADirectoryError) as err:
        write(f"({path} was not attached: {err})")
        return []
    write(f"(picture {path} attached to your next question; /drop forgets it)")
    return [path]


def answer_turn(talk, line: str, pictures, left_out: int, boxes_dir: Path, write) -> int:
    """One question of the chat, its answer streamed, its boxes drawn and saved: the turns left out so far."""
    from .grounding import boxes_picture  # PIL: loaded by the chat command only

    write("model> ", end="", flush=True)
    try:
        answer = "".join(write(piece, end="", flush=True) or piece for piece in talk.stream(line, pictures))
    except (ValueError, TypeError, FileNotFoundError, IsADirectoryError, RuntimeError) as err:
        dropped = f" (its {len(pictures)} picture(s) were dropped: /image attaches again)" if pictures else ""
        write(f"\n(cannot ask: {err}){dropped}")
        return left_out
    write()
    if talk.left_out > left_out:
        left_out = talk.left_out
        turns = "the oldest turn no longer fits" if left_out == 1 else f"the {left_out} oldest turns no longer fit"
        write(f"({turns} the engine: left out of the conversation; /clear starts afresh)")
    drawn = boxes_picture(talk.pictures, answer)
    if drawn is not None:
        try:
            write(f"(boxes drawn on the picture: {save_new_picture(boxes_dir, drawn)})")
        except OSError as err:
            write(f"(the picture with boxes could not be saved in {boxes_dir}: {err})")
    return left_out


def chat_parser() -> Parser:
    """`qwenvl-lab chat`'s options."""
    parser = Parser(
        prog="qwenvl-lab chat",
        description=chat_main.__doc__,
        epilog=CHAT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--engine", type=ENGINE, help="an engine directory (default: the course's engine, built on first use)"
    )
    parser.add_argument(
        "--device", type=options.device, default="cpu", help="cpu, or cuda for an NVIDIA GPU (default: %(default)s)"
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        help="sample with the engine's generation_config.json (Qwen-VL-Chat: top_p 0.3); default greedy",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=options.whole(1),
        default=128,
        help="the most tokens an answer may have (default: %(default)s)",
    )
    parser.add_argument(
        "--boxes", type=options.output_folder, help="where pictures with boxes go (default: course-output/chat/)"
    )
    parser.add_argument(
        "--kv-cache-reuse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV cache of the history each turn re-sends, its blocks keyed by ids and each picture's "
        "pixels (default: on)",
    )
    return parser


def chat_main(argv=None, read=input, write=print) -> int:
    """`qwenvl-lab chat`: a conversation with an engine in the terminal; each answer's boxes are drawn on its picture
    and saved as a PNG file (turn-N.png, never over an earlier one)."""
    args = chat_parser().parse_args(argv)
    if read is input and (sys.stdin is None or sys.stdin.closed):
        raise ValueError(CLOSED_STDIN)
    from .chat import Conversation, GenerationSettings
    from .infer import QWenInfer
    from .resources import output_dir
    from .toy import course_engine

    infer = QWenInfer.from_dir(
        course_engine() if args.engine is None else args.engine, device=args.device, kv_cache_reuse=args.kv_cache_reuse
    )
    settings = GenerationSettings.from_dir(
        infer.runner.engine_dir, do_sample=args.sample, max_new_tokens=args.max_new_tokens
    )
    talk = Conversation(infer.runner, infer.vision, infer.tokenizer, settings=settings)
    boxes_dir = output_dir() / "chat" if args.boxes is None else args.boxes
    pictures, left_out = [], 0
    write(CHAT_HELP)
    while True:
        try:
            line = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            return 0
        except (OSError, RuntimeError, ValueError):  # input() on a closed standard input
            raise ValueError(CLOSED_STDIN) from None
        command, _, rest = line.partition(" ")
        if command in ("/quit", "/exit"):
            return 0
        if command == "/help":
            write(CHAT_HELP)
        elif command == "/clear":
            talk.clear()
            pictures, left_out = [], 0
            write("(conversation cleared)")
        elif command == "/drop":
            write(f"({len(pictures)} attached picture(s) dropped)")
            pictures = []
        elif command == "/image":
            pictures += attach(rest, write)
        elif command.startswith("/"):
            write(f"(unknown command {command}: /help lists the commands)")
        elif line:
            left_out = answer_turn(talk, line, pictures, left_out, boxes_dir, write)
            pictures = []


def build_parser() -> Parser:
    """`qwenvl-lab build`'s options."""

    def check(parser, args):
        from .tokenizing import IMG_TOKEN_SPAN

        most = args.max_input_len // (IMG_TOKEN_SPAN + 2)
        if args.images_per_request > most:
            parser.error(
                f"--images-per-request {args.images_per_request}: a request of --max-input-len {args.max_input_len} "
                f"ids holds at most {most} pictures ({IMG_TOKEN_SPAN + 2} ids each)"
            )

    parser = Parser(prog="qwenvl-lab build", description=build_main.__doc__, check=check)
    parser.add_argument(
        "--checkpoint", type=CHECKPOINT, help="a Qwen-VL checkpoint directory (default: the shipped toy model)"
    )
    parser.add_argument(
        "--engine",
        type=options.output_folder,
        required=True,
        help="the engine directory to write (new, empty, or --overwrite)",
    )
    parser.add_argument("--max-batch-size", type=options.whole(1), default=4)
    parser.add_argument("--max-input-len", type=options.whole(1), default=640)
    parser.add_argument("--max-seq-len", type=options.whole(1), default=704)
    parser.add_argument(
        "--images-per-request",
        type=options.whole(0),
        default=2,
        help="sets --max_prompt_embedding_table_size = rows a picture (256) × this × max batch size (0: text only)",
    )
    parser.add_argument("--max-beam-width", type=options.whole(1), default=1)
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument(
        "--weight-only",
        choices=("int8",),
        help="store the layers' matrices in int8 with one scale per output channel (TensorRT-LLM's --use_weight_only "
        "--weight_only_precision int8); activations, KV cache, embedding and lm_head stay in --dtype",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an engine built earlier in --engine")
    return parser


def build_main(argv=None) -> int:
    """`qwenvl-lab build`: a checkpoint's engine directory, with the limits trtllm-build would fix."""
    args = build_parser().parse_args(argv)
    from .engine import BuildConfig, build_engine
    from .limits import prompt_table_size
    from .toy import default_checkpoint_dir

    config = BuildConfig(
        max_batch_size=args.max_batch_size,
        max_input_len=args.max_input_len,
        max_seq_len=args.max_seq_len,
        max_beam_width=args.max_beam_width,
        dtype=args.dtype,
        weight_only=args.weight_only,
        max_prompt_embedding_table_size=prompt_table_size(
            BuildConfig(max_batch_size=args.max_batch_size), args.images_per_request
        )
        if args.images_per_request
        else 0,
    )
    checkpoint = default_checkpoint_dir() if args.checkpoint is None else args.checkpoint
    engine_dir = build_engine(checkpoint, args.engine, config, overwrite=args.overwrite)
    print(f"engine written to {engine_dir}")
    return 0


def check_dump_sources(parser: argparse.ArgumentParser, engine, checkpoint) -> None:
    """Refuse, naming the option, an engine or checkpoint that cannot be read, before any work."""
    from .checkpoint import load_config
    from .engine import load_engine_config

    checks = (
        ("--engine", engine, lambda: load_engine_config(engine, verify="quick")),
        ("--checkpoint", checkpoint, lambda: load_config(checkpoint)),
    )
    for option, given, read in checks:
        if given is None:
            continue
        try:
            read()
        except Exception as err:  # whatever the reader raises (onnx: protobuf's DecodeError), one line
            parser.error(f"{option} {str(given)!r} cannot be used: {one_line(err)}")


def onnx_image_size(path: Path) -> int:
    """The picture size an exported vision graph takes (reads the ONNX file: torch and onnx load on first use)."""
    from .trtllm.vision_graph import onnx_image_size as read

    return read(path)


def dump_parser() -> Parser:
    """`qwenvl-lab dump`'s options."""

    def check(parser, args):
        if args.engine is not None and args.checkpoint is not None:
            parser.error("--engine and --checkpoint both given: give one of them")
        if args.backend is not None and args.engine is None:
            parser.error("--backend chooses an engine's decode back end: give --engine too")
        if args.dtype is not None and args.engine is not None:
            parser.error("--dtype is the eager model's: an engine computes in the dtype it was built in")
        from .dump import check_dump_target

        try:
            check_dump_target(args.output, args.overwrite)
        except (OSError, ValueError) as err:
            parser.error(f"--output {one_line(err)}")
        check_dump_sources(parser, args.engine, args.checkpoint)

    parser = Parser(prog="qwenvl-lab dump", description=dump_main.__doc__, check=check)
    parser.add_argument(
        "--image", type=options.picture, action="append", default=[], help="a picture file (repeat for several)"
    )
    parser.add_argument(
        "--question", type=options.text, default="图片里是什么？", help="the question (default: %(default)s)"
    )
    parser.add_argument(
        "--output",
        type=options.output_file,
        required=True,
        help="the dump to write (a new .safetensors file, or --overwrite)",
    )
    parser.add_argument("--engine", type=ENGINE, help="an engine directory (build's); default: the eager model")
    parser.add_argument("--checkpoint", type=CHECKPOINT, help="a Qwen-VL checkpoint directory (default: the course's)")
    parser.add_argument(
        "--backend", choices=("torch", "numba", "triton"), help="the engine's decode back end (default: torch)"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="the eager model's dtype (default: float32; an engine's is the one it was built in)",
    )
    parser.add_argument(
        "--vision-onnx",
        type=options.input_file("an ONNX graph of the vision tower", read=onnx_image_size),
        help="run the vision tower as this exported ONNX graph in ONNX Runtime",
    )
    parser.add_argument("--layers", action="store_true", help="also record every decoder layer's output")
    parser.add_argument(
        "--max-new-tokens",
        type=options.whole(1),
        default=16,
        help="the most tokens the answer may have (default: %(default)s)",
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        help="sample with the checkpoint's or engine's generation_config.json, as run.py does; default greedy",
    )
    parser.add_argument(
        "--seed", type=options.whole(0, options.SEED_MAX), default=0, help="the seed with --sample (default: 0)"
    )
    parser.add_argument(
        "--device", type=options.device, default="cpu", help="cpu, or cuda for an NVIDIA GPU (default: %(default)s)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a dump written earlier at --output")
    return parser


def dump_main(argv=None) -> int:
    """`qwenvl-lab dump`: one answer from the package's eager model or engine, every stage recorded in a dump."""
    args = dump_parser().parse_args(argv)
    from .stage_dumps import implementation_dump

    recorder = implementation_dump(
        [str(image) for image in args.image],
        args.question,
        checkpoint=args.checkpoint,
        engine=args.engine,
        backend=args.backend or "torch",
        dtype=args.dtype or "float32",
        device=args.device,
        vision_onnx=args.vision_onnx,
        layers=args.layers,
        max_new_tokens=args.max_new_tokens,
        sample=args.sample,
        seed=args.seed,
    )
    print(f"dump written to {recorder.save(args.output, overwrite=args.overwrite)} ({len(recorder.tensors)} stages)")
    return 0


def diff_parser() -> Parser:
    """`qwenvl-lab diff`'s arguments."""
    parser = Parser(prog="qwenvl-lab diff", description=diff_main.__doc__)
    dump = options.input_file("a dump file (.safetensors, qwenvl-lab dump's)")
    parser.add_argument("a", metavar="A", type=dump, help="the reference dump (.safetensors)")
    parser.add_argument("b", metavar="B", type=dump, help="the dump compared with it")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    return parser


def diff_main(argv=None) -> int:
    """`qwenvl-lab diff A B`: two per-stage dumps compared stage by stage (B against A); exit status 1 when a stage
    diverges, 0 when none does."""
    parser = diff_parser()
    args = parser.parse_args(argv)
    from .dump import read_dump
    from .stagediff import compare, report

    dumps = []
    for name, path in zip("AB", (args.a, args.b)):
        try:
            dumps.append(read_dump(path))
        except (OSError, ValueError) as err:
            parser.error(f"{name}: {one_line(err)}")
    comparison = compare(*dumps)
    if args.json:
        print(json.dumps(comparison.to_json(), ensure_ascii=False, indent=1))
    else:
        print(report(comparison))
    return 1 if comparison.first is not None else 0


def one_line(err: BaseException) -> str:
    """An error's message on one line, with what to do for a full disk or a folder one cannot write in."""
    text = " ".join(str(err).split("\n")).strip() or type(err).__name__
    if isinstance(err, OSError) and text.startswith("[Errno"):  # the system's words alone: say what to do
        if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return f"{text}: free some space, then run it again"
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return f"{text}: use a folder you can write to"
    return text


def main(argv=None) -> int:
    """Dispatch `qwenvl-lab SUBCOMMAND [options]`; errors of bad input are printed without a traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="qwenvl-lab", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        commands.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv[:1] or ["--help"])
    name, rest = argv[0], argv[1:]
    run = command_function(name)
    try:
        status = run(rest)
    except (ValueError, TypeError, OSError, RuntimeError) as err:  # bad input, a full disk, a busy machine: one line
        print(f"qwenvl-lab {name}: {one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"qwenvl-lab {name}: interrupted", file=sys.stderr)
        return 130
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
