"""Notebook 09's exercise checks accept right answers written in different ways and hint, without the answer, at
plausible wrong ones."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qwenvl_lab.course.exercises as exercises
from qwenvl_lab.course.exercises import check
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
    if next(rows, None) is not None:
        raise ValueError("more feature rows than multimodal positions")
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


def empty_features_lose_the_ids(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    if not mm_embeds:
        return None, None
    return fuse_input_embeds(embedding_layer, input_ids, mm_embeds, mm_token_ids)


def scatter_with_f_embedding(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    """Vectorised another way: F.embedding on clamped ids, then masked_scatter; counts checked first."""
    if len(mm_embeds) == 0:
        return input_ids, None
    rows = embedding_layer.weight.shape[0]
    mask = input_ids >= rows if mm_token_ids is None else torch.isin(input_ids, torch.as_tensor(mm_token_ids))
    features = torch.cat(list(mm_embeds))
    if int(mask.sum()) != len(features):
        raise ValueError("multimodal token count mismatch")
    embeds = F.embedding(input_ids.clamp(max=rows - 1), embedding_layer.weight)
    return None, embeds.masked_scatter(mask[:, None], features)


def scatter_without_count_check(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    if len(mm_embeds) == 0:
        return input_ids, None
    rows = embedding_layer.weight.shape[0]
    mask = input_ids >= rows if mm_token_ids is None else torch.isin(input_ids, torch.as_tensor(mm_token_ids))
    embeds = F.embedding(input_ids.clamp(max=rows - 1), embedding_layer.weight)
    return None, embeds.masked_scatter(mask[:, None], torch.cat(list(mm_embeds)))  # extra rows dropped silently


def rows_cut_to_fit(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    if len(mm_embeds) == 0:
        return input_ids, None
    mask = input_ids >= embedding_layer.num_embeddings if mm_token_ids is None else torch.isin(input_ids, mm_token_ids)
    out = torch.empty(len(input_ids), embedding_layer.embedding_dim)
    out[~mask] = embedding_layer(input_ids[~mask])
    out[mask] = torch.cat(mm_embeds)[: int(mask.sum())]
    return None, out


def features_first(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    """Concatenates the features before looking at them: torch.cat([]) fails when there are none."""
    features = torch.cat(list(mm_embeds))
    if len(features) == 0:
        return input_ids, None
    return fuse_input_embeds(embedding_layer, input_ids, mm_embeds, mm_token_ids)


def with_mask(mask_of):
    """A merge whose multimodal positions are mask_of(embedding_layer, input_ids, mm_token_ids), rows in order."""

    def merge(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
        if len(mm_embeds) == 0:
            return input_ids, None
        mask = mask_of(embedding_layer, input_ids, mm_token_ids)
        out = torch.empty(len(input_ids), embedding_layer.embedding_dim)
        out[~mask] = embedding_layer(input_ids[~mask].clamp(max=embedding_layer.num_embeddings - 1))
        out[mask] = torch.cat(list(mm_embeds))
        return None, out

    return merge


def first_picture_only(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    if len(mm_embeds) == 0:
        return input_ids, None
    mask = input_ids >= embedding_layer.num_embeddings if mm_token_ids is None else torch.isin(input_ids, mm_token_ids)
    out = torch.empty(len(input_ids), embedding_layer.embedding_dim)
    out[~mask] = embedding_layer(input_ids[~mask])
    out[mask] = mm_embeds[0]  # the other pictures' rows left out
    return None, out


def in_float64(embedding_layer, input_ids, mm_embeds, mm_token_ids=None):
    kept, out = fuse_input_embeds(embedding_layer, input_ids, mm_embeds, mm_token_ids)
    return kept, out if out is None else out.double()


def stub(embedding_layer, input_ids, mm_embeds, mm_token_ids=None): ...  # your code


RIGHT = [
    ("09.1", fuse_input_embeds),
    ("09.1", loop_fuse),
    ("09.1", scatter_with_f_embedding),
    ("09.2", 512),
    ("09.2", np.int64(512)),
    ("09.2", torch.tensor(512)),
    ("09.3", {151652: 1, 151653: 1, 151654: 0, 151655: 1196}),
    ("09.3", {151652: 1, 151653: 1, 151655: 1196}),  # an id left out counts 0
    ("09.3", {np.int64(151652): np.int64(1), 151653: torch.tensor(1), 151655: 1196}),
    ("09.4", 38),
    ("09.4", torch.tensor(38)),
    ("09.4", np.int64(38)),
]

WRONG = [  # (key, answer, what the hint must say, a number it must not give away)
    ("09.1", strict_greater, "vocab_size itself is already out of the vocabulary", None),
    ("09.1", ignores_mm_token_ids, "mm_token_ids given", None),
    ("09.1", reversed_rows, "in order", None),
    ("09.1", only_the_embeddings, "return a pair", None),
    ("09.1", in_place, "changed input_ids", None),
    ("09.1", empty_features_as_zeros, "(input_ids, None)", None),
    ("09.1", empty_features_lose_the_ids, "(input_ids, None)", None),
    ("09.1", scatter_without_count_check, "count mismatch", None),
    ("09.1", rows_cut_to_fit, "count mismatch", None),
    ("09.1", features_first, "before touching the features", "non-empty"),
    ("09.1", first_picture_only, "two blocks", "shape mismatch"),
    ("09.1", with_mask(lambda layer, ids, named: ids == layer.num_embeddings + 1), "not one sentinel", "mismatch"),
    ("09.1", with_mask(lambda layer, ids, named: ids >= layer.num_embeddings), "mm_token_ids is given", "mismatch"),
    ("09.1", in_float64, "dtype", None),
    ("09.1", stub, "not attempted yet", None),
    ("09.1", "fuse_input_embeds", "pass your function itself", None),
    ("09.2", 2048, "patches", 512),
    ("09.2", 1024, "2 × 2", 512),
    ("09.2", 514, "<|image_pad|> ids only", 512),
    ("09.2", 256, "Qwen-VL's fixed span", 512),
    ("09.2", 512.0, "whole number", None),
    ("09.2", 896, "a side in pixels", 512),
    ("09.2", 32, "one side of the token grid", 512),
    ("09.2", 16, "one side of the token grid", 512),
    ("09.3", {151652: 1, 151653: 196, 151655: 0}, "<|vision_end|>", 1196),  # the article's reading
    ("09.3", {151652: 1, 151653: 1, 151655: 256}, "Qwen-VL's fixed span", 1196),
    ("09.3", {151652: 1, 151653: 1, 151655: 4784}, "14 × 14 patches", 1196),
    ("09.3", {151652: 1, 151653: 1, 151654: 1, 151655: 1196}, "151654 is none", 1196),
    ("09.3", {151652: 1, 151653: 1, 151655: 299}, "image_token_count", 1196),  # the 640 × 360 picture's span
    ("09.3", (151652, 151653, 151655), "give a dict", 1196),  # which ids, not how often
    ("09.3", {151857: 1, 151858: 1, 151859: 256}, "give a dict", 1196),  # Qwen-VL's ids
    ("09.4", 314, "1-D RoPE", 38),
    ("09.4", 37, "one step more", 38),
    ("09.4", 61, "14-pixel patches", 38),
    ("09.4", 28, "longer side", 38),
    ("09.4", 15, "grid starts", 38),
    ("09.4", 23, "224 × 224 picture's answer", 38),  # the value the notebook prints for its own picture
    ("09.4", "38", "whole number", None),
    ("09.4", 299, "not a position", 38),
    ("09.4", 51, "not added", 38),
]


@pytest.mark.parametrize("key, answer", RIGHT, ids=lambda v: getattr(v, "__name__", repr(v))[:40])
def test_right_answers_written_in_different_ways_are_accepted(key, answer):
    result = check(key, answer)
    assert result.ok, result.message


@pytest.mark.parametrize("key, answer, must_say, secret", WRONG, ids=lambda v: getattr(v, "__name__", repr(v))[:40])
def test_wrong_answers_get_a_hint_that_keeps_the_answer(key, answer, must_say, secret):
    result = check(key, answer)
    assert not result.ok, f"{key} accepted {answer!r}"
    assert must_say in result.message, result.message
    if secret is not None:
        assert str(secret) not in result.message, result.message


def test_none_is_not_attempted_for_every_exercise():
    for key in ("09.1", "09.2", "09.3", "09.4"):
        assert "not attempted yet" in check(key, None).message
