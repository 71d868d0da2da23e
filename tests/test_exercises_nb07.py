"""Notebook 07's exercise checks: right answers written two ways pass, plausible wrong ones get a hint that does not
give the answer away, stubs are 'not attempted yet'."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from qwenvl_lab import exercises
from qwenvl_lab.exercises import check
from qwenvl_lab.modeling import QWenVLConfig
from qwenvl_lab.resources import data_dir


@pytest.fixture(autouse=True)
def only_notebook_07(monkeypatch):
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb07",))


H200 = json.loads((data_dir() / "benchmarks" / "h200-qwen-vl-chat-fp16.json").read_text())
SPEED = {r["method"]: r for r in H200["results"] if r["batch"] == 4}
RATIO = SPEED["engine"]["decode_tokens_per_s"] / SPEED["eager"]["decode_tokens_per_s"]
CHAT = QWenVLConfig()
KV = 2 * CHAT.num_hidden_layers * 4 * 2048 * CHAT.hidden_size * 2  # bytes


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


def unwritten(model, input_ids, pixel_values):
    raise NotImplementedError


CASES = [
    # (exercise, answer, right, a fragment of the message)
    ("07.1", RATIO, True, "correct"),
    (
        "07.1",
        np.float32(SPEED["engine"]["decode_tokens_per_s"]) / np.float32(SPEED["eager"]["decode_tokens_per_s"]),
        True,
        "correct",
    ),
    ("07.1", 1 / RATIO, False, "divide the other way round"),
    ("07.1", SPEED["engine"]["throughput_vs_batch1"], False, "with itself at batch 1"),
    (
        "07.1",
        H200["results"][4]["decode_tokens_per_s"] / H200["results"][0]["decode_tokens_per_s"],
        False,
        "rows whose batch is 4",
    ),
    ("07.1", "5.2", False, "give a number"),
    ("07.2", KV, True, "correct"),
    ("07.2", np.int64(2) * CHAT.num_hidden_layers * 4 * 2048 * 4096 * 2, True, "correct"),  # a numpy integer
    ("07.2", KV // 2, False, "half of it"),
    ("07.2", KV * 2, False, "float32's size"),
    ("07.2", KV // 4, False, "one request's cache"),
    ("07.2", 2 * CHAT.num_hidden_layers * 4 * 2048 * CHAT.num_attention_heads * 2, False, "count K and V"),
    ("07.2", float(KV), False, "whole number"),
    ("07.3", logits_by_features, True, "correct"),
    ("07.3", logits_by_hand, True, "correct"),
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
    if not right and key != "07.3":
        assert f"{answer}" not in result.message  # the hint does not repeat the wrong number as an answer
    if key == "07.1":
        assert f"{RATIO:.2f}" not in result.message or right
