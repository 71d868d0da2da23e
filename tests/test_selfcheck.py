"""The end-of-notebook self-checks: every bank is well formed, answers are graded with the option's explanation, and
the widget and the plain text show the same questions."""

import ast
import json
import sys
import types
from pathlib import Path

import pytest

import qwenvl_lab.course.exercises as exercises
from qwenvl_lab.course.exercises import check, selfcheck
from qwenvl_lab.course.exercises.selfcheck import Question, right, wrong

REPO = Path(__file__).resolve().parents[1]
SAMPLE = (
    Question(
        "How many ids does one picture take, tags included?",
        (
            wrong("256", "that is the span alone; <img> and </img> are ids too"),
            right("258", "<img>, 256 ids, </img>"),
            wrong("it depends on the path", "the span is padded to 256 whatever the path"),
        ),
    ),
    Question("Is `<img>` 151857?", (right("yes", "image_start_id"), wrong("no", "it is, in config.json"))),
)


@pytest.fixture
def sample_bank(monkeypatch):
    """A notebook "99" whose self-check is SAMPLE, given as a function (as a bank that computes its answers is)."""
    calls = []

    def bank():
        calls.append(1)
        return list(SAMPLE)

    module = types.ModuleType("qwenvl_lab.course.exercises.nb99")
    module.SELF_CHECK = bank
    monkeypatch.setitem(sys.modules, "qwenvl_lab.course.exercises.nb99", module)
    selfcheck._bank.cache_clear()
    yield calls
    selfcheck._bank.cache_clear()


def question(*choices, prompt="Which?"):
    return Question(prompt, choices)


@pytest.mark.parametrize(
    "bank, expected",
    [
        (SAMPLE, []),
        ((), ["no question"]),
        ((question(wrong("a", "x"), wrong("b", "y")),), ["0 right options"]),
        ((question(right("a", "x"), right("b", "y")),), ["2 right options"]),
        ((question(right("a", "x"), wrong("a", "y")),), ["the same option twice"]),
        ((question(right("a", "x"), wrong("b", "")),), ["option 'b' has no explanation"]),
        ((question(right("a", ""), wrong("b", "y")),), ["option 'a' has no explanation"]),
        ((question(right("a", "x")),), ["1 options"]),
        ((question(right("a", "x"), wrong(" ", "y")),), ["an empty option"]),
        ((question(right("a", "x"), wrong("b", "y"), prompt=" "),), ["no prompt"]),
    ],
)
def test_problems_of_a_bank(bank, expected):
    found = selfcheck.problems(bank)
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), found


@pytest.mark.parametrize("notebook", selfcheck.notebooks())
def test_every_notebooks_bank_is_well_formed(notebook):
    assert selfcheck.problems(selfcheck.questions(notebook)) == []
    for n, q in enumerate(selfcheck.questions(notebook), 1):  # the right letter grades right, every other wrong
        for k, choice in enumerate(q.choices):
            verdict = selfcheck.grade(notebook, n, selfcheck.LETTERS[k])
            assert verdict.ok == choice.correct and choice.why in verdict.message


@pytest.mark.parametrize(
    "number, choice, ok, says",
    [
        (1, "b", True, "(b) right — <img>, 256 ids"),
        (1, "(B)", True, "(b) right"),
        (1, "258", True, "(b) right"),
        (1, "a", False, "(a) not quite — that is the span alone"),
        (1, "it depends on the path", False, "padded to 256"),
        (2, "a", True, "image_start_id"),
        (2, "b", False, "in config.json"),
    ],
)
def test_grade_says_why_for_every_option(sample_bank, number, choice, ok, says):
    verdict = selfcheck.grade("99", number, choice)
    assert bool(verdict) is ok and says in str(verdict) and str(verdict).startswith(f"self-check 99, question {number}")


