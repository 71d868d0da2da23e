"""Notebook 04's exercises: TensorRT-LLM's prompt-table lookup with `tasks`, and what reaches the model."""

import torch

from ..prompt_table import per_request_tables, prompt_tuning_embedding, single_table_batch
from ..tokenizing import ENDOFTEXT_ID, IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE
from . import exercise
from .nb03 import NOT_ATTEMPTED, number_hint, whole_number


def picture_row(pictures: int, text: int, length: int) -> list[int]:
    """Left-padded ids of one request: `text` word ids, then `pictures` image spans of <imgpad>, to `length` ids."""
    ids = list(range(100, 100 + text))
    for _ in range(pictures):
        ids += [IMAGE_START_ID] + [IMAGE_PAD_ID] * IMG_TOKEN_SPAN + [IMAGE_END_ID] + [198]
    return [ENDOFTEXT_ID] * (length - len(ids)) + ids


def lookup_cases():
    """(description, input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size) to compare on."""
    gen = torch.Generator().manual_seed(4)
    small_vocab = torch.randn(10, 4, generator=gen)  # V = 10, H = 4
    cases = [
        (
            "one sequence, task 0",
            torch.tensor([[1, 10, 11, 12, 9, 0]]),
            small_vocab,
            torch.randn(3, 4, generator=gen),
            torch.tensor([0], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32),
            10,
        ),
        (
            "two sequences with tasks 0 and 1",
            torch.tensor([[10, 11, 2, 12], [3, 10, 11, 12]]),
            small_vocab,
            torch.randn(6, 4, generator=gen),
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([3], dtype=torch.int32),
            10,
        ),
        (
            "three sequences with tasks 2, 0 and 1, the second without fake ids",
            torch.tensor([[10, 11, 5, 9], [4, 4, 9, 4], [11, 10, 9, 0]]),
            small_vocab,
            torch.randn(6, 4, generator=gen),
            torch.tensor([2, 0, 1], dtype=torch.int32),
            torch.tensor([2], dtype=torch.int32),
            10,
        ),
    ]
    length = 2 * (IMG_TOKEN_SPAN + 3) + 6
    batch = torch.tensor([picture_row(1, 5, length), picture_row(2, 6, length)])  # [2, L]: 1 and 2 pictures
    input_vit = torch.randn(3, IMG_TOKEN_SPAN, 4, generator=gen)  # [N, 256, H]
    wte = torch.randn(MODEL_VOCAB_SIZE, 4, generator=gen)  # [V, H]
    for name, convention in [
        ("the real vocabulary, in-flight batching (per_request_tables)", per_request_tables),
        ("the real vocabulary, python session (single_table_batch)", single_table_batch),
    ]:
        ids, table, tasks, task_vocab_size = convention(batch, input_vit, MODEL_VOCAB_SIZE)
        cases.append(
            (name, ids, wte, table, tasks, torch.tensor([task_vocab_size], dtype=torch.int32), MODEL_VOCAB_SIZE)
        )
    return cases


def fake_rows_hint(name, ids, table, tasks, task_vocab_size, vocab_size, got) -> str:
    """What the learner's fake-id embeddings `got` [M, H] read instead of their rows, for case `name`."""
    fake = ids >= vocab_size  # [B, L]
    offset = ids - vocab_size  # [B, L]
    task_rows = (tasks.long() * int(task_vocab_size))[:, None].expand_as(ids)  # [B, L]

    def reads(rows):  # whether `got` is what the fake ids read at `rows`, wherever those rows exist
        rows = rows[fake]
        there = (rows >= 0) & (rows < len(table))
        return bool(there.any()) and torch.equal(got[there], table[rows[there]])

    if reads(offset):
        return (
            f"the fake ids ignore `tasks` ({name}): a sequence whose task is not 0 reads another task's block of rows"
        )
    if reads(offset + task_rows + 1) or reads(offset + task_rows - 1):
        return f"off by one ({name}): the id vocab_size itself reads the first row of its task's block"
    if reads(offset + tasks.long()[:, None].expand_as(ids)):
        return f"the task is added as a row count ({name}): each task owns a whole block of task_vocab_size rows"
    return (
        f"the fake ids (>= vocab_size) read the wrong rows of the prompt table ({name}): apply the lookup rule, "
        "task offset included"
    )


def lookup_hint(case, result) -> str | None:
    """None when `result` equals the package's prompt_tuning_embedding on `case`; else what is wrong."""
    name, ids, vocab_embedding, table, tasks, task_vocab_size, vocab_size = case
    expected = prompt_tuning_embedding(ids, vocab_embedding, table, tasks, task_vocab_size, vocab_size)  # [B, L, H]
    if not isinstance(result, torch.Tensor):
        return f"return the embeddings as a torch tensor [B, L, H], not a {type(result).__name__} ({name})"
    if tuple(result.shape) != tuple(expected.shape):
        return (
            f"the result has shape {tuple(result.shape)} for input_ids of shape {tuple(ids.shape)}: return one "
            f"vector of the hidden size per id, [B, L, H] ({name})"
        )
    if result.dtype != expected.dtype:
        return f"the embeddings came back as {result.dtype}: keep the tables' dtype ({name})"
    fake = ids >= vocab_size  # [B, L]
    if not torch.equal(result[~fake], expected[~fake]):
        if torch.equal(result[~fake & (ids != vocab_size - 1)], expected[~fake & (ids != vocab_size - 1)]):
            return f"the id vocab_size − 1 is the vocabulary's last word, an ordinary id ({name})"
        return f"ids below vocab_size must read their own row of the word embedding ({name})"
    if not torch.equal(result[fake], expected[fake]):
        return fake_rows_hint(name, ids, table, tasks, task_vocab_size, vocab_size, result[fake])
    return None


