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
            ("code", "x = 1\n\n# a comment\ny = 2\n"),
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
        4,  # the code a learner reads: no blank line, no comment, not the cell left for the answer
        2,
        2,  # 09.1 and 09.2, each once however often it is checked
        5,  # 3 lines of 09.1's solution cell + 2 of 09.2's
        3,
    )
    assert time.minutes == pytest.approx(150 / 150 + 4 / 10 + 2 * 2 + 2 * 2 + 5 * 0.5 + 3)
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


def quoted_minutes(text: str, row: str) -> dict[str, int]:
    """Notebook number → the study minutes a table of `text` quotes (rows matching `row`, minutes last)."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(row + r".*\| (\d+) min \|\s*$", text, re.MULTILINE)}


def test_the_readme_and_the_workshop_plan_quote_the_counted_times():
    readme = quoted_minutes((REPO / "README.md").read_text(), r"^\| \[(\d\d) · ")
    workshop = quoted_minutes((REPO / "docs" / "workshop.md").read_text(), r"^\| (\d\d) · [^|]+\| \d")
    assert readme == workshop and sorted(readme) == sorted(n.number for n in NOTEBOOKS)
    having = set(selfcheck.notebooks())
    for number in readme:
        notebook = next((REPO / "notebooks").glob(f"{number}_*.ipynb"))
        questions = len(selfcheck.questions(number)) if number in having else 0
        assert st.study_time(notebook, questions).rounded == readme[number], (
            f"notebook {number}: `python tools/study_time.py` counts another time than the README quotes"
        )
