"""Notebook 03's exercises: placing fake prompt ids into the image spans, and the numbers around them."""

import torch

from ...fake_ids import make_fake_prompt_ids, replace_image_spans
from ...img_pos import locate_img_pos
from ...limits import BuildConfig
from ...tokenizing import (
    ENDOFTEXT_ID,
    IMAGE_END_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    MODEL_VOCAB_SIZE,
    TOKENIZER_VOCAB_SIZE,
    load_tokenizer,
    make_context,
)
from . import exercise, whole_number
from .selfcheck import Question, right, wrong

NOT_ATTEMPTED = "not attempted yet: your function returns None; write its body so that it returns its result"
SHORT_SPANS = "spans of 3 ids instead of 256"  # the case that tells a span read from img_pos from one of 256 assumed


def number_hint(answer, expected: int, known: dict) -> str | None:
    """None when `answer` is `expected`; else the hint `known` holds for that wrong value, or a general one."""
    value = whole_number(answer)
    if value is None:
        return f"give one whole number (an int), not {type(answer).__name__} {answer!r}"
    if value == expected:
        return None
    return known.get(value, "not that number: go back to the section that builds these ids and recount")


def chat_batch(rows) -> torch.Tensor:
    """Left-padded context ids [B, L] of chat turns; rows[b] is (picture names, question)."""
    tokenizer = load_tokenizer()
    ids = [
        make_context(tokenizer, tokenizer.from_list_format([{"image": p} for p in pictures] + [{"text": q}]))[1]
        for pictures, q in rows
    ]
    length = max(map(len, ids))
    return torch.tensor([[ENDOFTEXT_ID] * (length - len(r)) + r for r in ids])  # [B, L]


def span_cases():
    """(description, input_ids, img_pos, fake_prompt_id) on which a replace_image_spans is compared with the package."""
    one = chat_batch([(["red_circle.png"], "What is in the picture?")])
    two = chat_batch([(["pair_a.png", "pair_b.png"], "Which picture has a red triangle?")])
    batch = chat_batch(
        [(["red_circle.png"], "图片里是什么？"), (["pair_a.png", "pair_b.png"], "哪张图片里有红色的三角形？")]
    )
    mixed = chat_batch(
        [
            ([], "Hello!"),
            (["blue_square.png"], "What color is the square?"),
            (["three_shapes.png"], "How many shapes are there?"),
        ]
    )
    per_request = torch.cat([make_fake_prompt_ids(MODEL_VOCAB_SIZE, 1), make_fake_prompt_ids(MODEL_VOCAB_SIZE, 1)])
    short = torch.tensor([[7, IMAGE_START_ID, 0, 0, 0, IMAGE_END_ID, 8, IMAGE_START_ID, 0, 0, 0, IMAGE_END_ID, 9]])
    cases = [
        ("one picture", one, None),
        ("two pictures in one row", two, None),
        ("a batch of two left-padded rows, the second with two pictures", batch, None),
        (
            "a batch of three rows, the first without a picture, fake ids restarting in every request",
            mixed,
            per_request,
        ),
    ]
    out = []
    for name, ids, fake in cases:
        img_pos = locate_img_pos(ids)  # [N, 3]
        fake = make_fake_prompt_ids(MODEL_VOCAB_SIZE, len(img_pos)) if fake is None else fake  # [N, 256]
        out.append((name, ids, img_pos, fake))
    out.append(
        (
            SHORT_SPANS,
            short,
            locate_img_pos(short, span=3),
            make_fake_prompt_ids(MODEL_VOCAB_SIZE, 2, tokens_per_image=3),
        )
    )
    return out


