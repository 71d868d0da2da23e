"""Notebook 12's exercise checks: right answers written in several ways pass, and the plausible wrong ones get a hint
that does not give the answer away."""

from pathlib import Path

import pytest

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check
from qwenvl_lab.engine import BuildConfig
from qwenvl_lab.trtllm.build_command import trtllm_build_command


@pytest.fixture(autouse=True)
def only_notebook_12(monkeypatch):
    """Load notebook 12's checks only: the other notebooks' exercise modules play no part here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb12",))


def command(images=2, output="my_engine", checkpoint=Path("work") / "trtllm_checkpoint", **limits):
    """trtllm_build_command for exercise 12.1's engine, with some of its limits changed."""
    config = {
        "max_batch_size": 4,
        "max_input_len": 1024,
        "max_seq_len": 2048,
        "max_prompt_embedding_table_size": 2048,
        "dtype": "float16",
    } | limits
    return trtllm_build_command(checkpoint, output, BuildConfig(**config), images)


def changed(flag, value=None):
    """Exercise 12.1's right command with one flag's value changed, or the flag left out (value None)."""
    parts = command()
    at = parts.index(flag)
    if value is None:
        del parts[at : at + 2]
    else:
        parts[at + 1] = value
    return parts


def reordered():
    """Exercise 12.1's right command with its flag and value pairs in reverse order."""
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


CASES = [  # (exercise, answer, right?, words the hint must hold)
    ("12.1", command(), True, ()),
    ("12.1", tuple(command(output="/tmp/work/my_engine", checkpoint="/elsewhere/trtllm_checkpoint")), True, ()),
    ("12.1", reordered(), True, ()),  # the same flags in another order: trtllm-build reads them by name
    ("12.1", command(max_seq_len=3072), False, ["--max_seq_len"]),
    ("12.1", command(dtype="float32"), False, ["--gemm_plugin"]),
    ("12.1", command(max_beam_width=3), False, ["--max_beam_width"]),
    ("12.1", command(images=1, max_prompt_embedding_table_size=1024), False, ["too few rows"]),
    ("12.1", command(images=3, max_prompt_embedding_table_size=3072, max_input_len=1024), False, ["more rows than"]),
    ("12.1", changed("--max_prompt_embedding_table_size"), False, ["too few rows"]),
    ("12.1", changed("--output_dir", "engine"), False, ["my_engine"]),
    ("12.1", changed("--output_dir", "/tmp/not_my_engine"), False, ["my_engine"]),
    ("12.1", command(checkpoint="/tmp/wrong_ckpt"), False, ["trt_checkpoint", "--checkpoint_dir"]),
    ("12.1", changed("--checkpoint_dir"), False, ["--checkpoint_dir"]),
    ("12.1", by_hand(), False, ["--checkpoint_dir"]),
    ("12.1", by_hand()[:1] + ["--checkpoint_dir", "trtllm_checkpoint"] + by_hand()[1:], False, ["my_engine"]),
    ("12.1", changed("--gpt_attention_plugin"), False, ["leaves out --gpt_attention_plugin"]),
    ("12.1", changed("--remove_input_padding"), False, ["leaves out --remove_input_padding"]),
    ("12.1", changed("--remove_input_padding", "disable"), False, ["--remove_input_padding differ"]),
    ("12.1", changed("--gpt_attention_plugin", "float32"), False, ["--gpt_attention_plugin differ"]),
    ("12.1", command() + ["--max_beam_width", "1"], False, ["each flag once"]),
    ("12.1", " ".join(command()), False, ["list of strings"]),
    ("12.1", command()[1:], False, ["whole list"]),
    ("12.2", "transformer.layers.1.mlp.fc.weight", True, ()),
    ("12.2", "transformer.layers.1.mlp.gate.weight", False, ["w1 goes"]),
    ("12.2", "transformer.h.1.mlp.fc.weight", False, ["transformer.layers.N"]),
    ("12.2", "transformer.layers.1.mlp.w2.weight", False, ["the MLP input"]),
    ("12.2", "transformer.layers.2.mlp.fc.weight", False, ["the MLP input"]),
]
SECRETS = {"12.1": [], "12.2": ["mlp.fc"]}


@pytest.mark.parametrize("key, answer, ok, words", CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(key, answer, ok, words, assert_verdict):
    assert_verdict(check(key, answer), ok, words, SECRETS[key])


def test_untouched_answers_are_not_attempted():
    for key in ("12.1", "12.2"):
        assert str(check(key, None)) == f"exercise {key}: not attempted yet — replace None with your answer"
