"""Self-checks — a few multiple-choice questions at the end of a notebook, graded by the package.

Each notebook's questions live with its exercises: `SELF_CHECK` in `nbNN.py`, a sequence of `Question`s or a function
that returns them (so a right option can be computed by the package rather than typed). In a notebook:

    from qwenvl_lab.course.exercises import selfcheck
    selfcheck.show("01")                 # the questions as widgets: pick an option, press Check
    selfcheck.grade("01", 2, "b")        # the same verdict as text: right or not, and why

Every option carries its explanation, the right one included, so a learner who picks a wrong option learns why it is
wrong. `problems` lists what is wrong with a bank (the tests run it on every notebook's).
"""

import html
import importlib
import re
from dataclasses import dataclass
from functools import lru_cache

from ...checks.values import is_int
from ..notebooks import with_exercises

LETTERS = "abcdefgh"  # option labels: (a), (b), …


@dataclass(frozen=True)
class Choice:
    """One option of a question: its text, whether it is the right one, and why (shown when it is picked)."""

    text: str
    correct: bool
    why: str


def right(text: str, why: str) -> Choice:
    """The right option of a question, with why it is right."""
    return Choice(str(text), True, why)


def wrong(text: str, why: str) -> Choice:
    """A wrong option of a question, with why it is wrong."""
    return Choice(str(text), False, why)


@dataclass(frozen=True)
class Question:
    """A multiple-choice question: its prompt and its options, exactly one of them right."""

    prompt: str
    choices: tuple[Choice, ...]

    def __post_init__(self):
        object.__setattr__(self, "choices", tuple(self.choices))

    def right_letter(self) -> str:
        """The label of the right option ("a", "b", …)."""
        return next(LETTERS[k] for k, choice in enumerate(self.choices) if choice.correct)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one answer: `ok` only for the right option; `message` says why, for any option."""

    notebook: str
    number: int
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"self-check {self.notebook}, question {self.number}: {self.message}"

    __repr__ = __str__


def problems(questions) -> list[str]:
    """What is wrong with a bank of questions: each must have a prompt, 2 to 8 distinct options, exactly one right
    option, and an explanation for every option. An empty list: nothing."""
    found = []
    if not questions:
        return ["the bank has no question"]
    for n, question in enumerate(questions, 1):
        where = f"question {n} ({question.prompt[:40]!r})"
        if not question.prompt.strip():
            found.append(f"question {n} has no prompt")
        texts = [choice.text for choice in question.choices]
        if not 2 <= len(texts) <= len(LETTERS):
            found.append(f"{where} has {len(texts)} options; give 2 to {len(LETTERS)}")
        if len(set(texts)) != len(texts):
            found.append(f"{where} offers the same option twice: {sorted(t for t in set(texts) if texts.count(t) > 1)}")
        if sum(choice.correct for choice in question.choices) != 1:
            found.append(
                f"{where} has {sum(choice.correct for choice in question.choices)} right options; it needs exactly one"
            )
        found += [
            f"{where}: option {choice.text!r} has no explanation" for choice in question.choices if not choice.why
        ]
        found += [f"{where} has an empty option" for choice in question.choices if not choice.text.strip()]
    return found


def notebooks() -> list[str]:
    """The notebooks ("01", "02", …) whose exercise module has a self-check."""
    modules = ((n.number, importlib.import_module(f"{__package__}.{n.exercise_module}")) for n in with_exercises())
    return [number for number, module in modules if hasattr(module, "SELF_CHECK")]


def notebook_name(notebook) -> str:
    """A notebook's two-digit name: "01" for "01", "1" or 1."""
    return f"{int(notebook):02d}" if str(notebook).isdigit() else str(notebook)


def questions(notebook) -> tuple[Question, ...]:
    """Notebook `notebook`'s self-check ("01" or 1), its right options computed where the package can compute them."""
    return _bank(notebook_name(notebook))


@lru_cache(maxsize=None)
def _bank(name: str) -> tuple[Question, ...]:
    """The questions of notebook `name`'s SELF_CHECK (called once when it is a function)."""
    try:
        module = importlib.import_module(f"{__package__}.nb{name}")
    except ModuleNotFoundError:
        module = None
    bank = getattr(module, "SELF_CHECK", None)
    if bank is None:
        raise KeyError(f"notebook {name!r} has no self-check; the notebooks with one are {notebooks()}")
    return tuple(bank() if callable(bank) else bank)