def span_hint(name: str, ids, img_pos, fake, result) -> str | None:
    """None when `result` equals the package's replace_image_spans; else what is wrong with it, for case `name`."""
    expected = replace_image_spans(ids, img_pos, fake)  # [B, L]
    if not isinstance(result, torch.Tensor):
        return f"return the new ids as a torch tensor [B, L], not a {type(result).__name__} ({name})"
    if tuple(result.shape) != tuple(expected.shape) and result.numel() == expected.numel():
        return (
            f"the result has shape {tuple(result.shape)} but input_ids has shape {tuple(ids.shape)}: keep the "
            f"batch dimension, return ids [B, L] even for a batch of one ({name})"
        )
    if tuple(result.shape) != tuple(expected.shape):
        return (
            f"the result has shape {tuple(result.shape)} but input_ids has shape {tuple(ids.shape)}: the "
            f"sequences keep their length, a span is replaced in place ({name})"
        )
    if result.dtype.is_floating_point or result.dtype == torch.bool:
        return f"the ids came back as {result.dtype}: keep them integer token ids ({name})"
    result = result.long()
    inside = torch.zeros_like(expected, dtype=torch.bool)  # [B, L]: the ids between the tags
    for i, a, b in img_pos.tolist():
        inside[i, a + 1 : b] = True
    wrong_outside = (result != expected) & ~inside  # [B, L]
    if wrong_outside.any():
        tags = (expected == IMAGE_START_ID) | (expected == IMAGE_END_ID)
        if not (wrong_outside & ~tags).any():
            return f"an <img> or </img> tag was overwritten: the fake ids go strictly between the two tags ({name})"
        return (
            f"ids outside the image spans changed ({name}): only the ids between <img> and </img> are "
            "replaced, and each picture's span lies in the row that img_pos names"
        )
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        if not torch.equal(result[i, a + 1 : b], expected[i, a + 1 : b]):
            return (
                f"the span of picture {k} (row {i}) does not hold that picture's row of fake_prompt_id ({name}); "
                "picture k of img_pos takes row k"
            )
    return None


@exercise(
    "03.1", "Write replace_image_spans(input_ids, img_pos, fake_prompt_id): each picture's span gets its fake ids"
)
def check_replace_image_spans(my_replace):
    """Compare the learner's function with the package's on single pictures, two in a row, and batches."""
    if not callable(my_replace):
        return f"pass your function itself (my_replace_image_spans), not a {type(my_replace).__name__}"
    for name, ids, img_pos, fake in span_cases():
        given = ids.clone()
        try:
            result = my_replace(given, img_pos.clone(), fake.clone())
        except (RuntimeError, IndexError) as err:
            if name == SHORT_SPANS:
                return (
                    f"on {name} your function raised {type(err).__name__}: the slice must run from a + 1 to b, "
                    "the positions img_pos gives; do not assume 256"
                )
            raise
        except ValueError as err:
            if name == SHORT_SPANS:
                return (
                    f"on {name} your function raised ValueError ({err}): use the img_pos you are given rather than "
                    "finding the spans again; the check includes spans that are not 256 ids long"
                )
            raise
        if result is None:
            return NOT_ATTEMPTED
        if not torch.equal(given, ids):
            return (
                f"your function changed the input_ids it was given ({name}): work on a copy, the caller's ids "
                "must stay as they were"
            )
        hint = span_hint(name, ids, img_pos, fake, result)
        if hint is not None:
            return hint
    return None


@exercise("03.2", "How many ids lie between the tokenizer's last id and the first fake id?")
def check_gap(answer):
    """The padding rows of the embedding: ids no token uses, below the first fake id."""
    return number_hint(
        answer,
        MODEL_VOCAB_SIZE - TOKENIZER_VOCAB_SIZE,
        {
            MODEL_VOCAB_SIZE - ENDOFTEXT_ID: "that counts the special tokens too: start after the tokenizer's last id",
            TOKENIZER_VOCAB_SIZE - ENDOFTEXT_ID: "that is the number of special tokens; the gap comes after them",
            MODEL_VOCAB_SIZE - TOKENIZER_VOCAB_SIZE + 1: "off by one: the tokenizer's last id and the first fake id "
            "themselves are not in the gap",
            MODEL_VOCAB_SIZE
            - TOKENIZER_VOCAB_SIZE
            - 1: "off by one: len(tokenizer) is one past the tokenizer's last id",
        },
    )


@exercise(
    "03.3", "A batch holds 3 pictures in the python-session convention: what is the third picture's first fake id?"
)
def check_third_first_id(answer):
    """Ids increase over all pictures of the batch: picture k starts 256·k past vocab_size."""
    ids = make_fake_prompt_ids(MODEL_VOCAB_SIZE, 3)  # [3, 256]
    wrong_start = make_fake_prompt_ids(ENDOFTEXT_ID, 3)
    return number_hint(
        answer,
        int(ids[2, 0]),
        {
            int(ids[0, 0]): "that is the first picture's first id; in this convention the ids go on increasing over "
            "all pictures of the batch",
            int(ids[1, 0]): "that is the second picture's first id: pictures are counted from 0",
            int(ids[1, -1]): "that is the second picture's last id",
            int(ids[2, -1]): "that is the third picture's last id, not its first",
            int(ids[2, -1]) + 1: "that id would come after the third picture's span",
            int(wrong_start[2, 0]): "fake ids start at the model's vocab_size, not at 151643",
        },
    )


