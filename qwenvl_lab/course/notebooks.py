"""The course's notebooks in reading order: the one list the exercises, self-checks, map, copier and site read."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Notebook:
    """One notebook of the course: its number, its file's stem, its title, and whether it is on the core path."""

    number: str  # "04"
    stem: str  # "04_prompt_table": notebooks/04_prompt_table.ipynb
    title: str
    core: bool  # a step of the mechanism (the workshop's day); else a deep dive a learner may take or skip

    @property
    def file(self) -> str:
        """The notebook's file name, e.g. "04_prompt_table.ipynb"."""
        return f"{self.stem}.ipynb"

    @property
    def solutions(self) -> str:
        """Its solutions notebook's path under notebooks/, e.g. "solutions/04_solutions.ipynb"."""
        return f"solutions/{self.number}_solutions.ipynb"

    @property
    def exercise_module(self) -> str:
        """The module of qwenvl_lab.course.exercises that registers its exercises and self-check, e.g. "nb04"."""
        return f"nb{self.number}"


NOTEBOOKS = (
    Notebook("00", "00_welcome", "Welcome", True),
    Notebook("01", "01_tokenizing", "Tokenizing", True),
    Notebook("02", "02_locating_img_pos", "Locating img_pos", True),
    Notebook("03", "03_fake_prompt_ids", "Fake prompt ids", True),
    Notebook("04", "04_prompt_table", "The prompt table", True),
    Notebook("05", "05_building_the_engine", "Building the engine", True),
    Notebook("06", "06_generating_text", "Generating text", True),
    Notebook("07", "07_performance", "Performance", False),
    Notebook("08", "08_troubleshooting", "Troubleshooting", False),
    Notebook("09", "09_the_visual_vocabulary_today", "The visual vocabulary today", False),
    Notebook("13", "13_the_articles_claims", "The articles' claims", False),
)
BY_NUMBER = {notebook.number: notebook for notebook in NOTEBOOKS}
EXERCISES_DIR = Path(__file__).parent / "exercises"


def notebook(number) -> Notebook:
    """The notebook numbered `number` ("04", "4" or 4); a number the course has not is refused, listing those it has."""
    key = f"{int(number):02d}" if str(number).strip().isdigit() else str(number)
    if key not in BY_NUMBER:
        raise ValueError(f"the course has no notebook {number!r}; its notebooks are {', '.join(BY_NUMBER)}")
    return BY_NUMBER[key]


def core_path() -> tuple[Notebook, ...]:
    """The core path: the welcome and the mechanism's steps, in order."""
    return tuple(n for n in NOTEBOOKS if n.core)


def with_exercises() -> tuple[Notebook, ...]:
    """The notebooks that have an exercise module (qwenvl_lab/course/exercises/nbNN.py)."""
    return tuple(n for n in NOTEBOOKS if (EXERCISES_DIR / f"{n.exercise_module}.py").is_file())
