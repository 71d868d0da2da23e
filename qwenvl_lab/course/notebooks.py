"""The course's notebooks in reading order: the one list the exercises, self-checks, map, copier and site read, and
the one source of each notebook's study time and run time that the welcome, the README and the workshop plan quote."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Notebook:
    """One notebook of the course: its number, file stem, title, whether it is on the core path, what a learner does
    in it, its study time and its run time."""

    number: str  # "04"
    stem: str  # "04_prompt_table": notebooks/04_prompt_table.ipynb
    title: str
    core: bool  # a step of the mechanism (the workshop's day); else a deep dive a learner may take or skip
    about: str  # what a learner does in it, one line
    minutes: int  # study time: `python tools/study_time.py` counts it (tests/test_study_time.py checks it does)
    run_seconds: int  # a clean top-to-bottom run on a 2-core CPU, kernel start included: its CPU time

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
    Notebook("00", "00_welcome", "Welcome", True, "the map of the pipeline with real shapes; check your setup", 15, 10),
    Notebook(
        "01", "01_tokenizing", "Tokenizing", True,
        "`from_list_format`, chatml, the special tokens, a picture's 256-id span", 40, 15,
    ),
    Notebook(
        "02", "02_locating_img_pos", "Locating img_pos", True,
        "`img_pos` `[N, 3]` for a batch, with a `locate_img_pos` of your own", 40, 15,
    ),
    Notebook(
        "03", "03_fake_prompt_ids", "Fake prompt ids", True,
        "fake ids from 151936 in every span, written by you; a batch numbered run.py's way", 35, 15,
    ),
    Notebook(
        "04", "04_prompt_table", "The prompt table", True,
        "the lookup with `tasks` by hand on ten ids, then `input_vit`, `ptuning_setup` and the real vocabulary", 45, 15,
    ),
    Notebook(
        "05", "05_building_the_engine", "Building the engine", True,
        "build limits, the engine's prompt-table inputs, what it refuses; TensorRT-LLM in 2026", 35, 15,
    ),
    Notebook(
        "06", "06_generating_text", "Generating text", True,
        "`generate_for_qwenvl`, the answer cut and decoded, greedy decoding by hand; the capstone: the whole pipeline", 45, 15,
    ),
    Notebook(
        "07", "07_performance", "Performance", False,
        "eager against the engine on your machine, the committed GPU run, the bandwidth limit; weight-only INT8 and "
        "article 2's precision table", 70, 20,
    ),
    Notebook(
        "08", "08_troubleshooting", "Troubleshooting", False,
        "the errors users of Qwen-VL on TensorRT-LLM meet, reproduced and explained; KV-cache reuse and the wrong picture; "
        "which stage made two answers differ", 140, 30,
    ),
    Notebook(
        "09", "09_the_visual_vocabulary_today", "The visual vocabulary today", False,
        "the same picture through today's engines' placeholder ids, bit for bit; TensorRT-LLM in 2026", 100, 15,
    ),
    Notebook(
        "10", "10_batching_in_the_two_runtimes", "Batching in the two runtimes", False,
        "run.py's one table and the C++ executor's blocks, with their sources; `tasks` per token; KV-cache reuse", 75, 20,
    ),
    Notebook(
        "11", "11_sampling_chat_and_grounding", "Sampling, chat and grounding", False,
        "what run.py samples with, `top_p` and temperature, beams, stop words, a streamed chat, boxes", 55, 30,
    ),
    Notebook(
        "12", "12_the_tensorrt_paths", "The TensorRT paths", False,
        "TensorRT-LLM in 2026; ONNX and the vision plan, the checkpoint and tensor parallelism, `trtllm-build`", 35, 15,
    ),
    Notebook(
        "13", "13_the_articles_claims", "The articles' claims", False,
        "every claim of the two articles with its evidence and verdict; the measured ones measured", 65, 40,
    ),
)  # fmt: skip
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


def course_table(core: bool) -> str:
    """The core path's notebooks (or the deep dives) as a Markdown table, linked from a notebook in notebooks/: what
    a learner does, the study time, the run time and the solutions."""
    rows = ["| notebook | what you do | study time | runs in | solutions |", "|---|---|---|---|---|"]
    for n in (n for n in NOTEBOOKS if n.core == core):
        solutions = f"[{n.number}]({n.solutions})" if n in with_exercises() else "—"
        rows.append(
            f"| [{n.number} · {n.title}]({n.file}) | {n.about} | {n.minutes} min | {n.run_seconds} s | {solutions} |"
        )
    return "\n".join(rows)
