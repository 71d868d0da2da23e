"""Exercises of notebook 07 (performance): a benchmark report's speed-up, the KV cache's size; and its self-check."""

import copy
import json

import torch

from ...checks.values import is_number
from ...modeling import QWenVLConfig
from ...resources import data_dir
from . import exercise
from .nb03 import NOT_ATTEMPTED, whole_number
from .selfcheck import Question, right, wrong

REPORTS = ("h200-qwen-vl-chat-fp16.json", "cpu-toy-fp32.json")  # exercise 07.1: the committed benchmark runs


def _report(name: str) -> dict:
    """A committed benchmark report (data/benchmarks/`name`)."""
    return json.loads((data_dir() / "benchmarks" / name).read_text())


def made_up_report() -> dict:
    """The H200 report with its rows in reverse order and eager's decode speeds changed (a run that never happened):
    a function that reads the report it is given gets other ratios from it."""
    report = copy.deepcopy(_report(REPORTS[0]))
    report["results"].reverse()
    for row in report["results"]:
        if row["method"] == "eager":
            row["decode_tokens_per_s"] *= 1 + row["batch"] / 10
    return report


def _speed(report: dict, method: str, batch: int, key: str = "decode_tokens_per_s") -> float:
    """`key` of the row of `report` whose method is `method` ("eager" or "engine") and whose batch is `batch`."""
    return next(r[key] for r in report["results"] if r["method"] == method and r["batch"] == batch)


