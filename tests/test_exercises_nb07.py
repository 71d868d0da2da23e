"""Notebook 07's exercise checks accept the right answers and hint, without the answer, at typical wrong ones."""

import json

from qwenvl_lab.exercises import check
from qwenvl_lab.modeling import QWenVLConfig
from qwenvl_lab.resources import data_dir


def test_the_engine_over_eager_ratio():
    h200 = json.loads((data_dir() / "benchmarks" / "h200-qwen-vl-chat-fp16.json").read_text())
    speed = {r["method"]: r["decode_tokens_per_s"] for r in h200["results"] if r["batch"] == 4}
    ratio = speed["engine"] / speed["eager"]
    assert check("07.1", ratio)
    wrong = check("07.1", 1 / ratio)
    assert not wrong and "divide the other way round" in wrong.message and f"{ratio:.2f}" not in wrong.message
    assert "give a number" in check("07.1", "4.8").message


def test_the_kv_cache_bytes():
    chat = QWenVLConfig()
    right = 2 * chat.num_hidden_layers * 4 * 2048 * chat.hidden_size * 2
    assert check("07.2", right)
    half = check("07.2", right // 2)
    assert "half" in half.message and str(right) not in half.message
    assert not check("07.2", right * 2) and not check("07.2", 1.5)


def test_the_count_accuracy_is_recomputed_not_typed():
    assert "between 0 and 1" in check("07.3", 97).message
    assert not check("07.3", 0.123)
    assert "not attempted" in check("07.3", None).message
