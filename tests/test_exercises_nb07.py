"""Notebook 07's exercise checks: right answers written two ways pass, plausible wrong ones get a hint that does not
give the answer away, stubs are 'not attempted yet'."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

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


def speedup_at_batch_4(report, batch):
    return speedup(report, 4)  # ignores `batch`


def logits_by_features(model, input_ids, pixel_values):
    images = model.get_image_features(pixel_values=pixel_values).pooler_output
    texts = model.get_text_features(input_ids=input_ids).pooler_output
    return model.logit_scale.exp() * F.normalize(images, dim=-1) @ F.normalize(texts, dim=-1).T


def logits_by_hand(model, input_ids, pixel_values):
    """The towers and projections called one by one, the norms divided out in a loop."""
    with torch.no_grad():
        images = model.visual_projection(model.vision_model(pixel_values=pixel_values).pooler_output)
        texts = model.text_projection(model.text_model(input_ids=input_ids).pooler_output)
        out = torch.empty(len(images), len(texts))
        for i, image in enumerate(images):
            for t, text in enumerate(texts):
                out[i, t] = torch.dot(image, text) / (image.norm() * text.norm())
        return out * float(np.exp(model.logit_scale.item()))


def cosine_only(model, input_ids, pixel_values):
    return logits_by_features(model, input_ids, pixel_values) / model.logit_scale.exp()


def log_scale(model, input_ids, pixel_values):
    return logits_by_features(model, input_ids, pixel_values) / model.logit_scale.exp() * model.logit_scale


def unnormalised(model, input_ids, pixel_values):
    images = model.get_image_features(pixel_values=pixel_values).pooler_output
    texts = model.get_text_features(input_ids=input_ids).pooler_output
    return model.logit_scale.exp() * images @ texts.T


def texts_by_pictures(model, input_ids, pixel_values):
    return logits_by_features(model, input_ids, pixel_values).T  # logits_per_text


def logits_in_numpy(model, input_ids, pixel_values):
    with torch.no_grad():
        images = model.get_image_features(pixel_values=pixel_values).pooler_output.numpy()
        texts = model.get_text_features(input_ids=input_ids).pooler_output.numpy()
    images /= np.linalg.norm(images, axis=-1, keepdims=True)
    texts /= np.linalg.norm(texts, axis=-1, keepdims=True)
    return np.exp(model.logit_scale.item()) * images @ texts.T


def the_whole_model(model, input_ids, pixel_values):
    return model(input_ids=input_ids, pixel_values=pixel_values).logits_per_image  # not the towers apart


def unwritten(model, input_ids, pixel_values):
    raise NotImplementedError


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
    ("07.3", logits_by_features, True, "correct"),
    ("07.3", logits_by_hand, True, "correct"),
    ("07.3", logits_in_numpy, True, "correct"),
    ("07.3", the_whole_model, False, "called apart"),
    ("07.3", cosine_only, False, "cosine alone"),
    ("07.3", log_scale, False, "stored as a logarithm"),
    ("07.3", unnormalised, False, "normalise each projection"),
    ("07.3", texts_by_pictures, False, "other way round"),
    ("07.3", unwritten, False, "not attempted yet"),
    ("07.3", lambda model, input_ids, pixel_values: None, False, "not attempted yet"),
]


@pytest.mark.parametrize("key, answer, right, message", CASES)
def test_the_checks_accept_right_answers_and_hint_at_wrong_ones(key, answer, right, message):
    result = check(key, answer)
    assert bool(result) is right and message in result.message
    if not right and key == "07.2":
        assert f"{answer}" not in result.message  # the hint does not repeat the wrong number as an answer
    if key == "07.1":
        assert f"{speedup(H200, 4):.2f}" not in result.message
