"""Notebooks 03 and 04's exercise checks accept the right answer and hint, without the answer, at wrong ones."""

import re

import pytest
import torch

import qwenvl_lab.exercises as exercises
from qwenvl_lab.exercises import check
from qwenvl_lab.fake_ids import replace_image_spans
from qwenvl_lab.prompt_table import prompt_tuning_embedding


@pytest.fixture(autouse=True)
def only_these_notebooks(monkeypatch):
    """Load the checks of notebooks 03 and 04 alone."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb03", "nb04"))


def hint_for(key, answer, must_say):
    """The check's message for a wrong answer; it must say `must_say` and not be accepted."""
    result = check(key, answer)
    assert not result.ok, f"{key} accepted a wrong answer {answer!r}"
    assert must_say in result.message, result.message
    return result.message


def no_number(message, value):
    """Whether `value` (an int) appears in `message` as a whole number."""
    return re.search(rf"(?<![\d.]){value}(?![\d])", message) is None


def no_fake_id(message):
    """Whether `message` names no id at or above the first fake id (it would give a span's content away)."""
    return all(int(n) < 151936 for n in re.findall(r"\d+", message))


# 03.1 — replace_image_spans


def test_replace_image_spans_accepts_the_package_and_a_learner_version():
    def mine(input_ids, img_pos, fake_prompt_id):
        out = input_ids.clone()
        for k, (i, a, b) in enumerate(img_pos.tolist()):
            out[i, a + 1 : b] = fake_prompt_id[k]
        return out

    assert check("03.1", replace_image_spans)
    assert check("03.1", mine)


def test_the_untouched_stub_is_not_attempted():
    def my_replace_image_spans(input_ids, img_pos, fake_prompt_id): ...  # your code

    result = check("03.1", my_replace_image_spans)
    assert not result.ok and "not attempted yet" in str(result)


def in_place(input_ids, img_pos, fake_prompt_id):
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        input_ids[i, a + 1 : b] = fake_prompt_id[k]
    return input_ids


def over_the_open_tag(input_ids, img_pos, fake_prompt_id):
    out = input_ids.clone()
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        out[i, a : b - 1] = fake_prompt_id[k]
    return out


def always_row_0(input_ids, img_pos, fake_prompt_id):
    out = input_ids.clone()
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        out[0, a + 1 : b] = fake_prompt_id[k]
    return out


def first_row_of_fake_ids(input_ids, img_pos, fake_prompt_id):
    out = input_ids.clone()
    for i, a, b in img_pos.tolist():
        out[i, a + 1 : b] = fake_prompt_id[0]
    return out


def batch_row_as_picture(input_ids, img_pos, fake_prompt_id):
    out = input_ids.clone()
    for i, a, b in img_pos.tolist():
        out[i, a + 1 : b] = fake_prompt_id[i]
    return out


def as_list(input_ids, img_pos, fake_prompt_id):
    return replace_image_spans(input_ids, img_pos, fake_prompt_id).tolist()


def as_floats(input_ids, img_pos, fake_prompt_id):
    return replace_image_spans(input_ids, img_pos, fake_prompt_id).float()


def dropped_tags(input_ids, img_pos, fake_prompt_id):
    keep = torch.ones(input_ids.shape[1], dtype=torch.bool)
    keep[img_pos[0, 1]] = False
    return replace_image_spans(input_ids, img_pos, fake_prompt_id)[:, keep]


def hard_coded_256(input_ids, img_pos, fake_prompt_id):
    out = input_ids.clone()
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        out[i, a + 1 : a + 257] = fake_prompt_id[k]
    return out


@pytest.mark.parametrize(
    "wrong, must_say",
    [
        (in_place, "changed the input_ids"),
        (over_the_open_tag, "tag was overwritten"),
        (always_row_0, "outside the image spans"),
        (first_row_of_fake_ids, "picture 1"),
        (batch_row_as_picture, "picture 1"),
        (as_list, "torch tensor"),
        (as_floats, "integer token ids"),
        (dropped_tags, "keep their length"),
        (hard_coded_256, "raised"),
        (torch.tensor([1, 2]), "pass your function"),
    ],
)
def test_wrong_replace_image_spans_gets_a_hint_without_the_ids(wrong, must_say):
    message = hint_for("03.1", wrong, must_say)
    assert no_fake_id(message)


