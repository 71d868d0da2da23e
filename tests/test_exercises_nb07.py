"""Notebook 07's exercise checks: right answers written two ways pass, plausible wrong ones get a hint that does not
give the answer away, stubs are 'not attempted yet'."""

import json

import numpy as np
import pytest
import torch

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check
from qwenvl_lab.modeling import QWenVLConfig
from qwenvl_lab.resources import data_dir


@pytest.fixture(autouse=True)
def only_notebook_07(monkeypatch):
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb07",))


H200 = json.loads((data_dir() / "benchmarks" / "h200-qwen-vl-chat-fp16.json").read_text())
CHAT = QWenVLConfig()
KV = 2 * CHAT.num_hidden_layers * 4 * 2048 * CHAT.hidden_size * 2  # bytes


def speedup(report, batch):
    speed = {r["method"]: r["decode_tokens_per_s"] for r in report["results"] if r["batch"] == batch}
    return speed["engine"] / speed["eager"]


def speedup_numpy(report, batch):
    """Vectorised over the rows, as a numpy float32, rounded to two decimals."""
    rows = [r for r in report["results"] if r["batch"] == batch]
    speeds = np.array([r["decode_tokens_per_s"] for r in rows], dtype=np.float32)
    engine = np.array([r["method"] == "engine" for r in rows])
    return np.round(speeds[engine][0] / speeds[~engine][0], 2)


def speedup_of_the_h200_run(report, batch):
    return speedup(H200, batch)  # reads the committed file, not the report it is given


def speedup_printed(report, batch):
    return {1: 5.36, 2: 5.46, 4: 5.18, 8: 4.39}[batch]  # notebook 07's printed ratios


def speedup_by_position(report, batch):
    k = [1, 2, 4, 8].index(batch)  # rows assumed in the H200 file's order: eager 1, 2, 4, 8, then the engine
    return report["results"][4 + k]["decode_tokens_per_s"] / report["results"][k]["decode_tokens_per_s"]


def row(report, method, batch):
    return next(r for r in report["results"] if r["method"] == method and r["batch"] == batch)


def engine_over_its_batch_1(report, batch):
    return row(report, "engine", batch)["decode_tokens_per_s"] / row(report, "engine", 1)["decode_tokens_per_s"]


def total_time_ratio(report, batch):
    return row(report, "eager", batch)["total_ms"] / row(report, "engine", batch)["total_ms"]


def pct_of_limit_ratio(report, batch):
    return row(report, "engine", batch)["pct_of_limit"] / row(report, "eager", batch)["pct_of_limit"]


def speed_difference(report, batch):
    return row(report, "engine", batch)["decode_tokens_per_s"] - row(report, "eager", batch)["decode_tokens_per_s"]


def ttft_ratio(report, batch):
    return row(report, "eager", batch)["ttft_ms"] / row(report, "engine", batch)["ttft_ms"]


def speedup_at_batch_4(report, batch):
    return speedup(report, 4)  # ignores `batch`


CASES = [
    # (exercise, answer, right, a fragment of the message)
    ("07.1", speedup, True, "correct"),
    ("07.1", speedup_numpy, True, "correct"),
    ("07.1", lambda report, batch: torch.tensor(speedup(report, batch)), True, "correct"),
    ("07.1", lambda report, batch: 1 / speedup(report, batch), False, "divide the other way round"),
    ("07.1", engine_over_its_batch_1, False, "with itself at batch 1"),
    ("07.1", total_time_ratio, False, "total_ms includes the prefill"),
    ("07.1", speedup_of_the_h200_run, False, "read them from the report"),
    ("07.1", speedup_printed, False, "read them from the report"),
    ("07.1", speedup_by_position, False, "take decode_tokens_per_s"),
    ("07.1", speedup_at_batch_4, False, "ratio at another batch"),
    ("07.1", lambda report, batch: round(speedup(report, batch), 1), False, "rounded too far"),
    ("07.1", lambda report, batch: int(speedup(report, batch)), False, "cut to a whole number"),
    ("07.1", lambda report, batch: 100 * speedup(report, batch), False, "a percentage"),
    ("07.1", pct_of_limit_ratio, False, "share of the bandwidth limit"),
    ("07.1", speed_difference, False, "difference of the two speeds"),
    ("07.1", ttft_ratio, False, "take decode_tokens_per_s"),
    ("07.1", 5.18, False, "give a function"),
    ("07.1", lambda report, batch: f"{speedup(report, batch):.2f}", False, "return a number"),
    ("07.1", lambda report, batch: None, False, "not attempted yet"),
    ("07.2", KV, True, "correct"),
    ("07.2", np.int64(2) * CHAT.num_hidden_layers * 4 * 2048 * 4096 * 2, True, "correct"),  # a numpy integer
    ("07.2", KV // 2, False, "half of it"),
    ("07.2", KV * 2, False, "float32's size"),
    ("07.2", KV // 4, False, "one request's cache"),
    ("07.2", 2 * CHAT.num_hidden_layers * 4 * 2048 * CHAT.num_attention_heads * 2, False, "count K and V"),
    ("07.2", float(KV), False, "whole number"),
    ("07.2", str(KV), False, "whole number"),
    ("07.2", KV // CHAT.num_hidden_layers, False, "one layer's cache"),
    ("07.2", KV // (4 * 2048), False, "one token's keys and values"),
    ("07.2", KV * 8, False, "counts bits"),
    ("07.2", KV * 3072 // 2048, False, "up to 2048 tokens"),
    ("07.2", 4, False, "in GiB or GB"),
    ("07.2", 4_000_000_000, False, "not a rounded one"),
    ("07.2", 2 * CHAT.num_hidden_layers * 4 * 2048 * 11008 * 2, False, "count K and V"),  # the MLP's width
]


@pytest.mark.parametrize("key, answer, right, message", CASES)
def test_the_checks_accept_right_answers_and_hint_at_wrong_ones(key, answer, right, message):
    result = check(key, answer)
    assert bool(result) is right and message in result.message
    if not right and key == "07.2":
        assert f"{answer}" not in result.message  # the hint does not repeat the wrong number as an answer
    if key == "07.1":
        assert f"{speedup(H200, 4):.2f}" not in result.message
