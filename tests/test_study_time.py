"""Study times: counted from a notebook's prose, code, predictions, exercises and self-check at fixed rates, and
quoted alike in the README and the workshop plan."""

import json
import re
from pathlib import Path

import pytest

from qwenvl_lab.course.exercises import selfcheck
from qwenvl_lab.course.notebooks import NOTEBOOKS
from tools import study_time as st

REPO = Path(__file__).resolve().parents[1]


def write_notebook(path: Path, cells):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": [{"cell_type": kind, "source": source} for kind, source in cells]}))
    return path


def test_a_notebook_is_counted_as_a_learner_meets_it(tmp_path):
    notebook = write_notebook(
        tmp_path / "09_demo.ipynb",
        [
            ("markdown", "# A title\n\n**Predict, then run.** " + "word " * 140),
            ("code", "x = 1\n\n# a comment\ny = max(\n    2,\n    3,\n)\n"),
            ("code", 'def my_answer():\n    ...  # your code\n\n\ncheck("09.1", my_answer)'),
            ("markdown", "**Predict, then run** again"),
            ("code", 'check("09.2", None)\ncheck("09.1", None)'),
        ],
    )
    write_notebook(
        tmp_path / "solutions" / "09_solutions.ipynb",
        [
            ("code", "import torch\nsetup = 1\n"),  # no check: not an exercise's solution
            ("code", 'def my_answer():\n    return 1\n\n\nassert check("09.1", my_answer)'),
            ("markdown", 'check("09.2", 3) in the text is no solution'),
            ("code", 'answer = 2 + 1\nassert check("09.2", answer)'),
        ],
    )
    time = st.study_time(notebook, self_check=3)
    assert (time.words, time.code_lines, time.predictions, time.exercises, time.solution_lines, time.self_check) == (
        150,  # the words of the markdown cells
        6,  # the code a learner reads: no blank line, no comment, no line of closing brackets alone, not the cell left
        # for the answer
        2,
        2,  # 09.1 and 09.2, each once however often it is checked
        5,  # 3 lines of 09.1's solution cell + 2 of 09.2's
        3,
    )
    assert time.minutes == pytest.approx(150 / 150 + 6 / 10 + 2 * 2 + 2 * 2 + 5 * 0.5 + 3)
    assert time.rounded == 15


@pytest.mark.parametrize("minutes, rounded", [(0.4, 5), (7.4, 5), (7.6, 10), (112.6, 115)])
def test_minutes_are_rounded_to_five(minutes, rounded):
    time = st.StudyTime(
        "x",
        words=round(minutes * st.WORDS_PER_MINUTE),
        code_lines=0,
        predictions=0,
        exercises=0,
        solution_lines=0,
        self_check=0,
    )
    assert time.rounded == rounded


def quoted(text: str, row: str) -> dict[str, tuple]:
    """Notebook number → the numbers a table row of `text` quotes (rows matching `row`, which captures the number)."""
    return {
        m.group(1): tuple(int(x) for x in re.findall(r"\| (\d+) (?:min|s) (?=\|)", m.group(0)))
        for m in re.finditer(row + r".*$", text, re.MULTILINE)
    }


CLOSING = re.compile(r"This notebook takes about (\d+) minutes of study and runs in about (\d+) s\.")


def test_the_notebook_list_holds_the_counted_times():
    """Every notebook's study time in qwenvl_lab/course/notebooks.py is what tools/study_time.py counts."""
    having = set(selfcheck.notebooks())
    for n in NOTEBOOKS:
        questions = len(selfcheck.questions(n.number)) if n.number in having else 0
        counted = st.study_time(REPO / "notebooks" / n.file, questions).rounded
        assert counted == n.minutes, (
            f"notebook {n.number}: study_time.py counts {counted} min, notebooks.py says {n.minutes}"
        )


def test_the_readme_the_workshop_plan_and_the_notebooks_quote_the_notebook_list():
    """The one source of study and run times is the notebook list: the README's table (run time, study time), the
    workshop plan's counts and each notebook's closing line quote it."""
    readme = quoted((REPO / "README.md").read_text(), r"^\| \[(\d\d) · ")
    workshop = quoted((REPO / "docs" / "workshop.md").read_text(), r"^\| (\d\d) · [^|]+\| \d")
    assert readme == {n.number: (n.run_seconds, n.minutes) for n in NOTEBOOKS}
    core = sum(n.minutes for n in NOTEBOOKS if n.core)
    for name, text in (
        ("README.md", (REPO / "README.md").read_text()),
        ("workshop.md", (REPO / "docs" / "workshop.md").read_text()),
    ):
        totals = {int(m) for m in re.findall(r"(\d+) minutes of study in all", text)}
        assert totals == {core}, f"{name} quotes the core path's total as {totals}; the notebook list sums to {core}"
    assert {k: v[-1] for k, v in workshop.items()} == {n.number: n.minutes for n in NOTEBOOKS}
    for n in NOTEBOOKS:
        cells = json.loads((REPO / "notebooks" / n.file).read_text())["cells"]
        said = {
            m.groups() for c in cells if c["cell_type"] == "markdown" for m in CLOSING.finditer("".join(c["source"]))
        }
        assert said <= {(str(n.minutes), str(n.run_seconds))}, f"notebook {n.number} says {said}"
