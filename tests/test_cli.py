"""The `qwenvl-lab` command: its subcommands, each with --help, and what ask, build and chat do."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import refuse_writes_in
from PIL import Image
from safetensors import SafetensorError

from qwenvl_lab import bench, cli, grounding, infer
from qwenvl_lab.engine import build

IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"


def test_help_lists_every_subcommand_without_loading_torch():
    code = (
        "import sys\nfrom qwenvl_lab.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch loaded:', 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert all(name in done.stdout for name in cli.SUBCOMMANDS)
    assert done.stdout.strip().endswith("torch loaded: False")


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_each_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0 and f"{name}" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_each_subcommand_names_itself_in_its_usage(name, capsys):
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: qwenvl-lab {name} ")


def test_ask_shows_every_default_in_its_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["ask", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 图片里是什么？)" in out and "(default: cpu)" in out and "(default: 64)" in out


def test_ask_answers_about_a_picture(capsys):
    assert (
        cli.main(
            [
                "ask",
                "--image",
                str(IMAGES / "red_circle.png"),
                "--question",
                "What is in the picture?",
                "--max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == "A red circle."
    with pytest.raises(SystemExit):
        cli.main(["ask", "--image", "nowhere.png"])


def test_build_writes_an_engine_and_refuses_to_overwrite_it_unasked(tmp_path, capsys):
    engine = tmp_path / "engine"
    args = ["build", "--engine", str(engine), "--max-batch-size", "1", "--images-per-request", "1"]
    assert cli.main(args) == 0 and (engine / "manifest.json").is_file()
    assert cli.main(args) == 2
    assert "already holds an engine: pass overwrite=True" in capsys.readouterr().err
    assert cli.main(args + ["--overwrite"]) == 0


def test_chat_streams_answers_and_keeps_the_conversation(toy_chat, tmp_path):
    lines = iter(
        [
            "/image " + str(IMAGES / "red_circle.png"),
            "What is in the picture?",
            "How many shapes are there?",
            "/image nowhere.png",
            "/clear",
            "/quit",
        ]
    )
    out = []
    status = cli.chat_main(
        ["--engine", str(toy_chat[0].engine_dir), "--boxes", str(tmp_path)],
        read=lambda prompt: next(lines),
        write=lambda *a, **k: out.append("".join(map(str, a))),
    )
    text = "".join(out)
    assert status == 0 and "A red circle." in text and "One." in text
    assert "nowhere.png was not attached: image file not found" in text and "conversation cleared" in text


def _full_disk(monkeypatch, tmp_path):

    def full(*args, **kwargs):
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })'
        )

    monkeypatch.setattr(build, "save_file", full)


def _read_only(monkeypatch, tmp_path):
    refuse_writes_in(monkeypatch, tmp_path)


def _closed_stdin(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "stdin", None)  # what Python sees when its standard input was closed (<&-)


def _empty_cwd(monkeypatch, tmp_path):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")


def _dangling(monkeypatch, tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "gone", target_is_directory=True)


def _no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what torch says on a machine without one


def _busy(monkeypatch, tmp_path):

    def busy(*args):
        raise RuntimeError("the machine is too busy to measure; rerun with more --repeats")

    monkeypatch.setattr(bench, "run_benchmark", busy)


BUILD = ["build", "--max-batch-size", "1", "--images-per-request", "1"]
USER_ERRORS = [  # (arguments, what sets the scene, what the one line says)
    (["ask", "--device", "gpu"], None, r"--device 'gpu' is not a device: use cpu or cuda"),
    (["ask", "--device", "cuda"], _no_gpu, r"--device cuda: torch sees no CUDA GPU here; use cpu"),
    (["ask", "--max-new-tokens", "0"], None, r"--max-new-tokens must be a whole number >= 1, got '0'"),
    (["ask", "--image", "{tmp}"], None, r"--image .* is a folder, not a picture"),
    (["ask", "--image", "{tmp}/nowhere.png"], None, r"--image '.*nowhere.png': no such file; give a picture file"),
    (["chat", "--device", "cuda:x"], None, r"--device 'cuda:x' is not a device"),
    (["chat", "--boxes", "{tmp}/file"], None, r"--boxes '.*file' is a file: give a folder"),
    (["chat", "--max-new-tokens", "-3"], None, r"--max-new-tokens must be a whole number >= 1, got '-3'"),
    (["chat"], _closed_stdin, r"standard input is closed: run qwenvl-lab chat in a terminal, or pipe"),
    ([*BUILD, "--engine", ""], None, r"--engine is empty: give a path"),
    ([*BUILD, "--engine", "."], _empty_cwd, r"the current directory .*give a new directory, e.g. ./engine"),
    ([*BUILD, "--engine", "{tmp}/link"], _dangling, r"link is a symbolic link to .*gone, which does not exist"),
    ([*BUILD, "--engine", "{tmp}/e"], _full_disk, r"no space left on the device of .*: free some space"),
    ([*BUILD, "--engine", "{tmp}/e"], _read_only, r"cannot write .*/e in .* \(permission denied\): give a directory"),
    ([*BUILD, "--engine", "{tmp}/e", "--max-batch-size", "0"], None, r"--max-batch-size must be a whole number >= 1"),
    (
        ["build", "--engine", "{tmp}/e", "--images-per-request", "1000"],
        None,
        r"--images-per-request 1000: a request of --max-input-len 640 ids holds at most 2 pictures",
    ),
    (["build", "--engine", "{tmp}/e", "--images-per-request", "-1"], None, r"must be a whole number >= 0, got '-1'"),
    (["bench", "--threads", "0"], None, r"--threads must be a whole number from 1 to 1024, got '0'"),
    (["bench", "--model", "tiny"], _busy, r"the machine is too busy to measure; rerun with more --repeats"),
]


@pytest.mark.parametrize("argv, scene, match", USER_ERRORS)
def test_every_user_error_is_one_line_that_says_what_to_do(argv, scene, match, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    if scene is not None:
        scene(monkeypatch, tmp_path)
    try:
        status = cli.main([a.format(tmp=tmp_path) for a in argv])
    except SystemExit as exit_info:  # argparse: its usage, then one line
        status = exit_info.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert re.match(rf"(qwenvl-lab |python -m qwenvl_lab\.){argv[0]}", lines[0]) and re.search(match, lines[0]), err


def chat_session(engine_dir, lines, *extra):
    """The text `qwenvl-lab chat` writes for the lines typed (then end of input)."""
    typed, out = iter(lines), []

    def read(prompt):
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    status = cli.chat_main(
        ["--engine", str(engine_dir), "--max-new-tokens", "16", *extra],
        read=read,
        write=lambda *a, **k: out.append("".join(map(str, a)) + k.get("end", "\n")),
    )
    assert status == 0
    return "".join(out)


def test_chat_never_overwrites_earlier_pictures_with_boxes(toy_chat, tmp_path, monkeypatch):

    (tmp_path / "turn-1.png").write_bytes(b"from an earlier session")
    monkeypatch.setattr(grounding, "boxes_picture", lambda pictures, answer: Image.new("RGB", (8, 8), (200, 0, 0)))
    text = chat_session(
        toy_chat[0].engine_dir,
        ["/image " + str(IMAGES / "red_circle.png"), "Where is it?", "And now?"],
        "--boxes",
        str(tmp_path),
    )
    assert (tmp_path / "turn-1.png").read_bytes() == b"from an earlier session"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["turn-1.png", "turn-2.png", "turn-3.png"]
    assert f"boxes drawn on the picture: {tmp_path / 'turn-2.png'}" in text


def test_chat_commands_and_a_bad_picture_said_once(toy_chat, tmp_path):
    (tmp_path / "notes.png").write_text("not a picture")
    text = chat_session(
        toy_chat[0].engine_dir,
        [
            "/image " + str(tmp_path / "notes.png"),
            "/image",
            "/image '" + str(IMAGES / "red_circle.png") + "'",
            "/drop",
            "What is in the picture?",
            "How many shapes are there?",
            "/help",
            "/pictures",
        ],
        "--boxes",
        str(tmp_path / "boxes"),
    )
    assert text.count("notes.png was not attached: cannot read") == 1 and "cannot ask" not in text
    assert "give the picture's path: /image PATH" in text and "1 attached picture(s) dropped" in text
    assert text.count("/drop  ") == 2  # the help, at the start and when asked
    assert "unknown command /pictures: /help lists the commands" in text


def test_chat_says_when_the_oldest_turns_no_longer_fit(toy_chat, tmp_path):
    pictures = ["red_circle.png", "blue_square.png", "green_triangle.png", "yellow_circle.png", "three_shapes.png"]
    lines = []
    for name in pictures:
        lines += ["/image " + str(IMAGES / name), "What is in the picture?"]
    text = chat_session(toy_chat[0].engine_dir, lines, "--boxes", str(tmp_path))
    assert "cannot ask" not in text
    assert text.count("the oldest turn no longer fits the engine: left out of the conversation") == 1


def test_chat_reuses_the_history_keyed_by_pixels_unless_told_not_to(toy_chat, tmp_path, monkeypatch):
    """The chat's runner keeps each turn's blocks (picture-hash keys) by default; --no-kv-cache-reuse turns it off;
    either way the same answers."""
    runners, loaded = [], infer.QWenInfer.from_dir.__func__

    def keeping(cls, *args, **kwargs):
        made = loaded(cls, *args, **kwargs)
        runners.append(made.runner)
        return made

    monkeypatch.setattr(infer.QWenInfer, "from_dir", classmethod(keeping))
    typed = ["/image " + str(IMAGES / "red_circle.png"), "What is in the picture?", "How many shapes are there?"]
    texts = [chat_session(toy_chat[0].engine_dir, typed, *extra) for extra in ([], ["--no-kv-cache-reuse"])]
    assert texts[0] == texts[1] and "A red circle." in texts[0]
    reusing, plain = runners
    assert reusing.kv_cache_reuse and reusing.kv_cache_key == "mm_hash" and reusing.last_prefill.reused_ids[0] > 256
    assert not plain.kv_cache_reuse and plain.last_prefill.reused_ids == (0,)