@exercise(
    "04.1",
    "Write TensorRT-LLM's lookup prompt_tuning_embedding(input_ids, vocab_embedding, prompt_table, tasks, "
    "task_vocab_size, vocab_size), tasks included",
)
def check_prompt_tuning_embedding(my_lookup):
    """Compare the learner's lookup with the package's on batches with one and several tasks."""
    if not callable(my_lookup):
        return f"pass your function itself (my_prompt_tuning_embedding), not a {type(my_lookup).__name__}"
    for case in lookup_cases():
        name, ids, vocab_embedding, table, tasks, task_vocab_size, vocab_size = case
        given = [t.clone() for t in (ids, vocab_embedding, table, tasks, task_vocab_size)]
        result = my_lookup(*given, vocab_size)
        if result is None:
            return NOT_ATTEMPTED
        if not all(torch.equal(g, t) for g, t in zip(given, (ids, vocab_embedding, table, tasks, task_vocab_size))):
            return f"your function changed one of its inputs ({name}): the tables and ids must stay as they were"
        hint = lookup_hint(case, result)
        if hint is not None:
            return hint
    return None


@exercise(
    "04.2",
    "In-flight batching, tasks [0, 1], task_vocab_size 512: which table row does the fake id 151940 of request 1 read?",
)
def check_row_of_request_1(answer):
    """Row (id − V) + task · task_vocab_size for id 151940, task 1, task_vocab_size 512."""
    fake_id, task, task_vocab_size = 151940, 1, 512
    offset = fake_id - MODEL_VOCAB_SIZE
    return number_hint(
        answer,
        offset + task * task_vocab_size,
        {
            offset: "that is the row the id reads in request 0's block; request 1's task is 1",
            offset
            + task * task_vocab_size
            + 1: "off by one: the id vocab_size itself reads the first row of the block",
            offset
            + task * task_vocab_size
            - 1: "off by one: the id vocab_size itself reads the first row of the block",
            offset + IMG_TOKEN_SPAN: "task_vocab_size is 512 here (a request's share of rows), not 256",
            fake_id: "a fake id is not a row number itself: subtract vocab_size first",
            fake_id - 151643: "vocab_size is the model's 151936, not 151643",
        },
    )


BLUE_SQUARE = (("blue", "square"), ("蓝", "正方形"))  # words that name blue_square.png, in English and Chinese
RED_CIRCLE = (("red", "circle"), ("红", "圆"))


def names(answer: str, words) -> bool:
    """Whether `answer` names the shape that `words` describes, in either language."""
    text = answer.lower()
    return any(all(w in text for w in lang) for lang in words)


@exercise(
    "04.3", "Keep red_circle.png's fake ids, read blue_square.png's table: which picture does the answer describe?"
)
def check_table_decides(answer):
    """The ids name no picture any more: the table alone carries it."""
    if not isinstance(answer, str):
        return f"give the model's answer (or the picture's file name) as a string, not a {type(answer).__name__}"
    if names(answer, BLUE_SQUARE) and not names(answer, RED_CIRCLE):
        return None
    if names(answer, RED_CIRCLE):
        return (
            "the ids were built from red_circle.png's span, but after replace_image_spans do they still name a "
            "picture? Run answers_with with the other table and read what the model says"
        )
    return (
        "run answers_with(fake_ids, <the other picture's table>) and store the answer, or name the picture it describes"
    )


@exercise(
    "04.4",
    "A batch of 3 requests with 2, 0 and 1 pictures: how many table rows under the python-session "
    "convention and under in-flight batching? Answer (session_rows, in_flight_rows)",
)
def check_table_rows(answer):
    """One block per picture (session), or one equal block per request sized for the fullest request (in flight)."""
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return "give two whole numbers as a pair: (rows under the python session, rows under in-flight batching)"
    length = 2 * (IMG_TOKEN_SPAN + 3) + 6
    batch = torch.tensor([picture_row(2, 5, length), picture_row(0, 5, length), picture_row(1, 5, length)])  # [3, L]
    input_vit = torch.zeros(3, IMG_TOKEN_SPAN, 1)  # [N, 256, H]
    session = len(single_table_batch(batch, input_vit, MODEL_VOCAB_SIZE)[1])
    in_flight = len(per_request_tables(batch, input_vit, MODEL_VOCAB_SIZE)[1])
    session_given, in_flight_given = answer
    if whole_number(session_given) is None or whole_number(in_flight_given) is None:
        return f"give two whole numbers, got {answer!r}"
    hint = number_hint(
        session_given,
        session,
        {
            in_flight: "the python session's table has one block per picture, and nothing for a request without one",
        },
    )
    if hint is not None:
        return f"the python-session table: {hint}"
    hint = number_hint(
        in_flight_given,
        in_flight,
        {
            session: "under in-flight batching every request owns a block of the same size, big enough for the "
            "request with the most pictures",
            in_flight * 2 // 3: "the request without pictures keeps its slot too: tasks are slot numbers",
        },
    )
    return None if hint is None else f"the in-flight table: {hint}"
