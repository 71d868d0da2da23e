"""Notebook 02's exercises: `locate_img_pos` written by hand, `img_pos` of a right-padded batch, feature rows."""

import torch

from ...chat import make_prompt
from ...img_pos import locate_img_pos
from ...tokenizing import ENDOFTEXT_ID, IMAGE_END_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, load_tokenizer
from . import exercise, whole_number
from .nb01 import NOT_ATTEMPTED, PAIR
from .selfcheck import Question, right, wrong

RED, BLUE = "../data/images/red_circle.png", "../data/images/blue_square.png"
SHORT_SPAN = "a row whose first span lost 10 of its 256 ids (its tags in order)"
LONG_SPAN = "a row whose first span holds 10 ids more than 256 (its tags in order)"
THREE_CHATS = (
    ([RED], "图片里是什么？"),
    (list(PAIR), "哪张图片里有红色的三角形？"),
    ([BLUE], "What color is the square?"),
)


def padded(chats, side: str = "left") -> torch.Tensor:
    """The chats' context ids as one batch [B, L], padded with <|endoftext|> on `side`."""
    rows = [torch.tensor(make_prompt(load_tokenizer(), question, pictures)[1]) for pictures, question in chats]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=ENDOFTEXT_ID, padding_side=side)


def _batches() -> list[tuple[str, torch.Tensor]]:
    """The well-formed batches a learner's locate_img_pos must get right."""
    return [
        ("a single chat with one picture", padded(THREE_CHATS[:1])),
        ("a batch whose row 1 has two pictures", padded(THREE_CHATS)),
        ("a batch whose row 1 has no picture", padded([THREE_CHATS[0], ([], "你好")])),
        ("a batch without any picture", padded([([], "你好"), ([], "Describe a red circle.")])),
    ]


def _broken_batches() -> list[tuple[str, torch.Tensor]]:
    """Batches whose tags do not pair up in some row: a learner's locate_img_pos must raise ValueError."""
    missing = padded(THREE_CHATS[1:2])
    missing[0, torch.where(missing[0] == IMAGE_END_ID)[0][-1]] = 198  # the second </img> became a newline
    across = padded(THREE_CHATS[:2])
    across[0, torch.where(across[0] == IMAGE_END_ID)[0][0]] = 198  # row 0 loses its </img> …
    across[1, 3] = IMAGE_END_ID  # … and row 1 gets a stray one: as many of each tag in the batch as before
    reversed_tags = padded(THREE_CHATS[:1])
    ((_, a, b),) = locate_img_pos(reversed_tags).tolist()
    reversed_tags[0, a], reversed_tags[0, b] = IMAGE_END_ID, IMAGE_START_ID  # </img> … <img>: counts still agree
    nested = padded(THREE_CHATS[1:2])
    (_, _, b1), (_, a2, _) = locate_img_pos(nested).tolist()
    nested[0, b1], nested[0, a2] = IMAGE_START_ID, IMAGE_END_ID  # <img> <img> </img> </img> in one row
    one = padded(THREE_CHATS[:1])[0]  # [L]
    ((_, a, b),) = locate_img_pos(one[None]).tolist()
    overlapping = torch.cat([one[: b + 1], one[a + 1 : a + 11], one[b + 1 :]])[None]  # 10 more ids after </img>
    overlapping[0, a + 10], overlapping[0, b + 10] = IMAGE_START_ID, IMAGE_END_ID  # spans a…b and a+10…b+10
    two = padded(THREE_CHATS[1:2])  # [1, L]
    first = int(locate_img_pos(two)[0, 1])
    short = torch.cat([two[:, : first + 10], two[:, first + 20 :]], dim=1)  # 10 ids lost inside the first span
    long = torch.cat([two[:, : first + 10], two[:, first + 1 : first + 11], two[:, first + 10 :]], dim=1)  # 10 more
    return [
        ("a row whose second </img> is missing", missing),
        ("a batch where row 0 lost its </img> and row 1 has a stray one", across),
        ("a row whose </img> comes before its <img>", reversed_tags),
        ("a row with one image span nested in another", nested),
        ("a row with two overlapping spans of 256 ids each", overlapping),
        (SHORT_SPAN, short),
        (LONG_SPAN, long),
    ]


