"""`qwenvl-lab` — the command line: ask about a picture, build an engine, benchmark, train, evaluate, check the setup.

Each subcommand is one step of the course run from a terminal; `qwenvl-lab SUBCOMMAND --help` lists its options.
The heavy imports (torch, transformers) happen only once a subcommand runs, so `--help` answers at once.
"""

import argparse
import importlib
import sys
from pathlib import Path

# subcommand → (module whose main(argv) runs it, one line of help)
SUBCOMMANDS = {
    "ask": ("qwenvl_lab.cli", "answer a question about pictures with the course's model or an engine"),
    "chat": ("qwenvl_lab.cli", "chat about pictures with an engine: streamed answers, boxes saved as pictures"),
    "build": ("qwenvl_lab.cli", "build an engine directory from a Qwen-VL checkpoint"),
    "bench": ("qwenvl_lab.bench", "eager transformers against the engine: speed, memory, the bandwidth limit"),
    "train": ("qwenvl_lab.toy.train", "train the toy model on shape pictures"),
    "evaluate": ("qwenvl_lab.toy.evaluate", "held-out accuracy of the toy model, with its prompt table and zeroed"),
    "trtllm": ("qwenvl_lab.trtllm.pipeline", "the TensorRT path: ONNX, plan, checkpoint, trtllm-build, one answer"),
    "doctor": ("qwenvl_lab.doctor", "check this machine for the course, one line per check"),
    "lab": ("qwenvl_lab.lab", "open the course in JupyterLab on your own copies of the notebooks"),
}


def ask_main(argv=None) -> int:
    """`qwenvl-lab ask`: one question about zero or more pictures, answered greedily."""
    parser = argparse.ArgumentParser(prog="qwenvl-lab ask", description=ask_main.__doc__)
    parser.add_argument("--image", action="append", default=[], help="a picture file (repeat for several)")
    parser.add_argument("--question", default="图片里是什么？", help="the question (default: %(default)s)")
    parser.add_argument("--engine", help="an engine directory (build_engine's); default: the course's model, eager")
    parser.add_argument("--checkpoint", help="a Qwen-VL checkpoint directory (default: the shipped toy model)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for an NVIDIA GPU (default: %(default)s)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, help="the most tokens the answer may have (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.engine and args.checkpoint:
        parser.error("give --engine or --checkpoint, not both")
    for image in args.image:
        if not Path(image).is_file():
            parser.error(f"picture not found: {image!r}")
    from . import chat
    from .tokenizing import load_tokenizer

    if args.engine:
        from .engine import QWenInfer

        infer = QWenInfer.from_dir(args.engine, device=args.device)
        answer, _ = infer.qwen_infer(args.image, args.question, max_new_tokens=args.max_new_tokens)
    else:
        from .toy import default_checkpoint_dir, load_course_model

        checkpoint = args.checkpoint or default_checkpoint_dir()
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
  /clear        forget the conversation
  /quit         leave (so do Ctrl-D and Ctrl-C)"""


def chat_main(argv=None, read=input, write=print) -> int:
    """`qwenvl-lab chat`: a conversation with an engine in the terminal; each answer's boxes are drawn on its picture
    and saved as a PNG file."""
    parser = argparse.ArgumentParser(
        prog="qwenvl-lab chat",
        description=chat_main.__doc__,
        epilog=CHAT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--engine", help="an engine directory (default: the course's engine, built on first use)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for an NVIDIA GPU (default: %(default)s)")
    parser.add_argument(
        "--sample",
        action="store_true",
        help="sample with the engine's generation_config.json (Qwen-VL-Chat: top_p 0.3); default greedy",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="the most tokens an answer may have (default: %(default)s)"
    )
    parser.add_argument("--boxes", type=Path, help="where pictures with boxes go (default: course-output/chat/)")
    args = parser.parse_args(argv)
    from .chat import Conversation, GenerationSettings
    from .engine import QWenInfer
    from .resources import output_dir
    from .toy import course_engine
    from .widgets import boxes_picture

    infer = QWenInfer.from_dir(args.engine or course_engine(), device=args.device)
    settings = GenerationSettings.from_dir(
        infer.runner.engine_dir, do_sample=args.sample, max_new_tokens=args.max_new_tokens
    )
    talk = Conversation(infer.runner, infer.vision, infer.tokenizer, settings=settings)
    boxes_dir = args.boxes or output_dir() / "chat"
    pictures, turn = [], 0
    write(CHAT_HELP)
    while True:
        try:
            line = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            return 0
        if line in ("/quit", "/exit"):
            return 0
        if line == "/clear":
            talk.clear()
            pictures = []
            write("(conversation cleared)")
        elif line.startswith("/image"):
            path = Path(line[len("/image") :].strip())
            if path.is_file():
                pictures.append(path)
                write(f"(picture {path} attached to your next question)")
            else:
                write(f"(no picture file at {str(path)!r})")
        elif line:
            write("model> ", end="", flush=True)
            try:
                answer = "".join(write(piece, end="", flush=True) or piece for piece in talk.stream(line, pictures))
            except (ValueError, TypeError, FileNotFoundError) as err:
                write(f"\n(cannot ask: {err})")
                continue
            write()
            pictures, turn = [], turn + 1
            drawn = boxes_picture(talk, answer)
            if drawn is not None:
                boxes_dir.mkdir(parents=True, exist_ok=True)
                drawn.save(boxes_dir / f"turn-{turn}.png")
                write(f"(boxes drawn on the picture: {boxes_dir / f'turn-{turn}.png'})")


def build_main(argv=None) -> int:
    """`qwenvl-lab build`: a checkpoint's engine directory, with the limits trtllm-build would fix."""
    parser = argparse.ArgumentParser(prog="qwenvl-lab build", description=build_main.__doc__)
    parser.add_argument("--checkpoint", help="a Qwen-VL checkpoint directory (default: the shipped toy model)")
    parser.add_argument("--engine", required=True, help="the engine directory to write (new, empty, or --overwrite)")
    parser.add_argument("--max-batch-size", type=int, default=4)
    parser.add_argument("--max-input-len", type=int, default=640)
    parser.add_argument("--max-seq-len", type=int, default=704)
    parser.add_argument(
        "--images-per-request",
        type=int,
        default=2,
        help="sets --max_prompt_embedding_table_size = 256 × this × max batch size (0: text only)",
    )
    parser.add_argument("--max-beam-width", type=int, default=1)
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--overwrite", action="store_true", help="replace an engine built earlier in --engine")
    args = parser.parse_args(argv)
    from .engine import BuildConfig, build_engine
    from .tokenizing import IMG_TOKEN_SPAN
    from .toy import default_checkpoint_dir

    config = BuildConfig(
        max_batch_size=args.max_batch_size,
        max_input_len=args.max_input_len,
        max_seq_len=args.max_seq_len,
        max_beam_width=args.max_beam_width,
        dtype=args.dtype,
        max_prompt_embedding_table_size=IMG_TOKEN_SPAN * args.images_per_request * args.max_batch_size,
    )
    engine_dir = build_engine(
        args.checkpoint or default_checkpoint_dir(), args.engine, config, overwrite=args.overwrite
    )
    print(f"engine written to {engine_dir}")
    return 0


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
    module = importlib.import_module(SUBCOMMANDS[name][0])
    run = {"ask": ask_main, "chat": chat_main, "build": build_main}.get(name, getattr(module, "main", None))
    try:
        status = run(rest)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as err:
        print(f"qwenvl-lab {name}: {err}", file=sys.stderr)
        return 2
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
