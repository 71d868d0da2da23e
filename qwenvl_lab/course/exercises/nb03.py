"""Notebook 03's exercises: placing fake prompt ids into the image spans, and the numbers around them."""

import torch

from ...fake_ids import make_fake_prompt_ids, replace_image_spans
from ...img_pos import locate_img_pos
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


@exercise("03.3", "A batch holds 5 pictures, numbered run.py's way: what is the fifth picture's first fake id?")
def check_fifth_first_id(answer):
    """Ids increase over all pictures of the batch: picture k starts 256·k past vocab_size."""
    ids = make_fake_prompt_ids(MODEL_VOCAB_SIZE, 5)  # [5, 256]
    wrong_start = make_fake_prompt_ids(ENDOFTEXT_ID, 5)
    return number_hint(
        answer,
        int(ids[4, 0]),
        {
            int(ids[0, 0]): "that is the first picture's first id; in this convention the ids go on increasing over "
            "all pictures of the batch",
            int(ids[3, 0]): "that is the fourth picture's first id: pictures are counted from 0",
            int(ids[3, -1]): "that is the fourth picture's last id",
            int(ids[4, -1]): "that is the fifth picture's last id, not its first",
            int(ids[4, -1]) + 1: "that id would come after the fifth picture's span",
            MODEL_VOCAB_SIZE + 5 * IMG_TOKEN_SPAN: "that id would come after the fifth picture's span",
            int(wrong_start[4, 0]): "fake ids start at the model's vocab_size, not at 151643",
        },
    )


def SELF_CHECK():
    """Notebook 03's self-check: its right options computed by the package."""
    three = make_fake_prompt_ids(MODEL_VOCAB_SIZE, 3)  # [3, 256]
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
            "What does `replace_image_spans` change in `input_ids`?",
            (
                right(
                    "the 256 ids between each `<img>` and its `</img>`, nothing else",
                    "the tags and the text stay, and the sequence keeps its length",
                ),
                wrong(
                    "the tags too, so that the span is 258 fake ids", "the tags keep their ids; only the span changes"
                ),
                wrong(
                    "the length: the path's bytes go, the 256 fake ids come in",
                    "the span was always 256 ids, path bytes and `<imgpad>` together",
                ),
            ),
        ),
    )
