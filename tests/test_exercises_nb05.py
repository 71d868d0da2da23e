"""Notebook 05's exercise checks: right answers pass, wrong ones get a hint that does not give the answer away."""

import pytest
import torch

from qwenvl_lab import exercises
from qwenvl_lab.engine import BuildConfig
from qwenvl_lab.exercises import check
from qwenvl_lab.trtllm.build_command import trtllm_build_command


@pytest.fixture(autouse=True)
def only_notebook_05(monkeypatch):
    """Load notebook 05's checks only: the other notebooks' exercise modules play no part here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb05",))


def test_untouched_answers_are_not_attempted():
    for key in ("05.1", "05.2", "05.3", "05.4", "05.5"):
        assert str(check(key, None)) == f"exercise {key}: not attempted yet — replace None with your answer"


def test_table_size():
    assert check("05.1", 3072)  # 256 rows × 3 pictures × 4 requests
    for wrong, hint in ((768, "one request's share"), (1024, "one picture per request"), (2048, "count the rows")):
        result = check("05.1", wrong)
        assert not result and hint in str(result) and "3072" not in str(result)
    assert "an int" in str(check("05.1", 3072.0)) and "an int" in str(check("05.1", True))


def test_build_command(tmp_path):
    def command(images=2, **limits):
        config = {
            "max_batch_size": 4,
            "max_input_len": 1024,
            "max_seq_len": 2048,
            "max_prompt_embedding_table_size": 2048,
            "dtype": "float16",
        } | limits
        return trtllm_build_command(tmp_path / "ckpt", tmp_path / "my_engine", BuildConfig(**config), images)

    assert check("05.2", command())
    assert "--max_seq_len" in str(check("05.2", command(max_seq_len=3072)))
    assert "--gemm_plugin" in str(check("05.2", command(dtype="float32")))
    assert "too few rows" in str(check("05.2", command(images=1, max_prompt_embedding_table_size=1024)))
    elsewhere = command()
    elsewhere[elsewhere.index("--output_dir") + 1] = str(tmp_path / "engine")
    assert "my_engine" in str(check("05.2", elsewhere))
    assert "list of strings" in str(check("05.2", " ".join(command())))
    assert "whole list" in str(check("05.2", command()[1:]))


def test_weight_name():
    assert check("05.3", "transformer.layers.1.mlp.fc.weight")
    assert "w1 goes" in str(check("05.3", "transformer.layers.1.mlp.gate.weight"))
    assert "transformer.layers.N" in str(check("05.3", "transformer.h.1.mlp.fc.weight"))
    hint = str(check("05.3", "transformer.layers.1.mlp.w2.weight"))
    assert "not yet" in hint and "mlp.fc" not in hint


def test_packed_tasks():
    right = [0] * 287 + [1] * 289
    assert check("05.4", right) and check("05.4", torch.tensor(right, dtype=torch.int32))
    assert "one per token" in str(check("05.4", [0, 1]))
    assert "576 tokens" in str(check("05.4", [0] * 287 + [1] * 288))
    assert "batch position" in str(check("05.4", [1] * 287 + [0] * 289))
    assert "list of ints" in str(check("05.4", 576))


def test_generation_step_tasks():
    assert check("05.5", [0, 0, 0, 1])
    assert "every beam" in str(check("05.5", [0, 1]))
    hint = str(check("05.5", [0, 1, 1, 1]))
    assert "one token per beam" in hint and "0, 0, 0, 1" not in hint
    assert "list of ints" in str(check("05.5", ["a", "b"]))


def test_text_is_not_a_list_of_ints():
    assert "list of ints" in str(check("05.5", "0001"))
