"""Notebook 01's exercises: an image span written by hand, a chat's length, the longest path, where `</img>` sits."""

from ..tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, load_tokenizer, make_context
from . import exercise

SPAN_PATHS = (  # an ordinary path, one with 3-byte characters, one character, a path that fills the span exactly
    "../data/images/red_circle.png",
    "图片/红色的圆形.png",
    "a",
    "pictures/" + "x" * 243 + ".png",
)
TOO_LONG = "pictures/" + "x" * 300 + ".png"
PAIR = ("../data/images/pair_a_yellow_circle_red_triangle.png", "../data/images/pair_b_blue_square_yellow_circle.png")
PAIR_QUESTION = "哪张图片里有红色的三角形？"
WIDE_CHARACTER = "图"  # 3 bytes in UTF-8
NOT_ATTEMPTED = "not attempted yet: your function returns None — write its body and run the cell again"


def _pair_context():
    """(query, raw_text, context ids) of the two pair pictures and PAIR_QUESTION."""
    tokenizer = load_tokenizer()
    query = tokenizer.from_list_format([{"image": p} for p in PAIR] + [{"text": PAIR_QUESTION}])
    return (query, *make_context(tokenizer, query))


def _ids(value):
    """`value` as a list of ints, or None when it is not a sequence of ints."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return None
    return list(value)


def _shown(path: str) -> str:
    """`path` as a hint names it: quoted, a long one shortened."""
    return repr(path) if len(path) <= 40 else f"{path[:12]!r}…{path[-8:]!r} ({len(path.encode())} UTF-8 bytes)"


def _span_hint(path: str, got: list, expected: list) -> str:
    """What is wrong with a span `got` written for `path` (not equal to the tokenizer's `expected`)."""
    where, data = f"for path {_shown(path)}", list(path.encode("utf-8"))
    if not got or got[0] != IMAGE_START_ID or got[-1] != IMAGE_END_ID:
        return f"{where} your span does not start with <img> and end with </img>: the tags belong to the span"
    inner = got[1:-1]
    if inner[: len(data)] != data:
        characters, pieces = [ord(c) for c in path], load_tokenizer().encode(path)
        if inner[: len(characters)] == characters:
            return (
                f"{where} your span holds one id per character; it holds one id per UTF-8 byte, and some "
                "characters take several bytes"
            )
        if inner[: len(pieces)] == pieces:
            return (
                "between the tags the tokenizer does not run BPE: it writes the path's raw UTF-8 bytes, one id per byte"
            )
        return f"{where} the ids after <img> are not the path's UTF-8 bytes"
    if len(got) != len(expected):
        return (
            f"{where} your span has {len(got)} ids; every span has the same length whatever the path: the path's "
            "bytes are padded up to the span's fixed size"
        )
    pads = set(inner[len(data) :])
    if pads and pads != {IMAGE_PAD_ID}:
        return (
            f"{where} the padding after the path's bytes uses id(s) {sorted(pads)}; padding has its own special "
            "token, next to the two image tags"
        )
    return f"{where} your span differs from the tokenizer's; a span is <img>, the path's bytes, padding, </img>"


@exercise("01.1", "Write my_image_span(path): the ids of the image span that the tokenizer writes for `path`.")
def check_image_span(my_image_span):
    """The check of exercise 01.1: None when the answer is right, else a hint."""
    if not callable(my_image_span):
        return "give the function itself: check('01.1', my_image_span)"
    for path in SPAN_PATHS:
        expected = load_tokenizer().encode_image_span(path)
        try:
            value = my_image_span(path)
        except ValueError:
            return f"for path {_shown(path)} your function raised ValueError, but the path fits in a span"
        if value is None:
            return NOT_ATTEMPTED if path == SPAN_PATHS[0] else f"for path {_shown(path)} your function returned None"
        got = _ids(value)
        if got is None:
            return f"return the span as a list of ints (token ids), got {type(value).__name__}"
        if got != expected:
            return _span_hint(path, got, expected)
    try:
        my_image_span(TOO_LONG)
    except ValueError:
        return None
    except Exception as err:  # any other error is the learner's: a hint, not a crash of the check
        return (
            f"a path too long for a span must raise ValueError (a clear message), but yours raised {type(err).__name__}"
        )
    return (
        f"a path of {len(TOO_LONG.encode())} UTF-8 bytes cannot be written into a span: raise ValueError instead "
        "of returning ids"
    )


@exercise("01.2", "How many ids does make_context give for the two pair pictures and 哪张图片里有红色的三角形？?")
def check_pair_length(my_length):
    """The check of exercise 01.2: None when the answer is right, else a hint."""
    tokenizer = load_tokenizer()
    query, raw_text, ids = _pair_context()
    if isinstance(my_length, bool) or not isinstance(my_length, int):
        return f"give a number of ids (an int), got {type(my_length).__name__}"
    if my_length == len(ids):
        return None
    if my_length == len(raw_text):
        return "that is the number of characters of raw_text; count the ids of the context instead"
    if my_length == len(tokenizer.encode(query)):
        return "that counts the query alone; make_context adds the chat frame around it (system message, roles)"
    if my_length < len(ids):
        return "too few: every picture takes a whole span, tags included, and the chat frame has ids of its own"
    return "too many: every picture's span has the same length, whatever its path; count the chat frame once"


@exercise("01.3", "How many characters long can an image path made only of Chinese characters (3 bytes each) be?")
def check_longest_chinese_path(my_max_chars):
    """The check of exercise 01.3: None when the answer is right, else a hint."""
    if isinstance(my_max_chars, bool) or not isinstance(my_max_chars, int):
        return f"give a number of characters (an int), got {type(my_max_chars).__name__}"
    if my_max_chars < 1:
        return "a path needs at least one character"
    tokenizer = load_tokenizer()
    try:
        tokenizer.encode_image_span(WIDE_CHARACTER * my_max_chars)
    except ValueError:
        return (
            "too many: the tokenizer refuses a path that long; each of these characters takes several bytes, and "
            "the span holds bytes"
        )
    try:
        tokenizer.encode_image_span(WIDE_CHARACTER * (my_max_chars + 1))
    except ValueError:
        return None
    return "too few: a path with one more character still fits in the span"


@exercise("01.4", "Write my_end_position(a): the position of </img> from the position a of its <img>.")
def check_end_position(my_end_position):
    """The check of exercise 01.4: None when the answer is right, else a hint."""
    if not callable(my_end_position):
        return "give the function itself: check('01.4', my_end_position)"
    ids = _pair_context()[2]
    starts = [k for k, i in enumerate(ids) if i == IMAGE_START_ID]
    ends = [k for k, i in enumerate(ids) if i == IMAGE_END_ID]
    for k, (a, b) in enumerate(zip(starts, ends)):
        got = my_end_position(a)
        if got is None:
            return NOT_ATTEMPTED if k == 0 else f"for a = {a} your function returned None"
        if hasattr(got, "item"):
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, int):
            return f"return a position (an int), got {type(got).__name__}"
        if got == b - 1:
            return "off by one, too early: the span's ids lie strictly between the two tags"
        if got == b + 1:
            return "off by one, too far: the span's ids lie strictly between the two tags"
        if got != b:
            return f"for <img> at a = {a} your </img> lands inside the text or the span; count the ids between the tags"
    return None