@pytest.mark.parametrize(
    "number, choice, error, says",
    [
        (1, "d", ValueError, "'a', 'b', 'c'"),
        (2, "c", ValueError, "'a', 'b'"),
        (1, 1, ValueError, "the letter of an option"),
        (3, "a", ValueError, "questions 1 to 2"),
        (0, "a", ValueError, "questions 1 to 2"),
        (True, "a", ValueError, "questions 1 to 2"),
    ],
)
def test_grade_refuses_what_is_no_answer(sample_bank, number, choice, error, says):
    with pytest.raises(error, match=says):
        selfcheck.grade("99", number, choice)


def test_a_notebook_without_a_self_check_is_named():
    with pytest.raises(KeyError, match="has no self-check"):
        selfcheck.questions("98")


def test_a_bank_function_is_called_once(sample_bank):
    assert selfcheck.questions("99") == selfcheck.questions(99) == SAMPLE
    assert len(sample_bank) == 1


def test_plain_text_lists_every_option_and_how_to_answer(sample_bank, capsys):
    assert selfcheck.show("99", widgets=False) is None
    text = capsys.readouterr().out
    assert text == selfcheck.as_text("99") + "\n"
    assert "1. How many ids" in text and "   (c) it depends on the path" in text and "2. Is `<img>` 151857?" in text
    assert 'selfcheck.grade("99", <question number>, "<letter>")' in text


def test_the_widget_grades_the_picked_option(sample_bank):
    ipywidgets = pytest.importorskip("ipywidgets")
    view = selfcheck.show("99")
    assert isinstance(view, ipywidgets.VBox) and len(view.children) == 2
    prompt, row, verdict = view.children[0].children
    letters, button = row.children
    assert "<code>" not in prompt.value and "<code>&lt;img&gt;</code>" in view.children[1].children[0].value
    assert [label for label, _ in letters.options] == ["(a)", "(b)", "(c)"]
    assert "(a) 256" in prompt.value and "(c) it depends on the path" in prompt.value
    button.click()
    assert verdict.value == "pick an option first"
    letters.value = "a"
    button.click()
    assert "not quite" in verdict.value and "#c25e00" in verdict.value
    letters.value = "b"
    button.click()
    assert "right — &lt;img&gt;, 256 ids" in verdict.value and "#2b8a3e" in verdict.value


@pytest.mark.parametrize("notebook", selfcheck.notebooks())
def test_the_widget_shows_every_option_as_markdown(notebook):
    """Options and prompts are rendered (`code` as code), never shown with their raw backticks."""
    pytest.importorskip("ipywidgets")
    for box, question in zip(selfcheck.show(notebook).children, selfcheck.questions(notebook)):
        shown = box.children[0].value
        assert "`" not in shown, shown
        for choice in question.choices:
            assert selfcheck.inline_html(choice.text) in shown


def test_notebooks_01_to_06_have_a_self_check_and_show_it():
    assert {"01", "02", "03", "04", "05", "06"} <= set(selfcheck.notebooks())
    for notebook in ("01", "02", "03", "04", "05", "06"):
        path = next(REPO.glob(f"notebooks/{notebook}_*.ipynb"))
        sources = ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]]
        assert any(f'selfcheck.show("{notebook}")' in source for source in sources), path.name


def option_values(text: str) -> list:
    """What an option's text could be given as, as an answer to an exercise: the text, and its Python value."""
    values = [text, text.strip("`")]
    try:
        values.append(ast.literal_eval(text.strip("`")))
    except (ValueError, SyntaxError):
        pass
    return values


@pytest.mark.parametrize("notebook", selfcheck.notebooks())
def test_no_self_check_offers_an_exercises_answer(notebook):
    """A self-check must not hand over the answer of one of its notebook's exercises among its options."""
    exercises._load()
    keys = [key for key in exercises.REGISTRY if key.startswith(f"{notebook}.")]
    for question in selfcheck.questions(notebook):
        for choice in question.choices:
            for value in option_values(choice.text):
                for key in keys:
                    assert not check(key, value), f"{notebook}'s self-check offers {choice.text!r}, the answer to {key}"