def _number(answer) -> float | None:
    """A real number (Python's or numpy's, a one-element tensor), or None for anything else."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1 and not answer.dtype.is_complex:
        answer = answer.item()
    return float(answer) if is_number(answer) else None


def _close(value: float, expected: float) -> bool:
    """`value` is `expected`, give or take rounding to two decimals."""
    return abs(value - expected) <= 0.006 + 1e-3 * abs(expected)


def _speedup_hint(value: float, report: dict, batch: int, h200: bool) -> str | None:
    """None when `value` is the engine's decode speed over eager's at `batch` in `report`; else what it is instead."""
    engine, eager = _speed(report, "engine", batch), _speed(report, "eager", batch)
    expected = engine / eager
    if _close(value, expected):
        return None
    if _close(value, 1 / expected):
        return "that is eager over the engine: divide the other way round"
    if _close(value, 100 * expected):
        return "that is a percentage: return the ratio itself (2.5, not 250)"
    if _close(value, engine - eager):
        return "that is the difference of the two speeds: divide one by the other"
    if value == int(expected):
        return "that is the ratio cut to a whole number: return it as it comes out of the division"
    if abs(value - expected) <= 0.05:
        return "close, but rounded too far: return the ratio unrounded, or to two decimals"
    pct = _speed(report, "engine", batch, "pct_of_limit") / _speed(report, "eager", batch, "pct_of_limit")
    if _close(value, pct):
        return "pct_of_limit is each method's share of the bandwidth limit: take decode_tokens_per_s"
    if _close(value, _speed(report, "engine", batch) / _speed(report, "engine", 1)):
        return "that compares the engine with itself at batch 1: compare it with eager, at the same batch"
    if _close(value, _speed(report, "eager", batch, "total_ms") / _speed(report, "engine", batch, "total_ms")):
        return "total_ms includes the prefill (the time to the first token): take decode_tokens_per_s"
    committed = _report(REPORTS[0])
    if not h200 and _close(value, _speed(committed, "engine", batch) / _speed(committed, "eager", batch)):
        return (
            "that is the committed H200 run's ratio, for a report whose numbers differ: read them from the report "
            "your function is given, not from a file or from the notebook's output"
        )
    batches = {r["batch"] for r in report["results"]}
    if any(_close(value, _speed(report, "engine", b) / _speed(report, "eager", b)) for b in batches - {batch}):
        return "that is the ratio at another batch: take the two rows whose batch is the one asked for"
    return "take decode_tokens_per_s of the engine's row and of eager's row whose batch is the one asked for"


@exercise("07.1", "a function: the qwenvl_lab engine's decode speed over eager's at a batch, from a benchmark report")
def engine_over_eager(function):
    """function(report, batch) -> engine's decode tokens/s over eager's at `batch`, on every batch of the committed
    reports and of a made-up one (to two decimals)."""
    if not callable(function):
        return "give a function (report, batch) -> the ratio, such as my_speedup"
    cases = [(_report(name), name == REPORTS[0]) for name in REPORTS] + [(made_up_report(), False)]
    for report, h200 in cases:
        for batch in sorted({r["batch"] for r in report["results"]}):
            try:
                result = function(copy.deepcopy(report), batch)
            except NotImplementedError:
                return NOT_ATTEMPTED
            if result is None:
                return NOT_ATTEMPTED
            value = _number(result)
            if value is None:
                return f"return a number (a ratio, such as 2.5), got {type(result).__name__}"
            hint = _speedup_hint(value, report, batch, h200)
            if hint is not None:
                return hint
    return None


@exercise("07.2", "bytes of Qwen-VL-Chat's float16 KV cache for 4 requests of up to 2048 tokens")
def kv_cache_bytes(answer):
    """2 (K and V) × layers × requests × tokens × hidden × 2 bytes."""
    answer, config = whole_number(answer), QWenVLConfig()
    if answer is None:
        return "give a whole number of bytes (an int)"
    values = 2 * config.num_hidden_layers * 4 * 2048 * config.hidden_size  # K and V of every layer, request, token
    expected = 2 * values  # 2 bytes a float16 number
    if answer == expected:
        return None
    wrong_counts = {
        values: "that is half of it: keys and values both, at 2 bytes a float16 number",  # K or V alone, or 1 byte
        2 * expected: "that is float32's size: float16 takes 2 bytes a number",
        expected // 4: "that is one request's cache: the question asks for 4",
        expected // config.num_hidden_layers: "that is one layer's cache: every layer keeps its own keys and values",
        expected // (4 * 2048): "that is one token's keys and values: count every token of every request",
        expected * 8: "that counts bits: a byte is 8 of them",
        expected * 3072 // 2048: "the requests hold up to 2048 tokens, prompt and answer together",
    }
    if answer in wrong_counts:
        return wrong_counts[answer]
    if answer in (expected // 2**30, expected // 10**9, round(expected / 10**9)):
        return "that is in GiB or GB: give the number of bytes"
    if abs(answer - expected) <= expected // 10:
        return "near, but not exact: give the exact number of bytes, not a rounded one"
    return "count K and V, for every layer, every request and every token, hidden_size numbers each, 2 bytes each"


def SELF_CHECK():
    """Notebook 07's self-check: the right options computed from the committed H200 report."""
    report = _report(REPORTS[0])
    at_8 = _speed(report, "engine", 8) / _speed(report, "engine", 1)
    return (
        Question(
            f"On the H200 the engine decodes {at_8:.1f}× as many tokens per second at batch 8 as at batch 1. Why so "
            "close to 8×?",
            (
                right(
                    "a decode step reads every weight once for the whole batch, and reading the weights takes the time",
                    "while decoding is bound by memory bandwidth, 8 requests cost about what one costs",
                ),
                wrong(
                    "the 8 requests share one prompt table",
                    "each request brings its own rows, a few MB against 14 GB of weights read every step",
                ),
                wrong(
                    "CUDA graphs are used only from batch 8 on",
                    "the engine replays a step as a CUDA graph at every batch size in the report",
                ),
            ),
        ),
        Question(
            "What sets the bandwidth limit of a decode step?",
            (
                wrong("the number of requests in the batch", "the weights are read once for the whole batch"),
                right(
                    "the bytes of weights a step reads over the GPU's memory bandwidth",
                    f"{report['model']['weight_bytes_per_token'] / 1e9:.1f} GB at {report['bandwidth']['gb_per_s']:.0f} "
                    "GB/s in the committed run",
                ),
                wrong(
                    "the answer's length",
                    "that sets how many steps there are, not how short a step can be",
                ),
            ),
        ),
        Question(
            "The engine's first token comes no sooner than eager's. Why?",
            (
                right(
                    "its prefill is plain PyTorch; its CUDA graphs and Triton kernels cover decoding",
                    "the time to the first token is the prefill's",
                ),
                wrong(
                    "it runs the vision tower first",
                    "both methods receive the same prompt table, made before the clock starts",
                ),
                wrong(
                    "it decodes more slowly than eager",
                    "its decode tokens/s are several times eager's in the same report",
                ),
            ),
        ),
        Question(
            "Why is the engine's peak memory higher than eager's?",
            (
                wrong("it keeps a second copy of the weights", "it reads the same weights in place"),
                right(
                    "it allocates its KV cache for the build limits up front",
                    "max_batch_size × max_seq_len, whatever the requests need",
                ),
                wrong("its prompt table holds every picture it has seen", "each request's table is used and dropped"),
            ),
        ),
    )
