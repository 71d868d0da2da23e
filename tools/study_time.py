"""`python tools/study_time.py` — a notebook's study time, counted from what a learner does in it.

A learner reads the prose and the code, writes down each "predict, then run" answer, solves each exercise and answers
the self-check. The minutes are counted from the notebook (and its solutions notebook) at fixed rates, so the README
and the workshop plan quote one figure that changes when a notebook does. They are a model of a learner, not a timing
of one: an instructor's first class is the check.
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from qwenvl_lab.course.notebooks import NOTEBOOKS
from qwenvl_lab.resources import checkout_dir

WORDS_PER_MINUTE = 150  # careful reading of technical English with inline code
CODE_LINES_PER_MINUTE = 10  # reading a code cell before running it
PREDICTION_MINUTES = 2  # writing down an answer before the reveal
EXERCISE_MINUTES = 2  # reading an exercise and checking the answer…
MINUTES_PER_SOLUTION_LINE = 0.5  # …and writing it: its solution's lines of code, at 2 a minute
SELF_CHECK_MINUTES = 1  # one multiple-choice question
PREDICT = re.compile(r"Predict, then run", re.IGNORECASE)
CHECK = re.compile(r"""check\(\s*["'](\d\d\.\d+)["']""")


@dataclass(frozen=True)
class StudyTime:
    """What a learner meets in one notebook, and the minutes it takes at this module's rates."""

    notebook: str
    words: int
    code_lines: int
    predictions: int
    exercises: int
    solution_lines: int
    self_check: int

    @property
    def minutes(self) -> float:
        """Reading, predicting, solving and self-checking, in minutes."""
        return (
            self.words / WORDS_PER_MINUTE
            + self.code_lines / CODE_LINES_PER_MINUTE
            + self.predictions * PREDICTION_MINUTES
            + self.exercises * EXERCISE_MINUTES
            + self.solution_lines * MINUTES_PER_SOLUTION_LINE
            + self.self_check * SELF_CHECK_MINUTES
        )

    @property
    def rounded(self) -> int:
        """The minutes rounded to the nearest 5 (at least 5), as the README and the workshop plan quote them."""
        return max(5, 5 * round(self.minutes / 5))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


CLOSING = re.compile(r"^[)\]}]+[,:]?$")  # a line the formatter gives to closing brackets: nothing new to read


def _code_lines(source: str) -> int:
    """Lines of code a learner reads: not blank, not a comment, not an nbval marker, not closing brackets alone (so
    that the formatter's wrapping of a call adds its arguments' lines, not its brackets')."""
    return sum(
        1
        for line in source.splitlines()
        if (text := line.strip()) and not text.startswith("#") and not CLOSING.match(text)
    )


def solution_lines(solutions: Path | None) -> dict[str, int]:
    """Exercise key → lines of code of the solution cell that checks it (what a learner writes to answer it)."""
    if solutions is None or not solutions.exists():
        return {}
    lines = {}
    for cell in _cells(solutions):
        source = "".join(cell["source"])
        keys = CHECK.findall(source) if cell["cell_type"] == "code" else []
        for key in keys:
            lines[key] = lines.get(key, 0) + _code_lines(source) // len(keys)
    return lines


def study_time(notebook: Path, self_check: int = 0) -> StudyTime:
    """The study time of `notebook`, with the solution lines of notebooks/solutions/NN_solutions.ipynb beside it."""
    cells = _cells(notebook)
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    keys = sorted({key for source in code for key in CHECK.findall(source)})
    solved = solution_lines(notebook.parent / "solutions" / f"{notebook.name[:2]}_solutions.ipynb")
    return StudyTime(
        notebook.stem,
        len(re.findall(r"\S+", prose)),
        sum(_code_lines(source) for source in code if "# your code" not in source),
        len(PREDICT.findall(prose)),
        len(keys),
        sum(solved.get(key, 0) for key in keys),
        self_check,
    )


def main(argv=None) -> int:
    """Print the study time of each notebook given (default: the course's), one line each, and the total."""
    parser = argparse.ArgumentParser(prog="python tools/study_time.py", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: the course's, in order)")
    args = parser.parse_args(argv)
    from qwenvl_lab.course.exercises import selfcheck  # noqa: PLC0415 — torch loads once the arguments are read

    if not args.notebooks and checkout_dir() is None:
        parser.error("name the notebooks: this installation is not a clone of the course")
    notebooks = args.notebooks or [checkout_dir() / "notebooks" / n.file for n in NOTEBOOKS]
    having = set(selfcheck.notebooks())
    total = 0
    print("notebook                          words  code  predict  exercises  solution lines  self-check  minutes")
    for path in notebooks:
        questions = len(selfcheck.questions(path.name[:2])) if path.name[:2] in having else 0
        time = study_time(path, questions)
        total += time.rounded
        print(
            f"{time.notebook:32} {time.words:6} {time.code_lines:5} {time.predictions:8} {time.exercises:10} "
            f"{time.solution_lines:15} {time.self_check:11} {time.rounded:8}"
        )
    print(f"{'total':32} {total:>71}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
