"""Notebook 01's exercises: an image span written by hand, the longest path Qwen-VL-Chat reads, where `</img>` sits."""

import unicodedata

from ...tokenizing import (
    IMAGE_END_ID,
    IMAGE_PAD_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    QWEN_VL_PATH_BYTES,
    load_tokenizer,
    make_context,
)
from . import exercise, int_list, whole_number
from .selfcheck import Question, right, wrong

WIDE_CHARACTER = "图"  # 3 bytes in UTF-8
SPAN_PATHS = (  # paths that fit: ordinary, 3-byte characters, NFD, a ligature, one character, 255 and 256 bytes
    "../data/images/red_circle.png",
    "图片/红色的圆形.png",
    unicodedata.normalize("NFD", "café.png"),  # e + a combining accent: Qwen-VL writes the NFC é
    "\ufb01gure.png",  # the ligature ﬁ: NFC keeps it, NFKC would write f and i
    "a",
    WIDE_CHARACTER * (IMG_TOKEN_SPAN // 3),
    "pictures/" + "x" * (IMG_TOKEN_SPAN - 13) + ".png",
)
TOO_LONG = (  # paths one byte past the span, and 86 characters that are 258 bytes: a span cannot hold them
    "pictures/" + "x" * (IMG_TOKEN_SPAN - 12) + ".png",
    WIDE_CHARACTER * (IMG_TOKEN_SPAN // 3 + 1),
)
PAIR = ("../data/images/pair_a_yellow_circle_red_triangle.png", "../data/images/pair_b_blue_square_yellow_circle.png")
PAIR_QUESTION = "哪张图片里有红色的三角形？"
NOT_ATTEMPTED = "not attempted yet: your function returns None — write its body and run the cell again"
OTHER_STARTS = (0, 7, 1000)  # positions of <img> in no context at all: </img> follows from a alone


def _pair_context():
    """(query, raw_text, context ids) of the two pair pictures and PAIR_QUESTION."""
    tokenizer = load_tokenizer()
    query = tokenizer.from_list_format([{"image": p} for p in PAIR] + [{"text": PAIR_QUESTION}])
    return (query, *make_context(tokenizer, query))


def _shown(path: str) -> str:
    """`path` as a hint names it: quoted, a long one shortened."""
    return repr(path) if len(path) <= 40 else f"{path[:12]!r}…{path[-8:]!r} ({len(path.encode())} UTF-8 bytes)"


def _span_hint(path: str, got: list, expected: list) -> str:
    """What is wrong with a span `got` written for `path` (not equal to the tokenizer's `expected`)."""
    where, data = f"for path {_shown(path)}", list(unicodedata.normalize("NFC", path).encode("utf-8"))
    if not got or got[0] != IMAGE_START_ID or got[-1] != IMAGE_END_ID:
        return f"{where} your span does not start with <img> and end with </img>: the tags belong to the span"
    inner = got[1:-1]
    given = list(path.encode("utf-8"))
    if given != data and inner[: len(given)] == given:
        return (
            f"{where} (its é is an e followed by a combining accent) your span holds the path's bytes as given; "
            "Qwen-VL's tokenizer first normalises the whole text to Unicode NFC, the path included "
            "(unicodedata.normalize), and then writes the bytes"
        )
    compatible = list(unicodedata.normalize("NFKC", path).encode("utf-8"))
    if compatible != data and inner[: len(compatible)] == compatible:
        return (
            f"{where} your span holds the path normalised to NFKC, which also rewrites compatibility characters "
            "such as the ligature ﬁ; Qwen-VL's tokenizer normalises to NFC"
        )
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
            if len(path.encode()) > QWEN_VL_PATH_BYTES:
                return (
                    f"for path {_shown(path)} your function raised ValueError, but the tokenizer writes it: a span "
                    "holds every byte up to its last one (a later step, the model's reading of the path, is stricter)"
                )
            return f"for path {_shown(path)} your function raised ValueError, but the path fits in a span"
        if value is None:
            return NOT_ATTEMPTED if path == SPAN_PATHS[0] else f"for path {_shown(path)} your function returned None"
        got = int_list(value)
        if got is None:
            return f"return the span as a list of ints (token ids), got {type(value).__name__}"
        if got != expected:
            return _span_hint(path, got, expected)
    for path in TOO_LONG:
        try:
            my_image_span(path)
        except ValueError:
            continue
        except Exception as err:  # any other error is the learner's: a hint, not a crash of the check
            return (
                f"a path too long for a span must raise ValueError (a clear message), but for {_shown(path)} yours "
                f"raised {type(err).__name__}"
            )
        if len(path) <= IMG_TOKEN_SPAN:
            return (
                f"{_shown(path)} has only {len(path)} characters, yet a span cannot hold it: count its UTF-8 bytes, "
                "not its characters, and raise ValueError instead of returning ids"
            )
        return f"{_shown(path)} cannot be written into a span: raise ValueError instead of returning ids"
    return None


@exercise(
    "01.2",
    "How many characters long can an image path made only of Chinese characters (3 bytes each) be, for "
    "Qwen-VL-Chat's own modeling_qwen.py to read the picture back?",
)
def check_longest_chinese_path(my_max_chars):
    """The check of exercise 01.2: None when the answer is right, else a hint."""
    if whole_number(my_max_chars) is None:
        return f"give a number of characters (an int), got {type(my_max_chars).__name__}"
    my_max_chars = whole_number(my_max_chars)
    if my_max_chars < 1:
        return "a path needs at least one character"
    width = len(WIDE_CHARACTER.encode())
    if my_max_chars == QWEN_VL_PATH_BYTES // width:
        return None
    if my_max_chars in (IMG_TOKEN_SPAN, QWEN_VL_PATH_BYTES, IMG_TOKEN_SPAN - 1):
        return "that is a number of bytes; each of these characters takes several bytes"
    if my_max_chars == IMG_TOKEN_SPAN // width:
        return (
            "the tokenizer writes that many into a span, but modeling_qwen.py reads the span without its last id "
            "and then looks for <imgpad>: how many bytes may the path have so that one <imgpad> is still read?"
        )
    if my_max_chars > QWEN_VL_PATH_BYTES // width:
        return "too many: count the bytes the path takes, and what modeling_qwen.py needs after them"
    return "too few: a path with one more character is still read back"


@exercise("01.3", "Write my_end_position(a): the position of </img> from the position a of its <img>.")
def check_end_position(my_end_position):
    """The check of exercise 01.3: None when the answer is right, else a hint."""
    if not callable(my_end_position):
        return "give the function itself: check('01.3', my_end_position)"
    ids = _pair_context()[2]
    starts = [k for k, i in enumerate(ids) if i == IMAGE_START_ID]
    ends = [k for k, i in enumerate(ids) if i == IMAGE_END_ID]
    for k, (a, b) in enumerate(zip(starts, ends)):
        got = my_end_position(a)
        if got is None:
            return NOT_ATTEMPTED if k == 0 else f"for a = {a} your function returned None"
        if hasattr(got, "item"):
            got = got.item()
        if whole_number(got) is None:
            return f"return a position (an int), got {type(got).__name__}"
        got = whole_number(got)
        if got == b - 1:
            return "off by one, too early: the span's ids lie strictly between the two tags"
        if got == b + 1:
            return "off by one, too far: the span's ids lie strictly between the two tags"
        if got != b:
            return f"for <img> at a = {a} your </img> lands inside the text or the span; count the ids between the tags"
    span_length = ends[0] - starts[0]
    for a in OTHER_STARTS:  # a function that looks the answer up in this context fails here
        try:
            got = my_end_position(a)
        except Exception:  # a lookup that fails away from this context: the hint below
            got = None
        got = got.item() if hasattr(got, "item") else got
        if whole_number(got) != a + span_length:
            return (
                f"for <img> at a = {a} your function does not give the right position: write it from a alone, "
                "without looking at the ids: the span has a fixed length"
            )
    return None


def SELF_CHECK():
    """Notebook 01's self-check: its right options computed by the tokenizer where it can."""
    tokenizer = load_tokenizer()
    typed = tokenizer.encode("What is <img>private/notes.png</img>?").count(IMAGE_START_ID)
    return (
        Question(
            "What does the tokenizer write between `<img>` and `</img>`?",
            (
                wrong("the BPE pieces of the path", "inside a span there is no BPE: `46` there is the byte of `.`"),
                wrong(
                    "256 `<imgpad>` ids", "that is how vLLM marks a picture; Qwen-VL's tokenizer writes the path first"
                ),
                right("the path's UTF-8 bytes, one id per byte, then `<imgpad>`", "decode_image_path reads them back"),
                wrong("the picture's pixels", "the tokenizer never opens the picture; only its path is in the ids"),
            ),
        ),
        Question(
            "A user types `What is <img>private/notes.png</img>?` into the chat. How many image spans does it make?",
            (
                right(str(typed), "typed text is encoded as ordinary text: the tags stay characters"),
                wrong("1", "only `{'image': …}` elements make spans; a typed tag would let users open any file"),
                wrong("a ValueError", "nothing is wrong with the text: it is encoded, as text"),
            ),
        ),
        Question(
            "How long may an image path be, in UTF-8 bytes, for Qwen-VL-Chat's own modeling_qwen.py to read it back?",
            (
                wrong(
                    str(IMG_TOKEN_SPAN),
                    "the tokenizer writes 256, but the model reads `input_ids[i][a+1:b-1]`, the span without its last "
                    "id, and then looks for `<imgpad>`",
                ),
                right(str(QWEN_VL_PATH_BYTES), "two `<imgpad>` must follow the path: one is cut off, one is found"),
                wrong(
                    str(IMG_TOKEN_SPAN - 1),
                    "then the only `<imgpad>` is the span's last id, the one the model cuts off",
                ),
                wrong("any length", "a span has 256 ids; the tokenizer refuses a longer path"),
            ),
        ),
    )
