"""Every option of every subcommand, read from its parser, tried with the values a tired user types: each value is
accepted as typed or refused with exit status 2 and one line that names the option — never a traceback, never a
silent fallback to a default.

The subcommands come from the command line's one dispatch table (`cli.SUBCOMMANDS`) and their options from their own
parsers (`cli.command_parser`), so a new subcommand or option is tried without a line here. What a value should get
follows from the option's type (`qwenvl_lab.options`): a whole number, a number, a device, a text, a picture,
a folder holding a file, a folder or a file to write, one of some choices, a command, a flag. An accepted value stops
after parsing (parsing runs every check of the options, those that span several included: nothing runs); a refused
one is tried again through `qwenvl-lab` itself (`cli.main`), which must refuse it the same way.
"""

import argparse
import math
import re
from pathlib import Path

import pytest
import torch

from qwenvl_lab import cli
from qwenvl_lab.toy.evaluate import evaluate
from qwenvl_lab.toy.train import RECIPE_OPTIONS, Recipe, Trainer

REPO = Path(__file__).resolve().parents[1]
PICTURE = REPO / "data" / "images" / "red_circle.png"
CHECKPOINT = REPO / "data" / "toy-qwen-vl"

# what a tired user types ({tmp}: a folder of the test's, which holds folder/ and notes.txt; the test runs in an
# empty folder beside them, so a word is a path that is not there)
VALUES = {
    "empty": "",
    "blank": " ",
    "zero": "0",
    "minus one": "-1",
    "huge": "1" + "0" * 30,
    "a float": "2.5",
    "a word": "ten",
    "not a number": "nan",
    "a missing path": "{tmp}/missing/nothing.png",
    "a folder": "{tmp}/folder",
    "a file": "{tmp}/notes.txt",
    "a picture": str(PICTURE),
    "a checkpoint": str(CHECKPOINT),
    "a name too long": "{tmp}/" + "x" * 256 + ".png",
    "gpu": "gpu",
    "cuda": "cuda",
}
PATHS = {"a missing path", "a folder", "a file", "a picture", "a checkpoint", "a name too long"}
FILES = {"a file", "a picture"}  # there, and not folders
FOLDERS = {"a folder", "a checkpoint"}

# options that are tried together with another one (a check that spans both refuses them alone)
COMPANIONS = {("train", "--time-limit"): ["--state", "{tmp}/state"]}


def _output_file(name: str) -> str:
    if name in ("empty", "blank", "a name too long") or name in FOLDERS:
        return "refused"
    return "either" if name in FILES or name == "a missing path" else "accepted"


# what a path option of each kind gets for each value (input_file: a file that is there, notes.txt or the picture)
PATH_KINDS = {
    "output_folder": lambda name: (
        "refused" if name in ("empty", "blank", "a name too long") or name in FILES else "accepted"
    ),
    "output_file": _output_file,
    "input_file": lambda name: "accepted" if name in FILES else "refused",
    "input_file of a format": lambda name: "refused",  # none of the values is an ONNX graph or a dump
}


def expected(action, name: str) -> str:
    """'accepted', 'refused' or 'either' (where the writer's own rules decide) for value `name` of an option."""
    kind, kind_of = getattr(action.type, "kind", None), action.type
    if action.choices is not None:
        return "accepted" if VALUES[name] in action.choices else "refused"
    if kind == "choice":  # names of a set (a course notebook): none of the values above
        return "refused"
    if kind == "whole":
        number = {"zero": 0, "minus one": -1, "huge": 10**30}.get(name)
        return "accepted" if number is not None and kind_of.low <= number <= kind_of.high else "refused"
    if kind == "real":
        number = {"zero": 0.0, "minus one": -1.0, "huge": 1e30, "a float": 2.5}.get(name)
        if number is None:
            return "refused"
        above = number > kind_of.low if kind_of.above else number >= kind_of.low
        return "accepted" if above and number <= kind_of.high else "refused"
    if kind == "device":  # on a machine without a GPU, none of the values is a device it has
        return "refused"
    if kind == "text":
        return "refused" if name in ("empty", "blank") else "accepted"
    if kind == "picture":
        return "accepted" if name == "a picture" else "refused"
    if kind == "folder_with":  # the checkpoint holds config.json, no engine's manifest.json
        return "accepted" if name == "a checkpoint" and (CHECKPOINT / kind_of.marker).is_file() else "refused"
    if kind in PATH_KINDS:
        return PATH_KINDS[kind + (" of a format" if getattr(kind_of, "format", False) else "")](name)
    raise AssertionError(
        f"{action.option_strings[0]} has type {kind_of!r}, which says nothing of what it accepts: give it a type from "
        "qwenvl_lab.options (or choices=)"
    )


