"""Notebook 13's exercise checks: right answers written in different ways pass, plausible wrong ones get a hint that
names the mistake without giving the answer away, stubs are 'not attempted yet'."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import CLIPModel

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check


@pytest.fixture(autouse=True)
def only_notebook_13(monkeypatch):
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb13",))


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


def softmax_over_texts(model, input_ids, pixel_values):
    return logits_by_features(model, input_ids, pixel_values).softmax(dim=-1)  # probabilities, not logits


def first_picture_only(model, input_ids, pixel_values):
    return logits_by_features(model, input_ids, pixel_values)[:1]


def the_class_forward(model, input_ids, pixel_values):
    return CLIPModel.forward(model, input_ids=input_ids, pixel_values=pixel_values).logits_per_image  # the whole model


RIGHT_KINDS = {
    "a": "demonstration",
    "b": "source",
    "c": "measured",
    "d": "not checkable here",
    "e": "demonstration",
    "f": "measured",
}


def kinds(**changes):
    return {**RIGHT_KINDS, **changes}


CASES = [
    # (exercise, answer, right, a fragment of the message)
    ("13.1", logits_by_features, True, "correct"),
    ("13.1", logits_by_hand, True, "correct"),
    ("13.1", logits_in_numpy, True, "correct"),
    ("13.1", the_whole_model, False, "called apart"),
    ("13.1", the_class_forward, False, "called apart"),
    ("13.1", cosine_only, False, "cosine alone"),
    ("13.1", log_scale, False, "stored as a logarithm"),
    ("13.1", unnormalised, False, "normalise each projection"),
    ("13.1", texts_by_pictures, False, "other way round"),
    ("13.1", softmax_over_texts, False, "scale × the cosine"),
    ("13.1", first_picture_only, False, "one logit per picture and text"),
    ("13.1", unwritten, False, "not attempted yet"),
    ("13.1", lambda model, input_ids, pixel_values: None, False, "not attempted yet"),
    ("13.2", RIGHT_KINDS, True, "correct"),
    ("13.2", {f"({k.upper()})": f" {v.capitalize()} " for k, v in RIGHT_KINDS.items()}, True, "correct"),
    ("13.2", kinds(a="measured"), False, "refusing its own input"),
    ("13.2", kinds(e="measured"), False, "agreeing with itself"),
    ("13.2", kinds(a="source", e="source"), False, "quotes no upstream lines"),
    ("13.2", kinds(b="measured"), False, "runs nothing"),
    ("13.2", kinds(c="demonstration"), False, "code this project did not write"),
    ("13.2", kinds(f="source"), False, "counts the file's pieces"),
    ("13.2", kinds(d="measured"), False, "nothing can measure"),
    ("13.2", kinds(d="source"), False, "ask whose code or lines"),
    ("13.2", dict.fromkeys(RIGHT_KINDS, "measured"), False, "(a)"),
    ("13.2", {k: v for k, v in RIGHT_KINDS.items() if k != "f"}, False, "(f) still missing"),
    ("13.2", {**RIGHT_KINDS, "g": "source"}, False, "letters a to f"),
    ("13.2", kinds(c="evidence"), False, "each kind is one of"),
    ("13.2", list(RIGHT_KINDS.values()), False, "give a dict"),
]


@pytest.mark.parametrize("key, answer, right, message", CASES)
def test_the_checks_accept_right_answers_and_hint_at_wrong_ones(key, answer, right, message):
    result = check(key, answer)
    assert bool(result) is right and message in result.message, result.message


def test_a_wrong_kind_is_named_without_the_right_one():
    for letter, kind in RIGHT_KINDS.items():
        for other in {"measured", "source", "not checkable here", "demonstration"} - {kind}:
            message = check("13.2", kinds(**{letter: other})).message
            assert f"({letter})" in message and f"'{kind}'" not in message, message
