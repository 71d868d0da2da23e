"""Notebook 07's exercises: reading the committed H200 run, the KV cache's size, the toy model's count accuracy."""

import json

from ..modeling import QWenVLConfig
from ..resources import data_dir
from ..tokenizing import load_tokenizer
from ..toy import load_course_model
from ..toy.evaluate import evaluate
from ..toy.shapes import make_dataset
from . import exercise


def _h200(method: str, batch: int) -> dict:
    """The committed H200 run's result of `method` ("eager" or "engine") at `batch`."""
    report = json.loads((data_dir() / "benchmarks" / "h200-qwen-vl-chat-fp16.json").read_text())
    return next(r for r in report["results"] if r["method"] == method and r["batch"] == batch)


def _number(answer) -> float | None:
    return float(answer) if isinstance(answer, (int, float)) and not isinstance(answer, bool) else None


@exercise("07.1", "how many times eager's decode speed the qwenvl_lab engine reaches at batch 4 on the H200")
def engine_over_eager(answer):
    """The ratio of decode tokens per second, engine over eager, at batch 4 (within 0.01)."""
    value = _number(answer)
    if value is None:
        return "give a number (a ratio, such as 2.5)"
    expected = _h200("engine", 4)["decode_tokens_per_s"] / _h200("eager", 4)["decode_tokens_per_s"]
    if abs(value - 1 / expected) < 0.01:
        return "that is eager over the engine: divide the other way round"
    if abs(value - expected) >= 0.01:
        return "take decode_tokens_per_s of both methods in the rows whose batch is 4"
    return None


@exercise("07.2", "bytes of Qwen-VL-Chat's float16 KV cache for 4 requests of up to 2048 tokens")
def kv_cache_bytes(answer):
    """2 (K and V) × layers × requests × tokens × hidden × 2 bytes."""
    if isinstance(answer, bool) or not isinstance(answer, int):
        return "give a whole number of bytes"
    config = QWenVLConfig()
    numbers = 2 * config.num_hidden_layers * 4 * 2048 * config.hidden_size  # K and V of every layer, request, token
    if answer == numbers:  # K or V alone in float16, or both at one byte a number
        return "that is half of it: keys and values both, at 2 bytes a float16 number"
    if answer != 2 * numbers:
        return "count K and V, for every layer, every request and every token, hidden_size numbers each, 2 bytes each"
    return None


@exercise("07.3", "the toy model's accuracy on 24 held-out count questions")
def count_accuracy(answer):
    """evaluate(...)['overall'] on make_dataset(1, 24, kinds=("count",))."""
    value = _number(answer)
    if value is None or not 0 <= value <= 1:
        return "give the accuracy as a number between 0 and 1"
    expected = evaluate(load_course_model(), load_tokenizer(), examples=make_dataset(1, 24, kinds=("count",)))[
        "overall"
    ]
    if abs(value - expected) > 1e-9:
        return "pass make_dataset(1, 24, kinds=('count',)) as examples and read the 'overall' entry"
    return None