@exercise(
    "03.4",
    "TensorRT-LLM's Qwen-VL README builds with --max_prompt_embedding_table_size 2048 --max_batch_size 8: how many "
    "pictures may one request hold under in-flight batching (the C++ executor)?",
)
def check_images_per_request(answer):
    """Each request's block is rows_per_request = 2048 / 8 rows (8: the runtime's max batch size, by default the
    engine's); a picture takes 256 of them."""
    build = BuildConfig(max_batch_size=8, max_prompt_embedding_table_size=2048)
    return number_hint(
        answer,
        build.rows_per_request // IMG_TOKEN_SPAN,
        {
            build.max_prompt_embedding_table_size
            // IMG_TOKEN_SPAN: "that many pictures fill the whole table; the C++ executor divides it into one "
            "block for each position of a step's batch, as many as the runtime's max batch size (the engine's "
            "max_batch_size by default)",
            build.rows_per_request: "that is a request's share of rows; how many pictures of 256 rows fit in it?",
            0: "then no request could send a picture: compute a request's share of the rows first",
        },
    )


def SELF_CHECK():
    """Notebook 03's self-check: its right options computed by the package."""
    three = make_fake_prompt_ids(MODEL_VOCAB_SIZE, 3)  # [3, 256]
    readme = BuildConfig(max_batch_size=8, max_prompt_embedding_table_size=2048)
    return (
        Question(
            "Where do the fake prompt ids start for Qwen-VL-Chat?",
            (
                wrong(str(ENDOFTEXT_ID), "151643 is `<|endoftext|>`, the first special token: it has a word embedding"),
                wrong(str(TOKENIZER_VOCAB_SIZE), "151860 … 151935 are the embedding's padding rows, still word rows"),
                right(
                    str(int(three[0, 0])), "the model's `config.vocab_size`: every id from there is read from the table"
                ),
                wrong("200000", "article 1's round number; run.py numbers on from `vocab_size`"),
            ),
        ),
        Question(
            "In run.py's Python session a batch holds 2 pictures. Which fake id opens the second picture's span?",
            (
                wrong(str(int(three[0, 0])), "that opens the first; in this convention the ids go on across the batch"),
                right(str(int(three[1, 0])), "`vocab_size + 256 · 1`: one table, ids increasing over every picture"),
                wrong(str(int(three[0, -1])), "that is the first picture's last id"),
                wrong(str(ENDOFTEXT_ID + IMG_TOKEN_SPAN), "fake ids start at the model's `vocab_size`, not at 151643"),
            ),
        ),
        Question(
            "Under in-flight batching (the C++ executor), what decides which block of rows a request's fake ids read?",
            (
                wrong(
                    "the number of pictures of the batch's fullest request",
                    "the block size does not depend on the pictures: max_prompt_embedding_table_size (fixed at build) "
                    "/ the runtime's max batch size (the engine's max_batch_size unless ModelRunnerCpp.from_dir("
                    "max_batch_size=…) lowers it)",
                ),
                right(
                    "its position b in this step's batch: its table is copied to row b × the block, and its task is b",
                    "promptTuningBuffers.cpp copies each step's tables again; the position can change from step to step",
                ),
                wrong(
                    "a slot the request keeps for its whole life",
                    "tasks are positions in the step's batch, renumbered every step",
                ),
                wrong(
                    "its fake ids, which start past the previous request's",
                    "every request's fake ids start at `vocab_size`",
                ),
            ),
        ),
        Question(
            "TensorRT-LLM's README engine (2048 rows, max_batch_size 8), run with its own max batch size, gets a "
            "request with two pictures under in-flight batching. What happens?",
            (
                wrong("it is answered", f"a request's block holds {readme.rows_per_request} rows: one picture"),
                right(
                    f"it is refused: the block holds {readme.rows_per_request} rows, the two pictures need 512",
                    "the batch manager throws 'Prompt vocab size … is larger than max prompt vocab size'",
                ),
                wrong("the second picture is dropped", "nothing is dropped silently; the request is refused"),
            ),
        ),
    )