def good_value(action, tmp: Path) -> str:
    """A value that the option accepts: for the required options every try carries."""
    kind = getattr(action.type, "kind", None)
    good = {
        "picture": str(PICTURE),
        "folder_with": str(CHECKPOINT),
        "output_folder": str(tmp / "new"),
        "output_file": str(tmp / "new-file.safetensors"),
        "input_file": str(PICTURE),
    }
    if kind not in good:
        raise AssertionError(f"{action.option_strings[0]} is required: say here what value of kind {kind} it accepts")
    return good[kind]


def options_of(name: str):
    """(parser, its options but --help) of subcommand `name`."""
    parser = cli.command_parser(name)
    return parser, [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


CASES = [(name, action.option_strings[-1]) for name in cli.SUBCOMMANDS for action in options_of(name)[1]]


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """The test's folder: folder/ (empty), notes.txt, and here/ (empty), where the commands run."""
    tmp = tmp_path_factory.mktemp("arguments")
    (tmp / "folder").mkdir()
    (tmp / "notes.txt").write_text("not a picture, not a folder\n")
    (tmp / "here").mkdir()
    return tmp


@pytest.fixture
def no_gpu(monkeypatch, scene):
    """A machine without a CUDA GPU (whatever this one has), in an empty folder, with no course folder set."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.delenv("QWENVL_LAB_WORKDIR", raising=False)
    monkeypatch.chdir(scene / "here")


def outcome(run, capsys):
    """('accepted', what it returned) or ('refused', the one line of the error) of `run()`; anything else fails."""
    try:
        result = run()
    except SystemExit as stop:
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
        assert stop.code == 2 and len(lines) == 1 and "Traceback" not in err, f"exit {stop.code}:\n{err}"
        return "refused", lines[0]
    capsys.readouterr()
    return "accepted", result


def typed_back(parsed, action, text: str) -> bool:
    """Whether the parsed value is the one typed (not a default put in its place)."""
    value = parsed[-1] if isinstance(parsed, list) else parsed
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isclose(value, float(text))
    return str(value) == text


@pytest.mark.parametrize("name, option", CASES)
def test_every_value_a_tired_user_types_is_taken_as_typed_or_refused_in_one_line(name, option, scene, no_gpu, capsys):
    parser, actions = options_of(name)
    action = next(a for a in actions if a.option_strings[-1] == option)
    positionals = [good_value(a, scene) for a in parser._actions if not a.option_strings]  # diff's A and B
    required = positionals + [
        arg for a in actions if a.required and a is not action for arg in (a.option_strings[-1], good_value(a, scene))
    ]
    companion = [arg.format(tmp=scene) for arg in COMPANIONS.get((name, option), [])]
    if action.nargs == 0:  # a flag: no value to get wrong
        assert outcome(lambda: cli.command_parser(name).parse_args([*required, *companion, option]), capsys)[0] == (
            "accepted"
        )
        return
    tries = dict(VALUES)
    default = action.default[0] if isinstance(action.default, list) and action.default else action.default
    if default not in (None, []) and action.nargs != argparse.REMAINDER:
        tries["its default"] = str(default)
    wrong = []
    for value, template in tries.items():
        text = template.format(tmp=scene)
        argv = [*required, *companion, option, text]
        verdict, said = outcome(lambda argv=argv: cli.command_parser(name).parse_args(argv), capsys)
        if action.nargs == argparse.REMAINDER:
            want = "refused"  # a command to run: none of the values is a program
        elif value == "its default":
            want = "accepted"
        else:
            want = expected(action, value)
        if want != "either" and verdict != want:
            wrong.append(
                f"{value} ({text[:40]!r}): {verdict}, not {want}" + (f": {said}" if verdict == "refused" else "")
            )
            continue
        if verdict == "accepted":
            if action.nargs != argparse.REMAINDER and not typed_back(getattr(said, action.dest), action, text):
                wrong.append(f"{value} ({text[:40]!r}): parsed as {getattr(said, action.dest)!r}, not as typed")
            continue
        if option not in said:
            wrong.append(f"{value} ({text[:40]!r}): the error does not name {option}: {said}")
        # the command itself refuses it the same way, before it does anything
        again = outcome(lambda argv=argv: cli.main([name, *argv]), capsys)
        if again[0] != "refused" or not re.match(rf"qwenvl-lab {name}: error: ", again[1]) or option not in again[1]:
            wrong.append(f"{value} ({text[:40]!r}): qwenvl-lab {name} gave {again}")
    assert not wrong, f"qwenvl-lab {name} {option}:\n" + "\n".join(wrong)


def test_every_subcommand_and_its_options_are_tried():
    """The generator reads every subcommand of the dispatch table and finds each one's options (none is skipped)."""
    tried = {name for name, _ in CASES}
    assert tried == set(cli.SUBCOMMANDS)
    assert {("ask", "--engine"), ("evaluate", "--n"), ("train", "--lr"), ("lab", "--run"), ("bench", "--json")} <= set(
        CASES
    )
    assert len(CASES) >= 70


def run_command(argv, capsys) -> tuple[int, str]:
    """(exit status, the last line of standard error) of `qwenvl-lab ARGV`, which must end without a traceback."""
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return status, err.strip().splitlines()[-1] if err.strip() else ""


SHORT_RUN = ["--batch-size", "1", "--eval-every", "0", "--sharpen-steps", "0"]


@pytest.mark.parametrize(
    "stage",
    [
        pytest.param(["--vision-steps", "3", "--steps", "0"], id="the vision tower"),
        pytest.param(["--vision-steps", "0", "--steps", "3"], id="the whole model", marks=pytest.mark.slow),
    ],
)
def test_a_learning_rate_that_diverges_stops_at_the_first_loss_that_is_not_a_number(stage, tmp_path, capsys):
    """`--lr 1e30` is a number the option takes; the run it makes stops at its first non-finite loss, naming --lr."""
    status, line = run_command(["train", "--out", str(tmp_path / "out"), "--lr", "1e30", *SHORT_RUN, *stage], capsys)
    assert status == 2 and "training diverged at stage" in line and "step 2: the loss is nan" in line
    assert "(--lr 1e+30): try a smaller one" in line and not (tmp_path / "out").exists()


def foreign_states():
    """(name, what a state.pt holds) of files a --state folder may hold that are not a state of this program's."""
    recipe = {name: getattr(Recipe(), name) for name in RECIPE_OPTIONS}
    state = {"recipe": recipe, "stage": 0, "step": 1, "seconds": 0.0, "optimizer": {}, "schedule": {}}
    state |= {"model": {"transformer.h.0.ln_1.weight": torch.zeros(3)}, **{name: {} for name in Trainer.MODULES}}
    return {
        "text": b"notes\n",
        "empty": b"",
        "a zip of nothing": b"PK\x05\x06" + bytes(18),
        "a tensor": torch.zeros(3),
        "a list": [1, 2],
        "a dict of something else": {"weights": torch.zeros(2)},
        "a recipe of other settings": {**state, "recipe": {"seed": 0}},
        "a recipe setting out of range": {**state, "recipe": {**recipe, "batch_size": 0}},
        "a negative step": {**state, "step": -1},
        "weights that do not fit the model": state,
    }


@pytest.mark.parametrize("name", list(foreign_states()))
def test_a_state_file_of_something_else_is_refused_naming_it(name, tmp_path, capsys):
    held = foreign_states()[name]
    (tmp_path / "state").mkdir()
    if isinstance(held, bytes):
        (tmp_path / "state" / "state.pt").write_bytes(held)
    else:
        torch.save(held, tmp_path / "state" / "state.pt")
    argv = ["train", "--state", str(tmp_path / "state"), "--out", str(tmp_path / "out"), *SHORT_RUN]
    status, line = run_command([*argv, "--vision-steps", "1", "--steps", "0"], capsys)
    assert status == 2 and line.startswith("qwenvl-lab train: --state: ") and "state.pt is not a training state" in line
    assert "give --state a folder of its own" in line and not (tmp_path / "out").exists()


def test_evaluating_no_questions_is_refused_by_the_function_too():
    with pytest.raises(ValueError, match=r"no questions to evaluate \(n=0\)"):
        evaluate(None, None, n=0)
