"""Notebook 04's exercises: TensorRT-LLM's prompt-table lookup with `tasks`, and a table no picture made."""

from functools import lru_cache

import torch

from ...chat import ModelAsRunner, ask_batch
from ...limits import BuildConfig
from ...modeling import QWenVLConfig
from ...prompt_table import per_request_tables, prompt_tuning_embedding, rows_read, single_table_batch
from ...resources import images_dir
from ...tokenizing import (
    ENDOFTEXT_ID,
    IMAGE_END_ID,
    IMAGE_PAD_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    MODEL_VOCAB_SIZE,
    load_tokenizer,
)
from ...toy import load_course_model
from ...toy.make_samples import SAMPLES
from ...toy.shapes import Scene, Shape, describe
from . import exercise
from .nb03 import NOT_ATTEMPTED
from .selfcheck import Question, right, wrong

ENGINE_BLOCKS = BuildConfig(max_batch_size=4, max_prompt_embedding_table_size=2048)  # notebook 05's engine: 512 rows


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
            "the notebook's ten-id vocabulary and four-row table, tasks 0 and 1",
            torch.tensor([[3, 10, 11, 5], [7, 10, 11, 2]]),
            torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 2),  # row t is (t, t)
            torch.tensor([[100.0, -100.0], [101.0, -101.0], [102.0, -102.0], [103.0, -103.0]]),
            torch.tensor([0, 1]),
            torch.tensor([2]),
            10,
        ),
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
    block = ENGINE_BLOCKS.rows_per_request
    cases.append(
        (
            "two requests in the blocks of an engine's whole table (2048 rows, blocks of 512: more rows than they use)",
            torch.tensor([[10, 11, 12, 3], [10, 2, 11, 12]]),
            small_vocab,
            torch.randn(ENGINE_BLOCKS.max_prompt_embedding_table_size, 4, generator=gen),
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([block], dtype=torch.int32),
            10,
        )
    )
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
    fake, tasks = ids >= vocab_size, tasks.long()  # [B, L], [B]

    def rows_by(block):  # the rows the fake ids read with tasks of `block` rows each
        return rows_read(ids, tasks, block, vocab_size)  # [B, L]

    right = rows_by(int(task_vocab_size))

    def reads(rows):  # whether `got` is what the fake ids read at `rows`, wherever those rows exist
        rows = rows[fake]
        there = (rows >= 0) & (rows < len(table))
        return bool(there.any()) and torch.equal(got[there], table[rows[there]])

    if reads(rows_by(0)):
        return (
            f"the fake ids ignore `tasks` ({name}): a sequence whose task is not 0 reads another task's block of rows"
        )
    if reads(right + 1) or reads(right - 1):
        return f"off by one ({name}): the id vocab_size itself reads the first row of its task's block"
    if reads(rows_by(1)):
        return f"the task is added as a row count ({name}): each task owns a whole block of task_vocab_size rows"
    if reads(rows_by(len(table) // len(tasks))):
        return (
            f"the block size was inferred from the table's rows ({name}): a table may hold more rows than its tasks "
            "use (an engine's whole buffer); the block is task_vocab_size"
        )
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
        try:
            result = my_lookup(*given, vocab_size)
        except IndexError as err:
            return (
                f"your function indexed past a table ({name}: {err}): the first fake id is vocab_size itself "
                "(id ≥ vocab_size), and fake ids must not index the word embedding (clamp them, or mask first)"
            )
        if result is None:
            return NOT_ATTEMPTED
        if not all(torch.equal(g, t) for g, t in zip(given, (ids, vocab_embedding, table, tasks, task_vocab_size))):
            return f"your function changed one of its inputs ({name}): the tables and ids must stay as they were"
        hint = lookup_hint(case, result)
        if hint is not None:
            return hint
    return None


BLEND = ("blue_square.png", "green_triangle.png")  # exercise 04.2: the two pictures whose features are averaged
BLEND_QUESTION, BLEND_IDS = "图片里是什么？", "red_circle.png"  # the request whose ids are kept


@lru_cache(maxsize=1)
def blend_answers() -> dict:
    """The course model's answers to BLEND_QUESTION about BLEND_IDS's ids, reading each table that matters here."""
    model, tokenizer = load_course_model(), load_tokenizer()
    names = [BLEND_IDS, *BLEND]
    with torch.inference_mode():
        features = model.transformer.visual.encode([images_dir() / name for name in names])  # [3, 256, H]
    tables = {**dict(zip(names, features)), "blend": features[1:].mean(dim=0)}
    request = [([images_dir() / BLEND_IDS], BLEND_QUESTION)]
    return {
        name: ask_batch(ModelAsRunner(model), None, tokenizer, request, input_vit=table[None], max_new_tokens=24)[0]
        for name, table in tables.items()
    }


def blend_guesses() -> set[str]:
    """The answers one can tell from BLEND's two pictures without running: a colour of one with a shape of either."""
    shapes = [shape for name in BLEND for shape in SAMPLES[name].shapes]
    return {describe(Scene((Shape(kind.kind, color.color, kind.box),)), "zh") for color in shapes for kind in shapes}


@exercise(
    "04.2",
    f"Keep red_circle.png's fake ids and read a table that averages {BLEND[0]}'s and {BLEND[1]}'s features: "
    "what does the model answer, exactly?",
)
def check_table_decides(answer):
    """Only running it tells: the ids name no picture, and the averaged table is a picture no camera took."""
    if not isinstance(answer, str):
        return f"give the model's answer as a string, exactly as answers_with returns it, not a {type(answer).__name__}"
    answers = blend_answers()
    if answer.strip() == answers["blend"]:
        return None
    if answer.strip() == answers[BLEND_IDS]:
        return (
            "that is the answer about the picture whose span the ids came from; after replace_image_spans the ids "
            "name no picture: run answers_with with the averaged table"
        )
    if answer.strip() in (answers[BLEND[0]], answers[BLEND[1]]):
        return "that is one of the two pictures' own answer; the averaged table is neither picture: run it"
    if answer.strip() in blend_guesses():
        return (
            "that answer is a guess from the two pictures (one's colour, the other's shape); what the model makes of "
            "an averaged table no reasoning tells: run it"
        )
    return (
        "run answers_with(fake_ids, (blue + green) / 2, tasks, task_vocab_size)[0], each [256, H] block from "
        "visual.encode, and give its answer exactly"
    )


def SELF_CHECK():
    """Notebook 04's self-check: its right options computed by the package."""
    fake_id, task, task_vocab_size = 152000, 2, IMG_TOKEN_SPAN
    row = int(lookup_row(fake_id, task, task_vocab_size))
    chat = QWenVLConfig()
    return (
        Question(
            "What shape has `input_vit` for N pictures on Qwen-VL-Chat?",
            (
                wrong("[N, 196, 768]", "article 1's numbers, a generic ViT-B/16 on 224×224 pictures"),
                wrong(
                    f"[N, 1024, {chat.visual['width']}]",
                    "those are the patches inside the tower; its resampler turns them into 256 rows",
                ),
                right(
                    f"[N, {IMG_TOKEN_SPAN}, {chat.visual['output_dim']}]",
                    "256 queries of the resampler, each a vector of the language model's hidden size",
                ),
                wrong("it depends on the picture's size", "every picture is resized to 448×448 first"),
            ),
        ),
        Question(
            f"Fake id {fake_id}, in a sequence whose task is {task}, with `task_vocab_size` {task_vocab_size}: which "
            "row of the prompt table does it read?",
            (
                wrong(str(fake_id - MODEL_VOCAB_SIZE), "that ignores the task: task 2 reads its own block"),
                right(str(row), "`(id − 151936) + task · task_vocab_size`"),
                wrong(str(row + 1), "off by one: the id 151936 itself reads the first row of a block"),
                wrong(str(fake_id), "a fake id is not a row number: subtract `vocab_size` first"),
            ),
        ),
        Question(
            "Every row of the prompt table is set to zero. What reaches the model between `<img>` and `</img>`?",
            (
                right("256 zero vectors, the same for every picture", "so every picture gets the same answer"),
                wrong("the word embeddings of the fake ids", "ids ≥ vocab_size never read the word embedding"),
                wrong("nothing: the span is skipped", "the positions stay; they hold whatever the table holds"),
                wrong(
                    "the picture still, since its path is in the ids",
                    "the path was replaced by fake ids in notebook 03",
                ),
            ),
        ),
        Question(
            "At inference, what is `prompt_table`?",
            (
                wrong(
                    "a dictionary from fake ids to features", "`ptuning_setup` only reshapes `input_vit` and casts it"
                ),
                wrong(
                    "a parameter of the model, updated by gradients",
                    "that is prompt tuning's training, where the table's idea comes from; here nothing is trained",
                ),
                right(
                    "a tensor handed to the engine at run time, next to the ids",
                    "in TensorRT-LLM the input `prompt_embedding_table`: the same engine serves every picture",
                ),
            ),
        ),
    )


def lookup_row(fake_id: int, task: int, task_vocab_size: int) -> int:
    """The table row a fake id of a sequence with `task` reads, by the package's lookup."""
    table = torch.arange(task_vocab_size * (task + 1), dtype=torch.float32)[:, None]  # row r holds r
    vocab = torch.zeros(MODEL_VOCAB_SIZE, 1)
    ids, tasks = torch.tensor([[fake_id]]), torch.tensor([task])
    return int(prompt_tuning_embedding(ids, vocab, table, tasks, task_vocab_size, MODEL_VOCAB_SIZE)[0, 0, 0])
