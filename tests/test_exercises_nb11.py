"""Notebook 11's exercise checks: right answers written in several ways pass, and the plausible wrong ones (the best
beam for the second, grid corners for pixels, the model's input size for the picture's) get a hint that does not give
the answer away."""

import re

import pytest
import torch

from qwenvl_lab.chat import ModelAsRunner, make_prompt
from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check, nb11
from qwenvl_lab.prompt_table import per_request_tables
from qwenvl_lab.resources import images_dir


@pytest.fixture(autouse=True)
def only_notebook_11(monkeypatch):
    """Load notebook 11's checks only."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb11",))


def beam(course, k):
    """Beam k of a 2-beam search on red_circle.png, from the eager model."""
    runner, vision, tokenizer, model = course
    pictures = [images_dir() / "red_circle.png"]
    ids = make_prompt(tokenizer, "图片里是什么？", pictures)[1]
    with torch.inference_mode():
        fake, table, _, rows = per_request_tables(torch.tensor(ids)[None], vision.encode(pictures), runner.vocab_size)
    out = ModelAsRunner(model).generate([fake[0]], prompt_table=table.view(1, rows, -1), max_new_tokens=24,
                                        num_beams=2, return_dict=True)  # fmt: skip
    row = out["output_ids"][0, k, len(ids) : int(out["sequence_lengths"][0, k])].tolist()
    return tokenizer.decode(row, skip_special_tokens=True)


BOX = tuple(int(v) for v in re.findall(r"[0-9]+", nb11.BOX_ANSWER.split("<box>")[1]))
ROUNDED = tuple((2 * c * 224 + 1000) // 2000 for c in BOX)  # half up, a 224-pixel picture
TRUNCATED = tuple(int(c / 1000 * 224) for c in BOX)  # as Qwen-VL's draw_bbox_on_latest_picture does it

CASES = [  # (exercise, answer, right?, words the hint must hold)
    ("11.1", lambda c: beam(c, 1), True, ()),
    ("11.1", lambda c: beam(c, 1) + "\n", True, ()),
    ("11.1", lambda c: beam(c, 0), False, ["best beam"]),
    ("11.1", "a blue square", False, ["sequence length"]),
    ("11.1", 3, False, ["a str"]),
    ("11.2", ROUNDED, True, ()),
    ("11.2", list(ROUNDED), True, ()),
    ("11.2", TRUNCATED, True, ()),
    ("11.2", BOX, False, ["0–1000 grid"]),
    ("11.2", tuple(round(c * 112 / 1000) for c in BOX), False, ["input size"]),
    ("11.2", tuple(v + 1 for v in ROUNDED), False, ["scale each corner"]),
    ("11.2", (ROUNDED[1], ROUNDED[0], ROUNDED[3], ROUNDED[2]), False, ["scale each corner"]),
    ("11.2", "(1, 2, 3, 4)", False, ["four ints"]),
]


@pytest.mark.parametrize("key, answer, ok, words", CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(course, key, answer, ok, words, assert_verdict):
    answer = answer(course) if callable(answer) else answer
    result = check(key, answer)
    assert_verdict(result, ok, words)
    if not ok:
        secrets = {"11.1": [beam(course, 1)], "11.2": [str(v) for v in ROUNDED + TRUNCATED if v > 9]}[key]
        for secret in secrets:
            assert secret not in result.message.removeprefix(f"exercise {key}"), f"the hint gives it away: {result}"