def _choice_index(question: Question, choice) -> int:
    """The index of `choice` (a letter "a"…, or an option's text) among `question`'s options."""
    if isinstance(choice, str):
        label = choice.strip().strip("()").lower()
        if len(label) == 1 and label in LETTERS[: len(question.choices)]:
            return LETTERS.index(label)
        texts = [c.text for c in question.choices]
        if choice.strip() in texts:
            return texts.index(choice.strip())
    letters = ", ".join(f"'{LETTERS[k]}'" for k in range(len(question.choices)))
    raise ValueError(f"answer with the letter of an option ({letters}) or its text, got {choice!r}")


def grade(notebook: str, number: int, choice) -> Verdict:
    """Grade `choice` (a letter, or the option's text) for question `number` (1, 2, …) of `notebook`'s self-check."""
    bank = questions(notebook)
    if not is_int(number) or not 1 <= number <= len(bank):
        raise ValueError(f"notebook {notebook}'s self-check has questions 1 to {len(bank)}, got {number!r}")
    question = bank[number - 1]
    picked = question.choices[_choice_index(question, choice)]
    verdict = "right" if picked.correct else "not quite"
    return Verdict(
        notebook_name(notebook),
        number,
        picked.correct,
        f"({LETTERS[question.choices.index(picked)]}) {verdict} — {picked.why}",
    )


def as_text(notebook: str) -> str:
    """The self-check as plain text, with how to answer each question."""
    lines = []
    for n, question in enumerate(questions(notebook), 1):
        lines.append(f"{n}. {question.prompt}")
        lines += [f"   ({LETTERS[k]}) {choice.text}" for k, choice in enumerate(question.choices)]
    lines.append(f'Answer with selfcheck.grade("{notebook}", <question number>, "<letter>").')
    return "\n".join(lines)


def inline_html(text: str) -> str:
    """`text` as HTML: escaped, with `backquoted` parts as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def feedback_html(notebook: str, number: int, choice) -> str:
    """What the widget shows after Check: the verdict on `choice` (green when right, orange otherwise), or a
    reminder to pick an option when `choice` is None."""
    if choice is None:
        return "pick an option first"
    verdict = grade(notebook, number, choice)
    colour = "#2b8a3e" if verdict.ok else "#c25e00"
    return f'<span style="color:{colour}">{inline_html(verdict.message)}</span>'


def options_html(question: Question) -> str:
    """A question's options as HTML, one line each, labelled (a), (b), …, their `code` rendered as code."""
    return "".join(
        f'<div style="margin-left:1.5em">({LETTERS[k]}) {inline_html(choice.text)}</div>'
        for k, choice in enumerate(question.choices)
    )


def show(notebook: str, widgets: bool = True):
    """Notebook `notebook`'s self-check: one box per question (its options, a button per letter, Check, the
    verdict), or the plain text when `widgets` is False or ipywidgets is missing."""
    bank = questions(notebook)
    try:
        import ipywidgets  # noqa: PLC0415 — ipywidgets is the course extra's
    except ImportError:
        widgets = False
    if not widgets:
        print(as_text(notebook))
        return None
    boxes = []
    for n, question in enumerate(bank, 1):
        letters = ipywidgets.ToggleButtons(
            options=[(f"({LETTERS[k]})", LETTERS[k]) for k in range(len(question.choices))],
            value=None,
            style={"button_width": "3.5em"},
        )
        button = ipywidgets.Button(description="Check", button_style="primary")
        verdict = ipywidgets.HTML()

        def on_check(_, n=n, letters=letters, verdict=verdict):
            verdict.value = feedback_html(notebook, n, letters.value)

        button.on_click(on_check)
        prompt = ipywidgets.HTML(f"<b>{n}.</b> {inline_html(question.prompt)}{options_html(question)}")
        boxes.append(ipywidgets.VBox([prompt, ipywidgets.HBox([letters, button]), verdict]))
    return ipywidgets.VBox(boxes)