def test_the_batch_case_catches_a_function_that_only_handles_row_0():
    message = hint_for("03.1", always_row_0, "a batch of two left-padded rows")
    assert "one picture" not in message


# 03.2 – 03.4 — the numbers


@pytest.mark.parametrize("key, right", [("03.2", 76), ("03.3", 152448), ("03.4", 1)])
def test_number_exercises_accept_the_right_number(key, right):
    assert check(key, right)
    assert check(key, torch.tensor(right))
    assert not check(key, None) and "not attempted yet" in str(check(key, None))


@pytest.mark.parametrize(
    "key, right, wrong, must_say",
    [
        ("03.2", 76, 293, "special tokens too"),
        ("03.2", 76, 217, "number of special tokens"),
        ("03.2", 76, 77, "off by one"),
        ("03.2", 76, 75, "off by one"),
        ("03.2", 76, 12, "recount"),
        ("03.3", 152448, 151936, "first picture"),
        ("03.3", 152448, 152192, "second picture's first id"),
        ("03.3", 152448, 152447, "second picture's last id"),
        ("03.3", 152448, 152155, "not at 151643"),
        ("03.3", 152448, 152704, "after the third picture"),
        ("03.4", 1, 8, "whole table"),
        ("03.4", 1, 256, "share of rows"),
        ("03.4", 1, 0, "no request could send a picture"),
        ("03.4", 1, 2, "recount"),
        ("03.4", 1, "1", "whole number"),
        ("03.4", 1, True, "whole number"),
        ("03.4", 1, 1.0, "whole number"),
    ],
)
def test_wrong_numbers_get_a_hint_without_the_answer(key, right, wrong, must_say):
    message = hint_for(key, wrong, must_say)
    assert no_number(message.replace(repr(wrong), ""), right)


# 04.1 — prompt_tuning_embedding with tasks


