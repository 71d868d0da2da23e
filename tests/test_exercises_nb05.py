"""Notebook 05's exercise checks: right answers written in several ways pass, and the plausible wrong ones get a hint
that does not give the answer away."""

from pathlib import Path

import numpy as np
import pytest
import torch

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check
from qwenvl_lab.engine import BuildConfig
from qwenvl_lab.trtllm.build_command import trtllm_build_command


@pytest.fixture(autouse=True)
def only_notebook_05(monkeypatch):
    """Load notebook 05's checks only: the other notebooks' exercise modules play no part here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb05",))


def command(images=2, output="my_engine", checkpoint=Path("work") / "trtllm_checkpoint", **limits):
    """trtllm_build_command for exercise 05.2's engine, with some of its limits changed."""
    config = {
        "max_batch_size": 4,
        "max_input_len": 1024,
        "max_seq_len": 2048,
        "max_prompt_embedding_table_size": 2048,
        "dtype": "float16",
    } | limits
    return trtllm_build_command(checkpoint, output, BuildConfig(**config), images)


def changed(flag, value=None):
    """Exercise 05.2's right command with one flag's value changed, or the flag left out (value None)."""
    parts = command()
    at = parts.index(flag)
    if value is None:
        del parts[at : at + 2]
    else:
        parts[at + 1] = value
    return parts


def reordered():
    """Exercise 05.2's right command with its flag and value pairs in reverse order."""
    parts = command(output=Path("work") / "my_engine")
    pairs = list(zip(parts[1::2], parts[2::2]))[::-1]
    return ["trtllm-build"] + [str(part) for pair in pairs for part in pair]


def by_hand():
    """A hand-written list with the question's limits, but no checkpoint, attention plugin or packed input."""
    flags = {
        "--output_dir": "/tmp/not_my_engine",
        "--gemm_plugin": "float16",
        "--max_batch_size": "4",
        "--max_input_len": "1024",
        "--max_seq_len": "2048",
        "--max_prompt_embedding_table_size": "2048",
    }
    return ["trtllm-build"] + [part for pair in flags.items() for part in pair]


PACKED = [0] * 287 + [1] * 289
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
    ("05.2", command(), True, ()),
    ("05.2", tuple(command(output="/tmp/work/my_engine", checkpoint="/elsewhere/trtllm_checkpoint")), True, ()),
    ("05.2", reordered(), True, ()),  # the same flags in another order: trtllm-build reads them by name
    ("05.2", command(max_seq_len=3072), False, ["--max_seq_len"]),
    ("05.2", command(dtype="float32"), False, ["--gemm_plugin"]),
    ("05.2", command(max_beam_width=3), False, ["--max_beam_width"]),
    ("05.2", command(images=1, max_prompt_embedding_table_size=1024), False, ["too few rows"]),
    ("05.2", command(images=3, max_prompt_embedding_table_size=3072, max_input_len=1024), False, ["more rows than"]),
    ("05.2", changed("--max_prompt_embedding_table_size"), False, ["too few rows"]),
    ("05.2", changed("--output_dir", "engine"), False, ["my_engine"]),
    ("05.2", changed("--output_dir", "/tmp/not_my_engine"), False, ["my_engine"]),
    ("05.2", command(checkpoint="/tmp/wrong_ckpt"), False, ["trt_checkpoint", "--checkpoint_dir"]),
    ("05.2", changed("--checkpoint_dir"), False, ["--checkpoint_dir"]),
    ("05.2", by_hand(), False, ["--checkpoint_dir"]),
    ("05.2", by_hand()[:1] + ["--checkpoint_dir", "trtllm_checkpoint"] + by_hand()[1:], False, ["my_engine"]),
    ("05.2", changed("--gpt_attention_plugin"), False, ["leaves out --gpt_attention_plugin"]),
    ("05.2", changed("--remove_input_padding"), False, ["leaves out --remove_input_padding"]),
    ("05.2", changed("--remove_input_padding", "disable"), False, ["--remove_input_padding differ"]),
    ("05.2", changed("--gpt_attention_plugin", "float32"), False, ["--gpt_attention_plugin differ"]),
    ("05.2", command() + ["--max_beam_width", "1"], False, ["each flag once"]),
    ("05.2", " ".join(command()), False, ["list of strings"]),
    ("05.2", command()[1:], False, ["whole list"]),
    ("05.3", "transformer.layers.1.mlp.fc.weight", True, ()),
    ("05.3", "transformer.layers.1.mlp.gate.weight", False, ["w1 goes"]),
    ("05.3", "transformer.h.1.mlp.fc.weight", False, ["transformer.layers.N"]),
    ("05.3", "transformer.layers.1.mlp.w2.weight", False, ["the MLP input"]),
    ("05.3", "transformer.layers.2.mlp.fc.weight", False, ["the MLP input"]),
    ("05.4", PACKED, True, ()),
    ("05.4", torch.tensor(PACKED, dtype=torch.int32), True, ()),
    ("05.4", np.repeat([0, 1], [287, 289]), True, ()),
    ("05.4", [0, 1], False, ["one per token"]),
    ("05.4", [0] * 287 + [1] * 288, False, ["576 tokens"]),
    ("05.4", [1] * 287 + [0] * 289, False, ["batch position"]),
    ("05.4", [float(t) for t in PACKED], False, ["list of ints"]),
    ("05.4", 576, False, ["list of ints"]),
    ("05.5", [0, 0, 0, 1], True, ()),
    ("05.5", torch.tensor([0, 0, 0, 1]), True, ()),
    ("05.5", [0, 1], False, ["every beam"]),
    ("05.5", [0, 1, 1, 1], False, ["one token per beam"]),
    ("05.5", [0, 0, 1], False, ["one token per beam"]),
    ("05.5", ["a", "b"], False, ["list of ints"]),
    ("05.5", "0001", False, ["list of ints"]),
]
SECRETS = {"05.1": ["3072"], "05.2": [], "05.3": ["mlp.fc"], "05.4": [], "05.5": ["0, 0, 0, 1"]}


@pytest.mark.parametrize("key, answer, ok, words", CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(key, answer, ok, words, assert_verdict):
    assert_verdict(check(key, answer), ok, words, SECRETS[key])


def test_untouched_answers_are_not_attempted():
    for key in ("05.1", "05.2", "05.3", "05.4", "05.5"):
        assert str(check(key, None)) == f"exercise {key}: not attempted yet — replace None with your answer"
