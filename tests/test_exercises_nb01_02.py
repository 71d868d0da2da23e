"""Notebooks 01 and 02's exercise checks accept right answers and hint, without the answer, at typical wrong ones."""

import pytest
import torch

from qwenvl_lab import exercises, load_tokenizer, locate_img_pos, make_context
from qwenvl_lab.exercises import REGISTRY, check
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN

PAIR = ["../data/images/pair_a_yellow_circle_red_triangle.png", "../data/images/pair_b_blue_square_yellow_circle.png"]
CHATS = [
    (["../data/images/red_circle.png"], "图片里是什么？"),
    (PAIR, "哪张图片里有红色的三角形？"),
    (["../data/images/blue_square.png"], "What color is the square?"),
]


@pytest.fixture(autouse=True)
def only_these_notebooks(monkeypatch):
    """The checks of notebooks 01 and 02 only: the other notebooks' modules are not needed here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb01", "nb02"))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def chat_ids(tokenizer, pictures, question):
    query = tokenizer.from_list_format([{"image": p} for p in pictures] + [{"text": question}])
    return make_context(tokenizer, query)[1]


def assert_hint(result, *words, without=()):
    """A wrong answer: not ok, a hint that names `words`, and none of the `without` strings (the expected value)."""
    assert not result and result.message.startswith(("not yet — ", "not attempted yet")), result
    for word in words:
        assert word in result.message, result
    for text in without:
        assert str(text) not in result.message, result


def test_every_exercise_is_registered_with_its_question():
    exercises._load()
    keys = {k for k in REGISTRY if k[:2] in ("01", "02")}
    assert keys == {"01.1", "01.2", "01.3", "01.4", "02.1", "02.2", "02.3"}
    assert all(REGISTRY[k].question.strip() for k in keys)


# 01.1: the image span


def learner_span(path):
    """A learner's correct image span."""
    data = list(path.encode("utf-8"))
    if len(data) > IMG_TOKEN_SPAN:
        raise ValueError("path too long")
    return [IMAGE_START_ID] + data + [IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(data)) + [IMAGE_END_ID]


def test_image_span_accepts_a_right_function_and_the_tokenizers_own(tokenizer):
    assert check("01.1", learner_span)
    assert check("01.1", tokenizer.encode_image_span)
    assert check("01.1", lambda path: torch.tensor(learner_span(path)))  # a tensor of ids is fine too


def test_image_span_untouched_stub_is_not_attempted():
    def my_image_span(path):
        return None  # your code

    result = check("01.1", my_image_span)
    assert not result and "not attempted yet" in str(result)


def without_long_check(span):
    """A learner's span function that never raises: the long path goes through unchecked."""

    def my_image_span(path):
        data = list(path.encode("utf-8"))[:IMG_TOKEN_SPAN]
        return span(path, data)

    return my_image_span


def refuses_a_full_span(path):
    """A learner's span function that refuses a path which exactly fills the span."""
    if len(path.encode()) >= IMG_TOKEN_SPAN:
        raise ValueError("path too long")
    return learner_span(path)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (without_long_check(lambda p, d: d + [IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(d))), ["tags belong to the span"]),
        (lambda p: [IMAGE_START_ID] + load_tokenizer().encode(p) + [IMAGE_END_ID], ["does not run BPE"]),
        (
            lambda p: (
                [IMAGE_START_ID] + [ord(c) for c in p] + [IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(p)) + [IMAGE_END_ID]
            ),
            ["one id per character", "UTF-8 byte"],
        ),
        (lambda p: [IMAGE_START_ID] + list(p.encode()) + [IMAGE_END_ID], ["same length whatever the path"]),
        (
            lambda p: (
                [IMAGE_START_ID]
                + list(p.encode())
                + [IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - 2 - len(p.encode()))
                + [IMAGE_END_ID]
            ),
            ["same length whatever the path"],
        ),
        (
            lambda p: (
                [IMAGE_START_ID]
                + list(p.encode())
                + [ENDOFTEXT_ID] * (IMG_TOKEN_SPAN - len(p.encode()))
                + [IMAGE_END_ID]
            ),
            ["padding", "its own special token"],
        ),
        (
            without_long_check(
                lambda p, d: [IMAGE_START_ID] + d + [IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(d)) + [IMAGE_END_ID]
            ),
            ["cannot be written into a span", "raise ValueError"],
        ),
        (refuses_a_full_span, ["raised ValueError, but the path fits"]),
        (lambda p: learner_span(p) if len(p.encode()) < 100 else None, ["returned None"]),
        (lambda p: " ".join(map(str, learner_span(p))), ["list of ints"]),
    ],
)
def test_image_span_hints_at_typical_mistakes(wrong, words, tokenizer):
    expected = [tokenizer.encode_image_span(p) for p in exercises.nb01.SPAN_PATHS]
    assert_hint(check("01.1", wrong), *words, without=[str(e) for e in expected] + [str(e[1:-1]) for e in expected])