def _as_img_pos(value):
    """`value` as an integer tensor, or a hint (str) saying why it is not one."""
    try:
        got = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return f"return img_pos as a tensor (torch.stack / torch.tensor), got {type(value).__name__}"
    if got.numel() and (got.dtype.is_floating_point or got.dtype == torch.bool):  # torch.tensor([]) is float32
        return f"img_pos holds positions: an integer tensor, got dtype {got.dtype}"
    return got.long()


def _img_pos_hint(name: str, got: torch.Tensor, expected: torch.Tensor) -> str:
    """What is wrong with `got` as img_pos of batch `name` (not equal to the package's `expected`)."""
    if got.dim() != 2 or got.shape[1] != 3:
        if got.numel() == 0:
            return (
                f"on {name} yours has shape {tuple(got.shape)}; img_pos keeps its two dimensions even when it has "
                "no rows (one row per picture, three numbers each)"
            )
        return f"on {name} yours has shape {tuple(got.shape)}; img_pos has one row per picture, three numbers each"
    if got.shape[0] != expected.shape[0]:
        return f"on {name} yours has {got.shape[0]} row(s); img_pos has one row per <img>…</img> pair of the batch"
    if torch.equal(got[:, 0], expected[:, 0]) and int((got[:, 1:] - expected[:, 1:]).abs().max()) == 1:
        return (
            f"on {name} yours is off by one at a tag: img_pos holds the positions of <img> and </img> themselves, "
            "not of the span's ids"
        )
    if sorted(map(tuple, got.tolist())) == sorted(map(tuple, expected.tolist())):
        return f"on {name} your rows are right but in another order: list the pictures by batch row, then by position"
    k = next(k for k in range(len(got)) if not torch.equal(got[k], expected[k]))
    return (
        f"on {name} row {k} of yours is {got[k].tolist()}: check its batch index and the positions of both tags "
        "(torch.where on a [B, L] tensor returns the rows first, then the positions)"
    )


@exercise(
    "02.1",
    "Write my_locate_img_pos(input_ids [B, L]) → img_pos [N, 3]; raise ValueError when tags do not pair or a span "
    "does not hold 256 ids.",
)
def check_locate_img_pos(my_locate_img_pos):
    """The check of exercise 02.1: None when the answer is right, else a hint."""
    if not callable(my_locate_img_pos):
        return "give the function itself: check('02.1', my_locate_img_pos)"
    for k, (name, batch) in enumerate(_batches()):
        try:
            value = my_locate_img_pos(batch.clone())
        except Exception as err:  # the learner's error: a hint that names the batch
            return f"on {name} your function raised {type(err).__name__}: {err}"
        if value is None:
            return NOT_ATTEMPTED if k == 0 else f"on {name} your function returned None"
        got = _as_img_pos(value)
        if isinstance(got, str):
            return got
        expected = locate_img_pos(batch)
        if got.shape != expected.shape or not torch.equal(got, expected):
            return _img_pos_hint(name, got, expected)
    for name, batch in _broken_batches():
        try:
            my_locate_img_pos(batch.clone())
        except ValueError:
            continue
        except Exception as err:  # any error but ValueError leaves the learner guessing
            return (
                f"on {name} your function raised {type(err).__name__} ({err}), an error that does not say what "
                "is wrong: check the tags row by row and raise a ValueError that names the row"
            )
        if name in (SHORT_SPAN, LONG_SPAN):
            return (
                f"on {name} your function returned an img_pos without complaint: the tags pair up, but a span holds "
                "exactly 256 ids between its tags, one per row of its picture's features; check each span's length"
            )
        if any(word in name for word in ("before", "nested", "overlapping")):  # as many tags as ever, in every row
            return (
                f"on {name} your function returned an img_pos without complaint; equal counts are not enough: each "
                "<img> must be followed by its </img> before the next <img> opens, so check the order too"
            )
        return (
            f"on {name} your function returned an img_pos without complaint; the tags must pair up within each "
            "row: check every row on its own and raise ValueError when they do not"
        )
    return None


