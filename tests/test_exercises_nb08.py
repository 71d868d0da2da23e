"""Notebook 08's exercise checks: right answers written two ways pass, plausible wrong ones (the runtime's real
failures among them, and for 08.3 the wrong picture's answer that block reuse keyed by ids alone gives) get a hint
that names what went wrong without giving the rule away, stubs are 'not attempted yet'."""

import hashlib
import itertools

import numpy as np
import pytest
import torch

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check
from qwenvl_lab.toy import TOY_DIR


@pytest.fixture(autouse=True)
def only_notebook_08(monkeypatch):
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb08",))


V = 151936


def row_arithmetic(fake_id, batch_index, prompt_vocab_size, table_size, max_batch_size):
    return batch_index * (table_size // max_batch_size) + fake_id - V


def row_by_blocks(fake_id, batch_index, prompt_vocab_size, table_size, max_batch_size):
    """Built like the runtime: one big table cut in blocks; the request's block; the fake id's row in it."""
    blocks = np.arange(table_size).reshape(max_batch_size, -1)
    return blocks[batch_index][fake_id - V]


def row_with_prompt_vocab_size(fake_id, batch_index, prompt_vocab_size, table_size, max_batch_size):
    return batch_index * prompt_vocab_size + fake_id - V  # as if the runtime used what the request sent (#1809)


def row_in_own_table(fake_id, batch_index, prompt_vocab_size, table_size, max_batch_size):
    return fake_id - V


def row_off_by_one(fake_id, batch_index, prompt_vocab_size, table_size, max_batch_size):
    return batch_index * (table_size // max_batch_size) + fake_id - V + 1


def empty_like_runner(rank_hidden_size, tp_size, requests, dtype):
    return (
        torch.empty([1, rank_hidden_size * tp_size], dtype=dtype),
        torch.zeros([requests], dtype=torch.int32),
        torch.zeros([1], dtype=torch.int32),
    )


def empty_from_zeros(rank_hidden_size, tp_size, requests, dtype):
    table = torch.zeros(1, rank_hidden_size, tp_size, dtype=dtype).flatten(1)
    return table, torch.tensor([0] * requests, dtype=torch.int32), torch.tensor([0], dtype=torch.int32)


def empty_one_rank_wide(rank_hidden_size, tp_size, requests, dtype):
    return empty_like_runner(rank_hidden_size, 1, requests, dtype)  # the bug PR #2470 fixed


def empty_in_float32(rank_hidden_size, tp_size, requests, dtype):
    return empty_like_runner(rank_hidden_size, tp_size, requests, torch.float32)


def empty_one_task(rank_hidden_size, tp_size, requests, dtype):
    table, _, vocab = empty_like_runner(rank_hidden_size, tp_size, requests, dtype)
    return table, torch.zeros([1], dtype=torch.int32), vocab


def empty_vocab_one(rank_hidden_size, tp_size, requests, dtype):
    table, tasks, _ = empty_like_runner(rank_hidden_size, tp_size, requests, dtype)
    return table, tasks, torch.ones([1], dtype=torch.int32)


def empty_row_per_request(rank_hidden_size, tp_size, requests, dtype):
    _, tasks, vocab = empty_like_runner(rank_hidden_size, tp_size, requests, dtype)
    return torch.empty([requests, rank_hidden_size * tp_size], dtype=dtype), tasks, vocab


def empty_tasks_int64(rank_hidden_size, tp_size, requests, dtype):
    table, _, vocab = empty_like_runner(rank_hidden_size, tp_size, requests, dtype)
    return table, torch.zeros([requests], dtype=torch.int64), vocab


def empty_tasks_by_position(rank_hidden_size, tp_size, requests, dtype):
    table, _, vocab = empty_like_runner(rank_hidden_size, tp_size, requests, dtype)
    return table, torch.arange(requests, dtype=torch.int32), vocab  # the executor's positions, not the session's 0s


def stub(*args):
    raise NotImplementedError


CASES = [
    ("08.1", row_arithmetic, True, "correct"),
    ("08.1", row_by_blocks, True, "correct"),
    ("08.1", lambda *a: np.int64(row_arithmetic(*a)), True, "correct"),
    ("08.1", lambda f, b, p, size, m: torch.tensor(int(b * (size / m)) + f - V), True, "correct"),
    ("08.1", lambda f, b, p, size, m: b * (size // 8) + f - V, False, "a block per request"),  # max_batch_size ignored
    ("08.1", row_with_prompt_vocab_size, False, "ignores the request's prompt_vocab_size"),
    ("08.1", row_in_own_table, False, "own table"),
    ("08.1", row_off_by_one, False, "off by one"),
    ("08.1", lambda f, b, p, size, m: b * (size // m) + f, False, "fake_id - vocab_size"),  # vocab_size kept
    ("08.1", lambda f, b, p, size, m: (b + 1) * (size // m) + f - V, False, "count from 0"),
    ("08.1", lambda f, b, p, size, m: b * (size / m) + f - V, False, "as an int"),  # / gives a float
    ("08.1", lambda *a: [row_arithmetic(*a)], False, "as an int"),
    ("08.1", lambda *a: float(row_arithmetic(*a)), False, "as an int"),
    ("08.1", stub, False, "not attempted yet"),
    ("08.2", empty_like_runner, True, "correct"),
    ("08.2", empty_from_zeros, True, "correct"),
    ("08.2", empty_one_rank_wide, False, "the model's width"),
    ("08.2", empty_in_float32, False, "in its dtype"),
    ("08.2", empty_one_task, False, "one task per request"),
    ("08.2", empty_vocab_one, False, "holding 0"),
    ("08.2", empty_row_per_request, False, "one row of the model's hidden size"),
    ("08.2", empty_tasks_int64, False, "int32"),
    ("08.2", empty_tasks_by_position, False, "all 0"),
    ("08.2", lambda *a: None, False, "not attempted yet"),
]


@pytest.mark.parametrize("key, answer, right, message", CASES)
def test_the_checks_accept_right_answers_and_hint_at_wrong_ones(key, answer, right, message):
    result = check(key, answer)
    assert bool(result) is right and message in result.message, result.message


# 08.3: extra ids, run for real on the engine with block reuse keyed by ids and extra ids (the shipped toy model)
needs_the_toy_model = pytest.mark.skipif(
    not (TOY_DIR / "config.json").is_file(), reason="the toy model is not trained yet"
)


def by_name(batch_input_ids, vocab_size, pictures):
    """0 for text; a picture's fake ids: a number made from its name (the same name, the same id)."""
    return [
        [0 if t < vocab_size else 1 + int(hashlib.sha256(names[(t - vocab_size) // 256].encode()).hexdigest()[:12], 16)
         for t in ids]
        for ids, names in zip(batch_input_ids, pictures)
    ]  # fmt: skip


SEEN = {}


def by_first_appearance(batch_input_ids, vocab_size, pictures):
    """Numbered as the pictures first come, remembered across calls, as tensors."""
    out = []
    for ids, names in zip(batch_input_ids, pictures):
        ids = torch.tensor(ids)
        numbers = torch.tensor([SEEN.setdefault(name, len(SEEN) + 1) for name in names])
        picture = torch.clamp(ids - vocab_size, min=0) // 256
        out.append(torch.where(ids >= vocab_size, numbers[picture], 0))
    return out


def by_python_hash(batch_input_ids, vocab_size, pictures):
    """An id from Python's hash of the picture's name (the same within a process), as a server keys by content."""
    return [
        [0 if t < vocab_size else abs(hash(names[(t - vocab_size) // 256])) % 10**6 + 1 for t in request]
        for request, names in zip(batch_input_ids, pictures)
    ]


@needs_the_toy_model
@pytest.mark.parametrize("answer", [by_name, by_first_appearance, by_python_hash])
def test_extra_ids_right_answers_pass(answer, assert_verdict):
    SEEN.clear()
    assert_verdict(check("08.3", answer), True)


def all_zero(batch_input_ids, vocab_size, pictures):
    return [[0] * len(ids) for ids in batch_input_ids]


def one_for_every_picture(batch_input_ids, vocab_size, pictures):
    return [[int(t >= vocab_size) for t in ids] for ids in batch_input_ids]


def the_fake_id_itself(batch_input_ids, vocab_size, pictures):
    return [[t if t >= vocab_size else 0 for t in ids] for ids in batch_input_ids]


def numbered_within_the_call(batch_input_ids, vocab_size, pictures):
    """Pictures numbered from 1 in each call: right within a call, the same numbers again in the next."""
    number = {}
    for names in pictures:
        for name in names:
            number.setdefault(name, len(number) + 1)
    return [
        [0 if t < vocab_size else number[names[(t - vocab_size) // 256]] for t in request]
        for request, names in zip(batch_input_ids, pictures)
    ]


COUNTER = itertools.count(1)


def new_every_call(batch_input_ids, vocab_size, pictures):
    call = next(COUNTER)
    return [[0 if t < vocab_size else call for t in ids] for ids in batch_input_ids]


def by_position_in_batch(batch_input_ids, vocab_size, pictures):
    return [[0 if t < vocab_size else r + 1 for t in ids] for r, ids in enumerate(batch_input_ids)]


def by_position_in_request(batch_input_ids, vocab_size, pictures):
    return [[0 if t < vocab_size else (t - vocab_size) // 256 + 1 for t in request] for request in batch_input_ids]


def picture_id_on_text_too(batch_input_ids, vocab_size, pictures):
    return [[1 + len(names[0]) for _ in ids] for ids, names in zip(batch_input_ids, pictures)]


def the_same_id_on_text(batch_input_ids, vocab_size, pictures):
    """Every text id 9: the text is still reused, but text ids keep extra id 0 by the guide."""
    return [[e or 9 for e in r] for r in by_name(batch_input_ids, vocab_size, pictures)]


def the_first_picture_zero(batch_input_ids, vocab_size, pictures):
    """Numbered from 0 as the pictures first come: the first picture's fake ids carry 0, as text ids do."""
    return [[e - 1 if t >= vocab_size else 0 for t, e in zip(ids, r)]
            for ids, r in zip(batch_input_ids, by_first_appearance(batch_input_ids, vocab_size, pictures))]  # fmt: skip


def first_name_for_every_span(batch_input_ids, vocab_size, pictures):
    """One id per request, from its first picture's name: a request's second picture carries the first one's id."""
    return [by_name([ids], vocab_size, [[names[0]] * len(names)])[0] for ids, names in zip(batch_input_ids, pictures)]


def changing_along_the_span(batch_input_ids, vocab_size, pictures):
    """The picture's id from its name plus the fake id's place in its span: the same for the same picture every time,
    but not one id per picture, as the guide's rule gives."""
    return [
        [e + (t - vocab_size) % 256 if t >= vocab_size else 0 for t, e in zip(ids, r)]
        for ids, r in zip(batch_input_ids, by_name(batch_input_ids, vocab_size, pictures))
    ]


def by_letters(batch_input_ids, vocab_size, pictures):
    """A 'hash' that adds up the name's characters: pictures whose names have the same letters collide."""
    return [
        [0 if t < vocab_size else sum(map(ord, names[(t - vocab_size) // 256])) for t in request]
        for request, names in zip(batch_input_ids, pictures)
    ]


def one_short(batch_input_ids, vocab_size, pictures):
    return [by_name([ids], vocab_size, [names])[0][:-1] for ids, names in zip(batch_input_ids, pictures)]


def negative_for_pictures(batch_input_ids, vocab_size, pictures):
    return [[0 if t < vocab_size else -len(names[0]) for t in ids] for ids, names in zip(batch_input_ids, pictures)]


def floats(batch_input_ids, vocab_size, pictures):
    return [[0.5 for _ in ids] for ids in batch_input_ids]


def extras_stub(batch_input_ids, vocab_size, pictures):
    return None


WRONG = [
    (all_zero, ["blue_square.png was answered", "the answer about red_circle.png", "same extra ids", "must be > 0"]),
    (one_for_every_picture, ["blue_square.png was answered", "another picture's keys and values"]),
    (the_fake_id_itself, ["blue_square.png was answered", "the same ids"]),
    (numbered_within_the_call, ["blue_square.png was answered", "from call to call", "not only from those of the same call"]),
    (by_position_in_batch, ["was answered"]),
    (by_position_in_request, ["blue_square.png was answered"]),
    (new_every_call, ["red_circle.png came back", "not reused", "same extra ids every time"]),
    (picture_id_on_text_too, ["the text before its picture", "was not reused"]),
    (the_same_id_on_text, ["text ids keep extra id 0"]),
    (the_first_picture_zero, ["must be > 0"]),
    (first_name_for_every_span, ["the same picture must carry the same extra id", "two pictures"]),
    (changing_along_the_span, ["one extra id, the picture's", "change along its span"]),
    (by_letters, ["share an extra id"]),
    (one_short, ["one extra id per input id"]),
    (negative_for_pictures, ["unsigned 64-bit", "0 and above"]),
    (floats, ["one list of ints per request"]),
]  # fmt: skip


@needs_the_toy_model
@pytest.mark.parametrize("answer, words", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_extra_ids_wrong_answers_are_refused_with_a_hint(answer, words, assert_verdict):
    SEEN.clear()
    assert_verdict(check("08.3", answer), False, words, secrets=["0 for text", "text ids keep extra id 0, one"])


@needs_the_toy_model
def test_extra_ids_a_stub_is_not_attempted_and_a_non_function_is_refused(assert_verdict):
    assert_verdict(check("08.3", extras_stub), False, ["not attempted yet"])
    assert_verdict(check("08.3", stub), False, ["not attempted yet"])
    assert_verdict(check("08.3", [[0, 1]]), False, ["give a function"])