def test_image_span_errors_of_the_learners_code_become_hints():
    def my_image_span(path):
        return [IMAGE_START_ID] + list(path.encode())[300] + [IMAGE_END_ID]

    assert_hint(check("01.1", my_image_span), "raised IndexError")
    assert_hint(check("01.1", lambda p: learner_span(p) if p.isascii() else torch.zeros(3) + "x"), "raised TypeError")
    assert_hint(
        check("01.1", lambda p: learner_span(p) if len(p) < 300 else {}["x"]), "raise ValueError", "raised KeyError"
    )
    assert_hint(check("01.1", learner_span(PAIR[0])), "the function itself")


# 01.2: the length of a chat with two pictures


def test_pair_length(tokenizer):
    query = tokenizer.from_list_format([{"image": p} for p in PAIR] + [{"text": CHATS[1][1]}])
    raw_text, ids = make_context(tokenizer, query)
    assert check("01.2", len(ids))
    assert_hint(check("01.2", len(raw_text)), "characters", without=[len(ids)])
    assert_hint(check("01.2", len(tokenizer.encode(query))), "chat frame", without=[len(ids)])
    assert_hint(check("01.2", len(ids) - 2 * (IMG_TOKEN_SPAN + 2)), "too few", without=[len(ids)])
    assert_hint(check("01.2", len(ids) + 1), "too many", without=[len(ids)])
    assert_hint(check("01.2", str(len(ids))), "an int")
    assert_hint(check("01.2", True), "an int")


# 01.3: the longest path of 3-byte characters


def test_longest_chinese_path():
    longest = IMG_TOKEN_SPAN // len("图".encode())
    assert check("01.3", longest)
    for wrong in (IMG_TOKEN_SPAN, IMG_TOKEN_SPAN * 3, longest + 1):
        assert_hint(check("01.3", wrong), "too many", without=[longest])
    assert_hint(check("01.3", longest - 1), "too few", without=[longest])
    assert_hint(check("01.3", 0), "at least one", without=[longest])
    assert_hint(check("01.3", float(longest)), "an int")


# 01.4: the position of </img>


def test_end_position():
    assert check("01.4", lambda a: a + IMG_TOKEN_SPAN + 1)
    assert check("01.4", lambda a: torch.tensor(a + IMG_TOKEN_SPAN + 1))
    assert_hint(check("01.4", lambda a: a + IMG_TOKEN_SPAN), "too early")
    assert_hint(check("01.4", lambda a: a + IMG_TOKEN_SPAN + 2), "too far")
    assert_hint(check("01.4", lambda a: 276), "count the ids between the tags", without=["540"])
    assert_hint(check("01.4", lambda a: None), "not attempted yet")
    assert_hint(check("01.4", lambda a: float(a + IMG_TOKEN_SPAN + 1)), "an int")
    assert_hint(check("01.4", 276), "the function itself")


# 02.1: locate_img_pos written by hand


def learner_locate(input_ids):
    """A learner's correct locate_img_pos: tags paired row by row."""
    rows = []
    for i, row in enumerate(input_ids.tolist()):
        starts = [k for k, t in enumerate(row) if t == IMAGE_START_ID]
        ends = [k for k, t in enumerate(row) if t == IMAGE_END_ID]
        if len(starts) != len(ends) or any(b < a for a, b in zip(starts, ends)):
            raise ValueError(f"row {i}: the image tags do not pair up")
        rows += [(i, a, b) for a, b in zip(starts, ends)]
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 3)


def article_locate(input_ids):
    """The articles' three lines."""
    bos_pos = torch.where(input_ids == IMAGE_START_ID)
    eos_pos = torch.where(input_ids == IMAGE_START_ID + 1)
    return torch.stack((bos_pos[0], bos_pos[1], eos_pos[1]), dim=1)


