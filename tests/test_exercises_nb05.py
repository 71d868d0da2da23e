"""Notebook 05's exercise checks: right answers written in several ways pass, and the plausible wrong ones (one
request's share of the table, the prompt alone for max_seq_len, limits larger than needed) get a hint that names the
mistake and does not give the answer away."""

import dataclasses

import numpy as np
import pytest
import torch

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check, nb05
from qwenvl_lab.engine import BuildConfig


@pytest.fixture(autouse=True)
def only_notebook_05(monkeypatch):
    """Load notebook 05's checks only: the other notebooks' exercise modules play no part here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb05",))


RIGHT = BuildConfig(max_batch_size=2, max_input_len=900, max_seq_len=1000, max_prompt_embedding_table_size=1536)


def changed(**limits):
    """Exercise 05.2's right BuildConfig with some limits changed."""
    return dataclasses.replace(RIGHT, **limits)


CASES = [  # (exercise, answer, right?, words the hint must hold)
    ("05.1", 3072, True, ()),  # 256 rows × 3 pictures × 4 requests
    ("05.1", np.int64(3072), True, ()),
    ("05.1", torch.tensor(3072), True, ()),
    ("05.1", 768, False, ["one request's share"]),
    ("05.1", 1024, False, ["one picture per request"]),
    ("05.1", 2048, False, ["count the rows"]),
    ("05.1", 3072.0, False, ["an int"]),
    ("05.1", True, False, ["an int"]),
    ("05.1", 4096, False, ["more rows than needed"]),  # a valid engine, but not the smallest
    ("05.1", 6144, False, ["more rows than needed"]),
    ("05.2", RIGHT, True, ()),
    ("05.2", BuildConfig(2, 900, 1000, 256 * 3 * 2, "float32", 1), True, ()),
    ("05.2", changed(max_batch_size=3, max_prompt_embedding_table_size=2304), False, ["requests the engine answers"]),
    ("05.2", changed(max_prompt_embedding_table_size=768), False, ["one request's pictures", "every request"]),
    ("05.2", changed(max_prompt_embedding_table_size=512), False, ["one picture per request"]),
    ("05.2", changed(max_prompt_embedding_table_size=0), False, ["cannot see a picture"]),
    ("05.2", changed(max_prompt_embedding_table_size=2048), False, ["more rows than needed"]),
    ("05.2", changed(max_prompt_embedding_table_size=1024), False, ["too few rows"]),
    ("05.2", changed(max_input_len=1000), False, ["max_input_len", "nothing more"]),
    ("05.2", changed(max_input_len=800), False, ["max_input_len", "longest prompt must fit"]),
    ("05.2", changed(max_seq_len=900), False, ["prompt and its answer together"]),
    ("05.2", changed(max_seq_len=2048), False, ["no more"]),
    ("05.2", changed(max_seq_len=999), False, ["longest prompt plus the longest answer"]),
    ("05.2", changed(dtype="float16"), False, ["float32"]),
    ("05.2", changed(max_beam_width=3), False, ["one beam"]),
    ("05.2", dataclasses.asdict(RIGHT), False, ["BuildConfig(…)"]),
    ("05.2", 1536, False, ["BuildConfig(…)"]),
]
SECRETS = {"05.1": ["3072"], "05.2": ["1536", "1000"]}


@pytest.mark.parametrize("key, answer, ok, words", CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(key, answer, ok, words, assert_verdict):
    assert_verdict(check(key, answer), ok, words, SECRETS[key])


def test_the_service_fits_the_smallest_engine():
    """05.2's answer is what the package computes: the service's prompts (3 pictures of 258 ids) fit its max_input_len."""
    assert nb05.service_build() == RIGHT and 3 * 258 < RIGHT.max_input_len


def test_untouched_answers_are_not_attempted():
    for key in ("05.1", "05.2"):
        assert str(check(key, None)) == f"exercise {key}: not attempted yet — replace None with your answer"
