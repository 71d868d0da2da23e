"""Notebook 10's exercise checks: right answers written in several ways pass, and the plausible wrong ones (a block
sized by the wrong batch size, the wrong convention, one table per request, two calls padded and stacked) get a hint
that names the mistake and does not give the answer away."""

import re

import numpy as np
import pytest
import torch

from qwenvl_lab.chat import ModelAsRunner, make_prompt
from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check, nb10
from qwenvl_lab.prompt_table import per_request_tables, single_table_batch
from qwenvl_lab.resources import images_dir
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, IM_END_ID


@pytest.fixture(autouse=True)
def only_notebook_10(monkeypatch):
    """Load notebook 10's checks only."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb10",))


class Eager:
    """An answer computed from the course's eager model when the test runs."""

    def __init__(self, make, label):
        self.make, self.label = make, label

    def __repr__(self):
        return self.label


def two_requests(course, convention="session", order=(0, 1), tasks=None):
    """output_ids of the two 10.6 questions from the eager model: one call in a convention, or one call per request
    (a list), or two calls padded with the pad id and stacked ("stacked")."""
    runner, vision, tokenizer, model = course
    questions = [nb10.TWO_QUESTIONS[k] for k in order]
    contexts = [torch.tensor(make_prompt(tokenizer, q, [images_dir() / p])[1])[None] for p, q in questions]
    with torch.inference_mode():
        input_vit = vision.encode([images_dir() / p for p, _ in questions])
    eager = ModelAsRunner(model)
    if convention == "session":
        batch = torch.nn.utils.rnn.pad_sequence([c[0] for c in contexts], batch_first=True, padding_value=ENDOFTEXT_ID)
        fake_ids, table, _, rows = single_table_batch(batch, input_vit, runner.vocab_size)
        ids = [fake_ids[k, : c.shape[1]] for k, c in enumerate(contexts)]
        return eager.generate(ids, prompt_table=table, prompt_tasks="0,0", task_vocab_size=rows, max_new_tokens=24)
    own = [per_request_tables(c, input_vit[k : k + 1], runner.vocab_size) for k, c in enumerate(contexts)]
    ids, tables = [o[0][0] for o in own], torch.stack([o[1] for o in own])
    if convention in ("two calls", "stacked"):
        calls = [eager.generate([i], prompt_table=t[None], max_new_tokens=24) for i, t in zip(ids, tables)]
        if convention == "two calls":
            return calls
        width = max(c.shape[2] for c in calls)
        return torch.cat([torch.nn.functional.pad(c, (0, width - c.shape[2]), value=IM_END_ID) for c in calls])
    return eager.generate(ids, prompt_table=tables, prompt_tasks=tasks, max_new_tokens=24)