@exercise("02.2", "img_pos of the notebook's three chats padded on the right instead of the left.")
def check_right_padding(my_right_img_pos):
    """The check of exercise 02.2: None when the answer is right, else a hint."""
    got = _as_img_pos(my_right_img_pos)
    if isinstance(got, str):
        return got
    expected = locate_img_pos(padded(THREE_CHATS, "right"))
    if got.shape == expected.shape and torch.equal(got, expected):
        return None
    if got.shape == expected.shape and torch.equal(got, locate_img_pos(padded(THREE_CHATS, "left"))):
        return "that is img_pos of the left-padded batch; put the padding after each prompt instead"
    if got.dim() != 2 or got.shape[1] != 3 or got.shape[0] != expected.shape[0]:
        return f"yours has shape {tuple(got.shape)}; img_pos has one row per picture of the batch, three numbers each"
    return "some positions differ: with padding on the right, where does each prompt start?"


@exercise("02.3", "How many image feature rows (one per id of a span) does the notebook's batch need in total?")
def check_feature_rows(my_rows):
    """The check of exercise 02.3: None when the answer is right, else a hint."""
    if whole_number(my_rows) is None:
        return f"give a number of rows (an int), got {type(my_rows).__name__}"
    my_rows = whole_number(my_rows)
    img_pos = locate_img_pos(padded(THREE_CHATS))  # [N, 3]
    spans = (img_pos[:, 2] - img_pos[:, 1] - 1).tolist()
    if my_rows == sum(spans):
        return None
    if my_rows == len(spans):
        return "that counts the pictures; each picture brings one feature row per id of its span"
    if my_rows == len(THREE_CHATS) * IMG_TOKEN_SPAN:
        return "that counts one picture per sequence; count every picture of the batch"
    if my_rows == sum(spans) + 2 * len(spans):
        return "the tags keep their own ids: only the ids between <img> and </img> stand for the picture's features"
    return "each picture of the batch brings as many rows as its span has ids between the tags"


def SELF_CHECK():
    """Notebook 02's self-check: its right options computed from the notebook's batch."""
    img_pos = locate_img_pos(padded(THREE_CHATS))  # [N, 3]
    return (
        Question(
            "Section 2's batch has three chats, the second with two pictures. What shape is its `img_pos`?",
            (
                wrong("[3, 3]", "one row per picture, not per chat: the second chat brings two rows"),
                right(str(list(img_pos.shape)), "one row (batch row, `<img>`, `</img>`) per picture of the batch"),
                wrong("[4, 2]", "each row also holds the batch index: three numbers"),
                wrong("[3, 2, 3]", "`img_pos` is flat: pictures of all chats one after another"),
            ),
        ),
        Question(
            "Left padding adds 270 `<|endoftext|>` before a prompt. What happens to its `img_pos` row?",
            (
                right("both positions grow by 270", "padding moves the prompt; nothing inside it moves apart"),
                wrong("nothing: positions are counted from the prompt's start", "`img_pos` indexes the padded batch"),
                wrong("the span grows by 270", "the span stays 256 ids; padding is outside the prompt"),
            ),
        ),
        Question(
            "A row's `</img>` comes before its `<img>`; every row has as many `<img>` as `</img>`. What do the "
            "article 2's three lines (and run.py's assertion on the batch rows) do?",
            (
                wrong("raise an error", "the counts agree and the rows agree, so `torch.stack` and the assertion pass"),
                right(
                    "return an `img_pos` whose span runs backwards, without complaint",
                    "only a check of the order within each row catches it, as `locate_img_pos` does",
                ),
                wrong("skip that picture", "nothing in the three lines looks at the order"),
            ),
        ),
    )
