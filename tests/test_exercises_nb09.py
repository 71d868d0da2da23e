"""Notebook 09's exercise checks accept right answers written in different ways and hint, without the answer, at
plausible wrong ones."""

import numpy as np
import pytest
import torch

import qwenvl_lab.exercises as exercises
from qwenvl_lab.exercises import check
from qwenvl_lab.placeholder_merge import fuse_input_embeds


@pytest.fixture(autouse=True)
def only_this_notebook(monkeypatch):
    """Load the checks of notebook 09 alone."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb09",))


def loop_fuse(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    """A learner's version: one position at a time."""
    if not mm_embeds:
        return input_ids, None
    rows = iter(torch.cat(list(mm_embeds)))
    image = [
        (int(i) in mm_token_ids.tolist()) if mm_token_ids is not None else int(i) >= embedding_layer.num_embeddings
        for i in input_ids
    ]
    out = [next(rows) if m else embedding_layer.weight[int(i)] for i, m in zip(input_ids, image)]
    return None, torch.stack(out)


def strict_greater(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    mask = input_ids > embedding_layer.num_embeddings  # misses the id vocab_size itself
    out = torch.empty(len(input_ids), embedding_layer.embedding_dim)
    out[~mask] = embedding_layer(input_ids[~mask])
    out[mask] = torch.cat(mm_embeds)
    return None, out


def ignores_mm_token_ids(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    return (
        fuse_input_embeds(embedding_layer, input_ids, mm_embeds)
        if input_ids.max() >= 50
        else (
            None,
            embedding_layer(input_ids),
        )
    )


def reversed_rows(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    kept, out = fuse_input_embeds(embedding_layer, input_ids, [torch.cat(mm_embeds).flip(0)], mm_token_ids)
    return kept, out


def only_the_embeddings(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    return fuse_input_embeds(embedding_layer, input_ids, mm_embeds, mm_token_ids)[1]


def in_place(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    kept, out = fuse_input_embeds(embedding_layer, input_ids, mm_embeds, mm_token_ids)
    input_ids[input_ids >= 50] = 0
    return kept, out


def empty_features_as_zeros(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    if not mm_embeds:
        return None, embedding_layer(input_ids)
    return fuse_input_embeds(embedding_layer, input_ids, mm_embeds, mm_token_ids)


def stub(embedding_layer, input_ids, mm_embeds, mm_token_ids=None): ...  # your code


RIGHT = [
    ("09.1", fuse_input_embeds),
    ("09.1", loop_fuse),
    ("09.2", 512),
    ("09.2", np.int64(512)),
    ("09.2", torch.tensor(512)),
    ("09.3", (151652, 151653, 151655)),
    ("09.3", [151652, 151653, 151655]),
    ("09.3", torch.tensor([151652, 151653, 151655])),
    ("09.4", 23),
    ("09.4", torch.tensor(23)),
]

WRONG = [  # (key, answer, what the hint must say, a number it must not give away)
    ("09.1", strict_greater, "vocab_size itself is already out of the vocabulary", None),
    ("09.1", ignores_mm_token_ids, "mm_token_ids given", None),
    ("09.1", reversed_rows, "in order", None),
    ("09.1", only_the_embeddings, "return a pair", None),
    ("09.1", in_place, "changed input_ids", None),
    ("09.1", empty_features_as_zeros, "(input_ids, None)", None),
    ("09.1", stub, "not attempted yet", None),
    ("09.1", "fuse_input_embeds", "pass your function itself", None),
    ("09.2", 2048, "patches", 512),
    ("09.2", 1024, "2 × 2", 512),
    ("09.2", 514, "<|image_pad|> ids only", 512),
    ("09.2", 256, "Qwen-VL's fixed span", 512),
    ("09.2", 512.0, "whole number", None),
    ("09.3", (151857, 151858, 151859), "Qwen-VL's <img>", 151655),
    ("09.3", (151652, 151653, 151654), "image_token_id", 151655),
    ("09.3", (151643, 151644, 151645), "among the article's first four ids", 151655),
    ("09.3", 151655, "three ids", None),
    ("09.4", 79, "1-D RoPE", 23),
    ("09.4", 22, "one step more", 23),
    ("09.4", 15, "grid starts", 23),
    ("09.4", "23", "whole number", None),
]


@pytest.mark.parametrize("key, answer", RIGHT, ids=lambda v: repr(v)[:40])
def test_right_answers_written_in_different_ways_are_accepted(key, answer):
    result = check(key, answer)
    assert result.ok, result.message


@pytest.mark.parametrize("key, answer, must_say, secret", WRONG, ids=lambda v: repr(v)[:40])
def test_wrong_answers_get_a_hint_that_keeps_the_answer(key, answer, must_say, secret):
    result = check(key, answer)
    assert not result.ok, f"{key} accepted {answer!r}"
    assert must_say in result.message, result.message
    if secret is not None:
        assert str(secret) not in result.message, result.message


def test_none_is_not_attempted_for_every_exercise():
    for key in ("09.1", "09.2", "09.3", "09.4"):
        assert "not attempted yet" in check(key, None).message
