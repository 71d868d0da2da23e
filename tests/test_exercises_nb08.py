"""Notebook 08's exercise checks: right answers written two ways pass, plausible wrong ones (the runtime's real
failures among them) get a hint, stubs are 'not attempted yet'."""

import numpy as np
import pytest
import torch

from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check


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


def extras_by_name(batch_input_ids, vocab_size, pictures):
    ids = {}
    for names in pictures:
        for name in names:
            ids.setdefault(name, len(ids) + 1)
    return [
        [0 if t < vocab_size else ids[names[(t - vocab_size) // 256]] for t in request]
        for request, names in zip(batch_input_ids, pictures)
    ]


def extras_by_sorted_names(batch_input_ids, vocab_size, pictures):
    order = sorted({name for names in pictures for name in names})
    out = []
    for request, names in zip(batch_input_ids, pictures):
        ids = torch.tensor(request)
        picture = torch.clamp(ids - vocab_size, min=0) // 256
        extra = torch.tensor([order.index(n) + 1 for n in names])[picture]
        out.append(torch.where(ids >= vocab_size, extra, 0).tolist())
    return out


def extras_by_hash(batch_input_ids, vocab_size, pictures):
    """An id from a hash of the picture's name, as a server would key pictures by their content."""
    return [
        [0 if t < vocab_size else abs(hash(names[(t - vocab_size) // 256])) % 10**6 + 1 for t in request]
        for request, names in zip(batch_input_ids, pictures)
    ]


def extras_per_request(batch_input_ids, vocab_size, pictures):
    return [[0 if t < vocab_size else r + 1 for t in request] for r, request in enumerate(batch_input_ids)]


def extras_per_position(batch_input_ids, vocab_size, pictures):
    return [[0 if t < vocab_size else (t - vocab_size) // 256 + 1 for t in request] for request in batch_input_ids]


def extras_all_ones(batch_input_ids, vocab_size, pictures):
    return [[int(t >= vocab_size) for t in request] for request in batch_input_ids]


def extras_from_zero(batch_input_ids, vocab_size, pictures):
    return [[e - 1 if e else 0 for e in r] for r in extras_by_name(batch_input_ids, vocab_size, pictures)]


def extras_on_text(batch_input_ids, vocab_size, pictures):
    return [[e or 9 for e in r] for r in extras_by_name(batch_input_ids, vocab_size, pictures)]


def extras_by_letters(batch_input_ids, vocab_size, pictures):
    """A 'hash' that adds up the name's characters: pictures whose names have the same letters collide."""
    return [
        [0 if t < vocab_size else sum(map(ord, names[(t - vocab_size) // 256])) for t in request]
        for request, names in zip(batch_input_ids, pictures)
    ]


def extras_are_the_fake_ids(batch_input_ids, vocab_size, pictures):
    return [[t if t >= vocab_size else 0 for t in request] for request in batch_input_ids]


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
    ("08.3", extras_by_name, True, "correct"),
    ("08.3", extras_by_sorted_names, True, "correct"),
    ("08.3", extras_by_hash, True, "correct"),
    ("08.3", extras_per_request, False, "the same picture must carry the same extra id"),
    ("08.3", extras_per_position, False, "the same picture must carry the same extra id"),
    ("08.3", extras_all_ones, False, "share an extra id"),
    ("08.3", extras_from_zero, False, "must be > 0"),
    ("08.3", extras_on_text, False, "text ids keep extra id 0"),
    ("08.3", extras_by_letters, False, "share an extra id"),
    ("08.3", extras_are_the_fake_ids, False, "the same picture must carry the same extra id"),
    ("08.3", stub, False, "not attempted yet"),
]


@pytest.mark.parametrize("key, answer, right, message", CASES)
def test_the_checks_accept_right_answers_and_hint_at_wrong_ones(key, answer, right, message):
    result = check(key, answer)
    assert bool(result) is right and message in result.message, result.message