CASES = [  # (exercise, answer, right?, words the hint must hold)
    ("10.1", 1, True, ()),
    ("10.1", torch.tensor(1), True, ()),
    ("10.1", 8, False, ["whole table", "runtime's max batch size"]),
    ("10.1", 256, False, ["share of rows"]),
    ("10.1", 2048, False, ["table's rows", "pictures"]),
    ("10.1", 0, False, ["no request could send a picture"]),
    ("10.1", 2, False, ["course engine", "max_batch_size 4", "among 8 positions"]),  # notebook 05's engine's block
    ("10.1", 4, False, ["4 pictures need 1024 rows", "the table over the runtime's max batch size"]),
    ("10.1", 3, False, ["768 rows", "does a request's block"]),
    ("10.1", 20, False, ["more than the whole table holds"]),
    ("10.1", "1", False, ["whole number"]),
    ("10.1", True, False, ["whole number"]),
    ("10.1", 1.0, False, ["whole number"]),
    ("10.2", 516, True, ()),
    ("10.2", 4, False, ["request 0's block"]),
    ("10.2", 517, False, ["off by one"]),
    ("10.2", 515, False, ["off by one"]),
    ("10.2", 260, False, ["not 256"]),
    ("10.2", 151940, False, ["subtract"]),
    ("10.2", 297, False, ["not 151643"]),
    ("10.2", 1000, False, ["recount"]),
    ("10.2", "516", False, ["whole number"]),
    ("10.3", (1280, 2048), True, ()),  # 5 pictures × 256 rows; position 2 × 8192 / 8
    ("10.3", [1280, torch.tensor(2048)], True, ()),
    ("10.3", (torch.tensor(1280), 2048), True, ()),
    ("10.3", (1280, 1536), False, ["the in-flight block", "fullest request", "max_batch_size"]),  # 2 × 768
    ("10.3", (1280, 1024), False, ["the in-flight block", "keeps its position"]),  # position among pictured ones
    ("10.3", (1280, 4096), False, ["not by the requests that bring pictures", "keeps its position"]),  # 8192/2 × 1
    ("10.3", (1280, 768), False, ["not sized by the fullest request", "keeps its position"]),
    ("10.3", (1280, 512), False, ["in run.py's one table", "position in the step's batch"]),
    ("10.3", (1280, 3072), False, ["count from 0"]),
    ("10.3", (1280, 5460), False, ["not by the requests of this step"]),  # 2 × 8192 / 3
    ("10.3", (1280, 0), False, ["not the first of the batch"]),
    ("10.3", (8192, 2048), False, ["the python-session table", "whole buffer"]),
    ("10.3", (768, 2048), False, ["the python-session table", "every picture of the batch"]),
    ("10.3", (2304, 2048), False, ["gives no request a block"]),
    ("10.3", (1280, 2000), False, ["recount"]),
    ("10.3", 1280, False, ["as a pair"]),
    ("10.3", (1280, "2048"), False, ["two whole numbers"]),
    ("10.4", [0] * 287 + [1] * 289, True, ()),
    ("10.4", torch.tensor([0] * 287 + [1] * 289), True, ()),
    ("10.4", [0, 1], False, ["one task per request"]),
    ("10.4", [0] * 287 + [1] * 288, False, ["575 values"]),
    ("10.4", [1] * 287 + [0] * 289, False, ["batch position"]),
    ("10.4", "0,1", False, ["a list of ints"]),
    ("10.4", np.repeat([0, 1], [287, 289]), True, ()),
    ("10.4", [float(t) for t in [0] * 287 + [1] * 289], False, ["list of ints"]),
    ("10.4", 576, False, ["list of ints"]),
    ("10.5", [0, 0, 0, 1], True, ()),
    ("10.5", [0, 1], False, ["every beam"]),
    ("10.5", [0, 1, 1, 1], False, ["one token per beam"]),
    ("10.5", None, False, ["not attempted yet"]),
    ("10.5", torch.tensor([0, 0, 0, 1]), True, ()),
    ("10.5", [0, 0, 1], False, ["one token per beam"]),
    ("10.5", ["a", "b"], False, ["list of ints"]),
    ("10.5", "0001", False, ["list of ints"]),
    ("10.6", Eager(two_requests, "one call, python session"), True, ()),
    ("10.6", Eager(lambda c: {"output_ids": two_requests(c)}, "return_dict"), True, ()),
    (
        "10.6",
        Eager(lambda c: two_requests(c, "stacked"), "two calls, padded and stacked"),
        False,
        ["numbered on its own"],
    ),
    (
        "10.6",
        Eager(lambda c: two_requests(c, "per request"), "one call, a table per request"),
        False,
        ["from vocab_size again"],
    ),
    ("10.6", Eager(lambda c: two_requests(c, "two calls"), "two calls"), False, ["one result per call"]),
    ("10.6", Eager(lambda c: two_requests(c, order=(1, 0)), "swapped"), False, ["swapped"]),
    ("10.6", Eager(lambda c: two_requests(c, "per request", tasks="0,0"), "both read table 0"), False, ["on its own"]),
    ("10.6", Eager(lambda c: two_requests(c)[:1], "the first request only"), False, ["one call for both requests"]),
    ("10.6", Eager(lambda c: two_requests(c)[:, :, :-1], "a column short"), False, ["longest prompt + max_new_tokens"]),
    ("10.6", "Yellow.", False, ["output_ids tensor"]),
]
SECRETS = {"10.1": [1], "10.2": [516], "10.3": [1280, 2048], "10.4": [], "10.5": [], "10.6": []}  # numbers a hint hides


@pytest.mark.parametrize("key, answer, ok, words", CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(course, key, answer, ok, words, assert_verdict):
    if isinstance(answer, Eager):
        answer = answer.make(course)
    result = check(key, answer)
    assert_verdict(result, ok, words)
    if ok:
        return
    shown = result.message.replace(repr(answer), "")
    for secret in SECRETS[key]:
        assert re.search(rf"(?<![\d.]){secret}(?!\d)", shown) is None, f"the hint gives the answer away: {result}"
    if key == "10.5":
        assert "[0, 0, 0, 1]" not in shown


def test_two_calls_padded_and_stacked_are_one_calls_output_in_the_per_request_layout(course):
    """What 10.6 must tell apart: stacking two calls' rows gives exactly a per-request one-call output, so only the
    numbering across the batch (run.py's) shows that one call asked both."""
    assert torch.equal(two_requests(course, "stacked"), two_requests(course, "per request"))
    assert not torch.equal(two_requests(course, "stacked"), two_requests(course))
