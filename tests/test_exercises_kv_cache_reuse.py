"""Exercise 08.9 (the KV-cache reuse section of notebook 08): extra ids run for real on the engine with block reuse.
Right answers written two ways pass; plausible wrong ones — the ids-only bug among them — get a hint that names what
went wrong without giving the rule away; stubs are 'not attempted yet'."""

import hashlib
import itertools

import pytest
import torch

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check
from qwenvl_lab.toy import TOY_DIR

pytestmark = pytest.mark.skipif(not (TOY_DIR / "config.json").is_file(), reason="the toy model is not trained yet")


@pytest.fixture(autouse=True)
def only_this_section(monkeypatch):
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ())


def by_name(batch_input_ids, vocab_size, pictures):
    """0 for text; a picture's fake ids: a number made from its name (the same name, the same id)."""
    return [
        [0 if t < vocab_size else 1 + int(hashlib.sha256(names[0].encode()).hexdigest()[:12], 16) for t in ids]
        for ids, names in zip(batch_input_ids, pictures)
    ]


SEEN = {}


def by_first_appearance(batch_input_ids, vocab_size, pictures):
    """Numbered as the pictures first come, remembered across calls, as tensors."""
    out = []
    for ids, names in zip(batch_input_ids, pictures):
        number = SEEN.setdefault(names[0], len(SEEN) + 1)
        ids = torch.tensor(ids)
        out.append(torch.where(ids >= vocab_size, number, 0))
    return out


@pytest.mark.parametrize("answer", [by_name, by_first_appearance])
def test_right_answers_pass(answer, assert_verdict):
    SEEN.clear()
    assert_verdict(check("08.9", answer), True)


def all_zero(batch_input_ids, vocab_size, pictures):
    return [[0] * len(ids) for ids in batch_input_ids]


def one_for_every_picture(batch_input_ids, vocab_size, pictures):
    return [[int(t >= vocab_size) for t in ids] for ids in batch_input_ids]


def the_fake_id_itself(batch_input_ids, vocab_size, pictures):
    return [[t if t >= vocab_size else 0 for t in ids] for ids in batch_input_ids]


COUNTER = itertools.count(1)


def new_every_call(batch_input_ids, vocab_size, pictures):
    call = next(COUNTER)
    return [[0 if t < vocab_size else call for t in ids] for ids in batch_input_ids]


def by_position_in_batch(batch_input_ids, vocab_size, pictures):
    return [[0 if t < vocab_size else r + 1 for t in ids] for r, ids in enumerate(batch_input_ids)]


def picture_id_on_text_too(batch_input_ids, vocab_size, pictures):
    return [[1 + len(names[0]) for _ in ids] for ids, names in zip(batch_input_ids, pictures)]


def one_short(batch_input_ids, vocab_size, pictures):
    return [by_name([ids], vocab_size, [names])[0][:-1] for ids, names in zip(batch_input_ids, pictures)]


def negative_for_pictures(batch_input_ids, vocab_size, pictures):
    return [[0 if t < vocab_size else -len(names[0]) for t in ids] for ids, names in zip(batch_input_ids, pictures)]


def floats(batch_input_ids, vocab_size, pictures):
    return [[0.5 for _ in ids] for ids in batch_input_ids]


def stub(batch_input_ids, vocab_size, pictures):
    return None


WRONG = [
    (all_zero, ["blue_square.png was answered", "the answer about red_circle.png", "same extra ids"]),
    (one_for_every_picture, ["blue_square.png was answered", "another picture's keys and values"]),
    (the_fake_id_itself, ["blue_square.png was answered", "the same ids"]),
    (by_position_in_batch, ["was answered"]),
    (new_every_call, ["red_circle.png came back", "not reused", "same extra ids every time"]),
    (picture_id_on_text_too, ["the text before its picture", "was not reused"]),
    (one_short, ["one extra id per input id"]),
    (negative_for_pictures, ["unsigned 64-bit", "0 and above"]),
    (floats, ["one list of ints per request"]),
]


@pytest.mark.parametrize("answer, words", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_answers_are_refused_with_a_hint(answer, words, assert_verdict):
    assert_verdict(check("08.9", answer), False, words, secrets=["0 for text", "text ids keep extra id 0, one"])


def test_a_stub_is_not_attempted_and_a_non_function_is_refused(assert_verdict):
    assert_verdict(check("08.9", stub), False, ["not attempted yet"])
    assert_verdict(check("08.9", [[0, 1]]), False, ["give a function"])
