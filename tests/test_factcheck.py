"""The fact checks' measurements and verdicts: measured verdicts held to the recorded ones, shapes from a real or meta
forward pass, pooling, answers with any number of rows per picture, like-for-like timings of the three injections and
of the gather, INT8 rounding, feature drift, memory per dtype."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from qwenvl_lab.chat import ModelAsRunner, ask_batch, make_prompt
from qwenvl_lab.course import factcheck as fc
from qwenvl_lab.engine import BuildConfig, ModelRunner
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.modeling import QWEN_VL_CHAT_VISUAL
from qwenvl_lab.resources import images_dir
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_START_ID
from qwenvl_lab.toy import TOY_DIR, load_course_model
from qwenvl_lab.toy.shapes import make_dataset
from qwenvl_lab.vision import preprocess_images


@pytest.fixture(scope="module")
def toy_model():
    """The shipped toy model (trained: its answers are right)."""
    return load_course_model(TOY_DIR).requires_grad_(False)


def test_verdict_labels_come_from_the_measurement():
    assert fc.verdict("C2", True, "e").verdict == "confirmed"
    assert fc.verdict("C2", False, "e").verdict == "corrected"
    assert fc.verdict("C9", np.float64(0.5) > 0.3, "e").verdict == "confirmed"  # numpy's bool, from pandas values
    assert fc.verdict("C6", False, "e", sourced=False).verdict == "not reproduced"
    with pytest.raises(TypeError, match="bool"):
        fc.verdict("C2", "yes", "e")  # a typed string is not a measurement
    with pytest.raises(ValueError, match="verdict must be one of"):
        fc.Verdict("C1", "maybe", "e")


def test_verdict_range_counts_the_settings_inside():
    assert fc.verdict_range("C8", 3, 5, {4: 3.8, 8: 4.9}, "batch").verdict == "confirmed"
    partly = fc.verdict_range("C8", 3, 5, {2: 1.96, 4: 3.76, 8: 7.03}, "batch")
    assert (
        partly.verdict == "partly confirmed"
        and "only at batch 4" in partly.evidence
        and "7.03 at batch 8" in partly.evidence
    )
    assert fc.verdict_range("C8", 3, 5, {2: 1.9, 8: 7.0}, "batch").verdict == "corrected"
    with pytest.raises(ValueError):
        fc.verdict_range("C8", 5, 3, {2: 4.0}, "batch")


def test_verdict_parts_needs_every_part_measured_and_holding_to_confirm():
    assert fc.verdict_parts("C19", {"memory": True, "quality": True}, "e").verdict == "confirmed"
    partly = fc.verdict_parts("C19", {"memory": True, "quality of the real model": None}, "e")
    assert partly.verdict == "partly confirmed" and "quality of the real model: not checkable here" in partly.evidence
    assert fc.verdict_parts("C19", {"memory": True, "quality": False}, "e").verdict == "partly confirmed"
    assert fc.verdict_parts("C19", {"memory": False, "quality": None}, "e").verdict == "corrected"
    assert fc.verdict_parts("C19", {"memory": np.float64(2.0) > 1.0}, "e").verdict == "confirmed"
    with pytest.raises(ValueError, match="no part was measured"):
        fc.verdict_parts("C19", {"quality": None}, "e")
    with pytest.raises(ValueError, match="True, False or None"):
        fc.verdict_parts("C19", {"memory": "yes"}, "e")


def test_settle_holds_a_measured_verdict_to_the_recorded_one():
    assert fc.settle(fc.verdict("C5", True, "flat")).id == "C5"  # recorded: confirmed, measured
    with pytest.raises(ValueError, match="records 'confirmed'"):
        fc.settle(fc.verdict("C5", False, "grows with the table"))
    with pytest.raises(ValueError, match="rests on source evidence"):
        fc.settle(fc.verdict("C12", True, "a measurement of a source claim"))
    with pytest.raises(KeyError):
        fc.settle(fc.verdict("C99", True, "no such claim"))


def test_meta_tower_traces_qwen_vl_chat_shapes_without_memory():
    tower = fc.meta_tower(QWEN_VL_CHAT_VISUAL)
    assert {p.device.type for p in tower.parameters()} == {"meta"}  # the numpy-built pos_embed too
    pixels = preprocess_images([images_dir() / "red_circle.png"], 448)
    shapes = fc.tower_shapes(tower, torch.cat([pixels, pixels]))  # real pixels, moved to the meta device
    assert shapes == {
        "pixels": (2, 3, 448, 448),
        "patches": (2, 1024, 1664),
        "ViT output": (2, 1024, 1664),
        "input_vit": (2, 256, 4096),
    }
    small = fc.tower_shapes(
        fc.meta_tower(dict(QWEN_VL_CHAT_VISUAL, image_size=224)), torch.empty(1, 3, 224, 224, device="meta")
    )
    assert small["patches"] == (1, 256, 1664) and small["input_vit"] == (1, 256, 4096)  # still 256 rows


def test_tower_shapes_of_a_real_forward_and_the_hooks_are_removed(tiny_model):
    tower = tiny_model.transformer.visual
    shapes = fc.tower_shapes(tower, torch.zeros(1, 3, 56, 56))
    assert shapes["patches"] == (1, 16, 64) and shapes["ViT output"] == (1, 16, 64)
    assert shapes["input_vit"] == (1, 256, 128)
    assert not tower.conv1._forward_hooks and not tower.transformer._forward_hooks


def test_pool_2x2_averages_blocks_of_the_grid():
    grid = torch.arange(16.0).reshape(1, 16, 1)  # a 4 × 4 grid, row-major
    assert fc.pool_2x2(grid).flatten().tolist() == [2.5, 4.5, 10.5, 12.5]
    back = fc.pooled_back(grid)
    assert back.shape == (1, 16, 1)
    assert back.reshape(4, 4).tolist() == [
        [2.5, 2.5, 4.5, 4.5],
        [2.5, 2.5, 4.5, 4.5],
        [10.5, 10.5, 12.5, 12.5],
        [10.5, 10.5, 12.5, 12.5],
    ]
    assert fc.pool_2x2(torch.randn(3, 256, 8)).shape == (3, 64, 8)
    for rows in (15, 9):  # not a square; a square of odd side
        with pytest.raises(ValueError, match="square grid of even side"):
            fc.pool_2x2(torch.zeros(1, rows, 2))


def test_span_prompt_puts_a_span_of_any_length_between_the_tags(tokenizer):
    full = make_prompt(tokenizer, "How many shapes are there?", ["picture1.png"])[1]
    for rows in (256, 64):
        ids = fc.span_prompt(tokenizer, "How many shapes are there?", rows)
        start, end = ids.index(IMAGE_START_ID), ids.index(IMAGE_END_ID)
        assert end - start - 1 == rows
        assert ids[: start + 1] == full[: start + 1] and ids[end:] == full[full.index(IMAGE_END_ID) :]


def test_answers_with_rows_match_the_chat_path_and_the_toy_answers_right(toy_model, tokenizer):
    examples = make_dataset(3, 3, kinds=("what", "color", "count"))
    pictures = [e.pictures()[0] for e in examples]
    with torch.inference_mode():
        input_vit = toy_model.transformer.visual.encode(pictures)  # [3, 256, H]
    answers = fc.answers_with_rows(toy_model, tokenizer, examples, input_vit)
    reference = ask_batch(
        ModelAsRunner(toy_model),
        None,
        tokenizer,
        [([p], e.question) for p, e in zip(pictures, examples)],
        input_vit=input_vit,
        max_new_tokens=16,
    )
    assert answers == reference
    assert fc.accuracy(answers, examples) == 1.0
    assert fc.accuracy(["wrong"] * 3, examples) == 0.0
    assert len(fc.answers_with_rows(toy_model, tokenizer, examples, fc.pool_2x2(input_vit))) == 3  # 64-id spans run
    with pytest.raises(ValueError, match="one-picture examples"):
        fc.answers_with_rows(toy_model, tokenizer, make_dataset(3, 1, kinds=("which",)), input_vit[:1])
    with pytest.raises(ValueError, match="one answer per example"):
        fc.accuracy(answers[:2], examples)


def test_int8_weights_round_the_language_model_and_count_its_bytes(tiny_model):
    quantized, sizes = fc.int8_weights(tiny_model)
    original, rounded = tiny_model.transformer.h[0].mlp.w1.weight, quantized.transformer.h[0].mlp.w1.weight
    scale = original.abs().amax(dim=1, keepdim=True) / 127
    assert not torch.equal(original, rounded) and ((original - rounded).abs() <= scale / 2 + 1e-7).all()
    assert torch.equal(quantized.transformer.visual.proj, tiny_model.transformer.visual.proj)  # the tower untouched
    assert torch.equal(quantized.transformer.visual.conv1.weight, tiny_model.transformer.visual.conv1.weight)
    linears = [m for n, m in tiny_model.named_modules() if isinstance(m, torch.nn.Linear) and "visual" not in n]
    numel, rows = sum(m.weight.numel() for m in linears), sum(m.weight.shape[0] for m in linears)
    assert sizes == {"int8": numel + 4 * rows, "float32": 4 * numel}


def test_feature_drift_measures_the_distance():
    a = torch.randn(2, 256, 8)
    assert fc.feature_drift(a, a) == {"max_abs": 0.0, "mean_abs": 0.0, "cosine": pytest.approx(1.0)}
    b = a.clone()
    b[0, 0, 0] += 0.5
    drift = fc.feature_drift(a, b)
    assert drift["max_abs"] == pytest.approx(0.5) and drift["mean_abs"] == pytest.approx(0.5 / a.numel())
    assert fc.feature_drift(a, -a)["cosine"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="same pictures"):
        fc.feature_drift(a, a[:1])


def test_the_bare_injections_and_the_checked_lookup_give_identical_embeddings(tiny_model, tokenizer, image_files):
    ids = torch.tensor([make_prompt(tokenizer, "What is it?", [str(image_files["red"]), str(image_files["noise"])])[1]])
    input_vit = torch.randn(2, 256, tiny_model.config.hidden_size)
    ways = fc.bare_injections(tiny_model, ids, input_vit)
    embeddings = {name: way() for name, way in ways.items()}
    (_, a, b), _ = locate_img_pos(ids).tolist()
    for name, embedded in embeddings.items():
        assert torch.equal(embedded[0, a + 1 : b], input_vit[0]), name  # the first picture's rows in its span
        assert torch.equal(embedded[0, a], tiny_model.transformer.wte.weight[IMAGE_START_ID]), name  # the tag kept
    seconds, identical = fc.injection_times(tiny_model, ids, input_vit, runs=2, length=3)
    assert identical
    assert set(seconds) == set(ways) | {"vocabulary gather alone", "prompt_tuning_embedding (with checks)"}


def test_gather_seconds_times_one_block_per_table(monkeypatch):
    timed = []

    def timed_runs(call, runs, length, device):  # what would be timed, run once (no time is measured here)
        timed.append(call().shape)
        return 0.25 * len(timed), 0.0

    monkeypatch.setattr(fc, "timed_runs", timed_runs)
    assert fc.gather_seconds([256, 1024], ids=256, hidden=8, runs=2, length=3) == {256: 0.25, 1024: 0.5}
    assert timed == [(256, 8), (256, 8)]  # one block of 256 rows from each table
    with pytest.raises(ValueError, match="cannot hold a block"):
        fc.gather_seconds([100], ids=256)


def test_engine_throughput_times_each_batch_of_one_picture_requests(monkeypatch, tiny_model):
    """What is timed, run once: the engine decoding 1 and 2 requests of one picture, 256 table rows each."""
    runner = ModelRunner.from_model(
        tiny_model,
        BuildConfig(max_batch_size=2, max_input_len=384, max_seq_len=400, max_prompt_embedding_table_size=512),
    )
    runs = []

    def measure(generate, requests, table, new_tokens, repeats, device, baseline):
        runs.append((len(requests), table.shape[0], tuple(generate(requests, table, new_tokens).shape)))
        return {"decode_tokens_per_s": 10.0 * len(requests)}

    monkeypatch.setattr(fc, "measure", measure)
    assert fc.engine_throughput(runner, tiny_model, batches=(1, 2), new_tokens=4, repeats=1) == {1: 10.0, 2: 20.0}
    assert runs == [(1, 256, (1, 4)), (2, 512, (2, 4))]


def test_prefill_seconds_times_one_forward_over_spans_of_any_length(monkeypatch, tiny_model, tokenizer):
    forwards = []

    def timed_runs(call, runs, length, device):
        forwards.append(call().logits.shape)
        return 0.5, 0.5

    monkeypatch.setattr(fc, "timed_runs", timed_runs)
    input_vit = torch.randn(2, 64, tiny_model.config.hidden_size)  # spans of 64 rows
    assert fc.prefill_seconds(tiny_model, tokenizer, "What is it?", input_vit, runs=1) == 0.5
    assert forwards == [(2, 1, tiny_model.config.vocab_size)]  # the last position's logits of both prompts


@pytest.mark.slow
def test_memory_by_dtype_halves_the_model_in_float16(tiny_checkpoint):
    """Measured in fresh processes: the resident memory the weights take, not their element sizes."""
    memory = fc.memory_by_dtype(["float32", torch.float16], tiny_checkpoint)
    assert set(memory) == {"float32", "float16"}
    full, half = memory["float32"], memory["float16"]
    assert full["parameters"] == half["parameters"] > 0
    assert full["model"] >= full["parameters"] * 4 * 0.9  # the float32 weights are resident
    assert 0.4 < half["model"] / full["model"] < 0.6


def test_memory_by_dtype_refuses_bad_input_before_starting_processes(tmp_path, tiny_checkpoint):
    with pytest.raises(FileNotFoundError):
        fc.memory_by_dtype(["float16"], tmp_path / "nowhere")
    with pytest.raises(ValueError, match="dtype must be one of"):
        fc.memory_by_dtype(["int4"], tiny_checkpoint)


@pytest.mark.slow
def test_the_memory_child_needs_its_arguments():
    run = subprocess.run(
        [sys.executable, "-m", "qwenvl_lab.course.factcheck", "memory"], capture_output=True, text=True
    )
    assert (
        run.returncode != 0
        and "usage: python -m qwenvl_lab.course.factcheck table | memory DTYPE CHECKPOINT" in run.stderr
    )


def test_the_table_command_prints_the_claims_table(capsys):
    fc.main(["table"])
    assert capsys.readouterr().out == fc.claims_table() + "\n"