def test_prompt_tuning_embedding_accepts_the_package_and_a_learner_version():
    def mine(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
        fake = input_ids >= vocab_size
        rows = input_ids - vocab_size + tasks[:, None] * task_vocab_size
        out = vocab_embedding[input_ids.clamp(max=vocab_size - 1)]
        out[fake] = prompt_table[rows[fake]]
        return out

    assert check("04.1", prompt_tuning_embedding)
    assert check("04.1", mine)


def test_the_untouched_lookup_stub_is_not_attempted():
    def my_prompt_tuning_embedding(
        input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size
    ): ...  # your code

    result = check("04.1", my_prompt_tuning_embedding)
    assert not result.ok and "not attempted yet" in str(result)


def lookup_with(rows_of):
    """A lookup that reads fake ids from rows_of(offset, tasks, task_vocab_size), the rest from the vocabulary."""

    def lookup(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
        fake = input_ids >= vocab_size
        out = vocab_embedding[input_ids.clamp(max=vocab_size - 1)]
        rows = rows_of(input_ids - vocab_size, tasks.long()[:, None], int(task_vocab_size))
        out[fake] = prompt_table[rows[fake].clamp(0, len(prompt_table) - 1)]
        return out

    return lookup


def v_minus_1_as_fake(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    fake = input_ids >= vocab_size - 1
    out = vocab_embedding[input_ids.clamp(max=vocab_size - 1)]
    rows = (input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size)).clamp(min=0)
    out[fake] = prompt_table[rows[fake]]
    return out


def vocabulary_only(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    return vocab_embedding[input_ids.clamp(max=vocab_size - 1)]


def ordinary_rows_shifted(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    out = prompt_tuning_embedding(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size)
    out[input_ids < vocab_size] = vocab_embedding[(input_ids[input_ids < vocab_size] + 1) % vocab_size]
    return out


def changes_the_table(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    out = prompt_tuning_embedding(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size)
    prompt_table.zero_()
    return out


def squeezed(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    return prompt_tuning_embedding(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size)[0]


def in_float64(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    return prompt_tuning_embedding(
        input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size
    ).double()


def mask_past_v(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    fake = input_ids > vocab_size
    out = vocab_embedding[torch.where(fake, 0, input_ids)]
    out[fake] = prompt_table[(input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size))[fake]]
    return out


@pytest.mark.parametrize(
    "wrong, must_say",
    [
        (lookup_with(lambda offset, tasks, tvs: offset), "ignore `tasks`"),
        (lookup_with(lambda offset, tasks, tvs: offset + tasks * tvs + 1), "off by one"),
        (lookup_with(lambda offset, tasks, tvs: offset + tasks * tvs - 1), "off by one"),
        (lookup_with(lambda offset, tasks, tvs: offset + tasks), "as a row count"),
        (lookup_with(lambda offset, tasks, tvs: offset * 0 + tasks * tvs), "wrong rows"),
        (v_minus_1_as_fake, "vocab_size − 1"),
        (vocabulary_only, "wrong rows"),
        (ordinary_rows_shifted, "their own row of the word embedding"),
        (changes_the_table, "changed one of its inputs"),
        (squeezed, "[B, L, H]"),
        (in_float64, "dtype"),
        (mask_past_v, "raised IndexError"),
        ("prompt_tuning_embedding", "pass your function"),
    ],
)
def test_wrong_lookups_get_a_hint_without_the_embeddings(wrong, must_say):
    assert re.search(r"\d\.\d", hint_for("04.1", wrong, must_say)) is None  # no embedding value in the hint


def test_a_lookup_without_tasks_passes_task_0_and_fails_on_the_first_batch_with_tasks():
    message = hint_for("04.1", lookup_with(lambda offset, tasks, tvs: offset), "ignore `tasks`")
    assert "two sequences with tasks 0 and 1" in message


# 04.2 – 04.4


@pytest.mark.parametrize(
    "key, right",
    [
        ("04.2", 516),
        ("04.3", "A blue square."),
        ("04.3", "一个蓝色的正方形。"),
        ("04.3", "blue_square.png"),
        ("04.4", (768, 1536)),
        ("04.4", [768, 1536]),
    ],
)
def test_the_other_exercises_accept_the_right_answer(key, right):
    assert check(key, right)


@pytest.mark.parametrize(
    "wrong, must_say",
    [
        (4, "request 0's block"),
        (517, "off by one"),
        (515, "off by one"),
        (260, "not 256"),
        (151940, "subtract"),
        (297, "not 151643"),
        (1000, "recount"),
        ("516", "whole number"),
    ],
)
def test_wrong_rows_get_a_hint_without_the_row(wrong, must_say):
    assert no_number(hint_for("04.2", wrong, must_say).replace(repr(wrong), ""), 516)


@pytest.mark.parametrize(
    "wrong, must_say",
    [
        ("A red circle.", "do they still name a picture"),
        ("一个红色的圆形。", "do they still name a picture"),
        ("A red circle and a blue square.", "do they still name a picture"),
        ("no idea", "store the answer"),
        (["A blue square."], "as a string"),
    ],
)
def test_the_red_circle_is_not_the_answer(wrong, must_say):
    assert "blue" not in hint_for("04.3", wrong, must_say).lower()


@pytest.mark.parametrize(
    "wrong, must_say",
    [
        ((1536, 1536), "the python-session table: the python session's table has one block per picture"),
        ((768, 768), "the in-flight table: under in-flight batching every request owns a block of the same size"),
        ((768, 1024), "keeps its slot"),
        ((512, 1536), "recount"),
        ((768, 2000), "recount"),
        (768, "as a pair"),
        ((768, "1536"), "two whole numbers"),
    ],
)
def test_wrong_table_sizes_get_a_hint_without_the_sizes(wrong, must_say):
    message = hint_for("04.4", wrong, must_say).replace(repr(wrong), "")
    assert no_number(message, 768) and no_number(message, 1536)