def counting_locate(input_ids):
    """The articles' lines with one count over the whole batch."""
    if (input_ids == IMAGE_START_ID).sum() != (input_ids == IMAGE_END_ID).sum():
        raise ValueError("unbalanced image tags")
    return article_locate(input_ids)


def test_locate_accepts_right_functions():
    assert check("02.1", locate_img_pos)
    assert check("02.1", learner_locate)
    assert check("02.1", lambda ids: learner_locate(ids).int())  # any integer dtype


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda ids: None, ["not attempted yet"]),
        (article_locate, ["second </img> is missing", "raised RuntimeError", "raise a ValueError"]),
        (counting_locate, ["stray one", "without complaint", "row on its own"]),
        (lambda ids: learner_locate(ids) + torch.tensor([0, 1, -1]), ["off by one", "</img> themselves"]),
        (lambda ids: learner_locate(ids) + torch.tensor([0, 1, 0]), ["off by one"]),
        (
            lambda ids: torch.tensor([tuple(r) for r in learner_locate(ids).tolist()]),
            ["without any picture", "two dimensions"],
        ),
        (lambda ids: learner_locate(ids)[torch.argsort(learner_locate(ids)[:, 1])], ["another order"]),
        (lambda ids: learner_locate(ids).float(), ["integer tensor"]),
        (lambda ids: learner_locate(ids)[:, 1:], ["shape", "three numbers each"]),
        (lambda ids: learner_locate(ids)[:1], ["row(s)"]),
        (lambda ids: learner_locate(ids).flip(1), ["row 0 of yours", "batch index"]),
        (lambda ids: {}["row"], ["raised KeyError"]),
        (lambda ids: learner_locate(ids) if ids.shape[0] == 1 else None, ["row 1 has two pictures", "returned None"]),
    ],
)
def test_locate_hints_at_typical_mistakes(wrong, words):
    batch = exercises.nb02.padded(exercises.nb02.THREE_CHATS)
    assert_hint(check("02.1", wrong), *words, without=[locate_img_pos(batch).tolist()])


def test_locate_is_checked_on_batches_with_two_pictures_in_a_row_and_without_pictures():
    batches = dict(exercises.nb02._batches())
    counts = {name: torch.bincount(locate_img_pos(b)[:, 0], minlength=len(b)).tolist() for name, b in batches.items()}
    assert [2] in [c[1:2] for c in counts.values()] and [0, 0] in counts.values() and [1, 0] in counts.values()
    for name, batch in exercises.nb02._broken_batches():
        with pytest.raises(ValueError):
            locate_img_pos(batch)


# 02.2: img_pos of a right-padded batch


def test_right_padding(tokenizer):
    rows = [chat_ids(tokenizer, *chat) for chat in CHATS]
    length = max(map(len, rows))
    right = torch.tensor([r + [ENDOFTEXT_ID] * (length - len(r)) for r in rows])
    left = torch.tensor([[ENDOFTEXT_ID] * (length - len(r)) + r for r in rows])
    expected = locate_img_pos(right)
    assert check("02.2", expected) and check("02.2", expected.tolist())
    assert_hint(check("02.2", locate_img_pos(left)), "left-padded", without=[expected.tolist()])
    assert_hint(check("02.2", expected[:3]), "one row per picture", without=[expected.tolist()])
    assert_hint(check("02.2", expected + 1), "where does each prompt start", without=[expected.tolist()])
    assert_hint(check("02.2", expected.float()), "integer tensor")
    assert_hint(check("02.2", "img_pos"), "tensor")


# 02.3: feature rows for the batch


def test_feature_rows(tokenizer):
    pictures = sum(len(p) for p, _ in CHATS)
    right = pictures * IMG_TOKEN_SPAN
    assert check("02.3", right)
    assert_hint(check("02.3", pictures), "counts the pictures", without=[right])
    assert_hint(check("02.3", len(CHATS) * IMG_TOKEN_SPAN), "every picture", without=[right])
    assert_hint(check("02.3", pictures * (IMG_TOKEN_SPAN + 2)), "tags keep their own ids", without=[right])
    assert_hint(check("02.3", right + 1), "as many rows as its span", without=[right])
    assert_hint(check("02.3", float(right)), "an int")
