"""Notebook 01 — tokenizing: the Qwen-VL tokenizer on tiktoken, image spans and the chatml context."""

import base64
import hashlib
import json
import os
import re
import unicodedata
import warnings
from functools import lru_cache
from pathlib import Path

import tiktoken

from . import resources
from .checks.values import check_path, is_int

# Special-token ids of Qwen-VL (they follow the 151,643 BPE ranks of qwen.tiktoken)
ENDOFTEXT_ID = 151643  # <|endoftext|>, also eos/pad in generation_config.json
IM_START_ID = 151644  # <|im_start|>
IM_END_ID = 151645  # <|im_end|>, end_id = pad_id in TensorRT-LLM's run.py
REF_START_ID, REF_END_ID = 151851, 151852  # <ref> </ref>
BOX_START_ID, BOX_END_ID = 151853, 151854  # <box> </box>
QUAD_START_ID, QUAD_END_ID = 151855, 151856  # <quad> </quad>
IMAGE_START_ID = 151857  # <img> = config.visual["image_start_id"]
IMAGE_END_ID = IMAGE_START_ID + 1  # </img>
IMAGE_PAD_ID = IMAGE_START_ID + 2  # <imgpad>
IMG_TOKEN_SPAN = 256  # ids between <img> and </img>: path bytes, then <imgpad>
IMAGE_IDS = IMG_TOKEN_SPAN + 2  # the ids a picture takes in a prompt: <img>, its span, </img>
# The longest path Qwen-VL-Chat's own modeling_qwen.py reads back: it takes the span without its last id,
# input_ids[i][a + 1 : b - 1], then .index(<imgpad>), which fails unless two <imgpad> follow the path
QWEN_VL_PATH_BYTES = IMG_TOKEN_SPAN - 2
TOKENIZER_VOCAB_SIZE = 151860  # len(tokenizer)
MODEL_VOCAB_SIZE = 151936  # config.vocab_size (padded): fake prompt ids start here
QWEN_TIKTOKEN_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"

VOCAB_FILE_NAME = resources.VOCAB_FILE_NAME
VOCAB_RESTORE = "`git checkout -- data/qwen.tiktoken` restores the shipped copy in a clone (else reinstall qwenvl_lab)"
PAT_STR = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
HORIZONTAL_SPACE = "\t\x0b\x0c \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"  # \s of PAT_STR but \r \n
SPACE_RUN_CUT = 4096  # runs of horizontal whitespace this long are encoded apart from the regex (see _encode_ordinary)
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    *(f"<|extra_{i}|>" for i in range(205)),
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
    "<quad>",
    "</quad>",
    "<img>",
    "</img>",
    "<imgpad>",
)  # ids ENDOFTEXT_ID … TOKENIZER_VOCAB_SIZE - 1, in this order
SPECIAL_IDS = {token: ENDOFTEXT_ID + i for i, token in enumerate(SPECIAL_TOKENS)}
IMAGE_TAGS = frozenset({"<img>", "</img>", "<imgpad>"})
GROUNDING_TAGS = ("<ref>", "</ref>", "<box>", "</box>", "<quad>", "</quad>")  # special tokens in a history's answers
_GROUNDING_TAG = re.compile("|".join(map(re.escape, GROUNDING_TAGS)))
TOKEN_KINDS = ("text", "special", "image_tag", "image_path_byte", "imgpad", "vocab_pad", "fake_prompt_id")
_SPECIAL_NAMES = {
    ENDOFTEXT_ID: "eod_id",
    IM_START_ID: "im_start_id",
    IM_END_ID: "im_end_id",
    REF_START_ID: "ref_start_id",
    REF_END_ID: "ref_end_id",
    BOX_START_ID: "box_start_id",
    BOX_END_ID: "box_end_id",
    QUAD_START_ID: "quad_start_id",
    QUAD_END_ID: "quad_end_id",
    IMAGE_START_ID: "image_start_id",
    IMAGE_END_ID: "image_start_id + 1",
    IMAGE_PAD_ID: "image_start_id + 2",
}


def vocab_file_path(path=None) -> Path:
    """Locate qwen.tiktoken: inside `path` (a checkpoint dir, or the file itself) if there, else the shipped copy."""
    if path is not None:
        path = check_path("path", path)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; pass a checkpoint directory, a qwen.tiktoken file or None")
        if path.is_file():
            return path
        if (path / VOCAB_FILE_NAME).is_file():
            return path / VOCAB_FILE_NAME
    vocab = resources.vocab_file()
    if not vocab.is_file():
        raise FileNotFoundError(f"the shipped vocabulary {vocab} is missing; {VOCAB_RESTORE}")
    return vocab


@lru_cache(maxsize=4)
def _cached_encoding(vocab_file: str, mtime_ns: int, size: int) -> tiktoken.Encoding:
    content = Path(vocab_file).read_bytes().replace(b"\r\n", b"\n")  # checkpoint copies may use CRLF
    digest = hashlib.sha256(content).hexdigest()
    if digest != QWEN_TIKTOKEN_SHA256:
        raise ValueError(
            f"{vocab_file} is not Qwen's {VOCAB_FILE_NAME}: sha256 of its content (CRLF→LF) is {digest}, "
            f"expected {QWEN_TIKTOKEN_SHA256}; replace it with an intact copy ({VOCAB_RESTORE})"
        )
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in content.splitlines())}
    return tiktoken.Encoding(
        "qwen",
        pat_str=PAT_STR,
        mergeable_ranks=ranks,
        special_tokens=SPECIAL_IDS,
        explicit_n_vocab=TOKENIZER_VOCAB_SIZE,
    )


def _load_encoding(vocab_file: Path) -> tiktoken.Encoding:
    stat = vocab_file.stat()
    return _cached_encoding(str(vocab_file.resolve()), stat.st_mtime_ns, stat.st_size)


def _encode_ordinary(encoding: tiktoken.Encoding, text: str, cut: int = SPACE_RUN_CUT) -> list[int]:
    """`encoding.encode_ordinary(text)` (PAT_STR split, then BPE of each piece), for runs of whitespace of any length.

    tiktoken's regex stops with "Max stack size exceeded" on a run of about a million spaces or tabs. A maximal run
    of horizontal whitespace (`\\s` but \\r \\n) that is followed by a non-space is always the piece `run[:-1]`, its last
    character starting the next piece (`\\s+(?!\\S)`); at the end of the text the whole run is one piece. No piece
    reaches across such a piece's ends and the regex looks only forward, so the text before and after it encodes
    alone exactly as in the whole. Runs of `cut` or more characters are cut out this way and their piece is BPE-encoded
    directly; the ids are those of the one-shot encoding wherever that succeeds.
    """
    ids, start = [], 0
    for run in re.finditer(f"[{HORIZONTAL_SPACE}]{{{cut},}}", text):
        a, b = run.span()
        if text[b : b + 1] in ("\r", "\n"):
            continue  # `\s*[\r\n]+` takes the run with the line breaks after it, without the regex's stack
        end = b if b == len(text) else b - 1
        ids += encoding.encode_ordinary(text[start:a]) + encoding._encode_single_piece(text[a:end].encode("utf-8"))
        start = end
    return ids + encoding.encode_ordinary(text[start:])


def _image_path(path) -> str:
    """An image path as the span holds it: NFC, as Qwen-VL's tokenize normalises the whole text before the span."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"an image path must be a str or os.PathLike, got {type(path).__name__}")
    return unicodedata.normalize("NFC", path)


def _path_bytes(path) -> bytes:
    """UTF-8 bytes of an image path (NFC), checked to fit in one image span."""
    given = path
    path = _image_path(path)
    if not path:
        raise ValueError("an image path must not be empty")
    try:
        data = path.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"image path {path!r} cannot be encoded as UTF-8 ({err.reason}: {path[err.start]!r} at character "
            f"{err.start}), which an image span holds: type the path again without it"
        ) from None
    if len(data) > IMG_TOKEN_SPAN:
        raise ValueError(
            f"image path is {len(data)} UTF-8 bytes but an image span holds at most {IMG_TOKEN_SPAN} bytes; "
            f"use a shorter path (e.g. copy or symlink the file to a short name): {given!r}"
        )
    return data


def _as_ids(ids) -> list[int]:
    """A list of non-negative Python ints from a list, tuple, torch tensor, numpy array or single int."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()  # torch / numpy: [L] → list, 0-d → scalar
    if is_int(ids):
        ids = [ids]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, range)):
        raise TypeError(
            f"token ids must be a 1-D list, tuple, torch tensor or numpy array of ints, got {type(ids).__name__}"
        )
    for k, i in enumerate(ids):
        if not is_int(i):
            raise TypeError(f"token ids must be a 1-D sequence of ints, got {type(i).__name__} {i!r} at position {k}")
        if i < 0:
            raise ValueError(f"token ids must be >= 0, got {i} at position {k}")
    return list(ids)


def decode_image_path(span_ids) -> str:
    """Image path held by an image span: `<img>` path bytes, `<imgpad>`… `</img>` (tags optional)."""
    ids = _as_ids(span_ids)
    if ids and ids[0] == IMAGE_START_ID:
        if len(ids) < 2 or ids[-1] != IMAGE_END_ID:
            raise ValueError("an image span that starts with <img> (151857) must end with </img> (151858)")
        ids = ids[1:-1]
    elif ids and ids[-1] == IMAGE_END_ID:
        raise ValueError("an image span that ends with </img> (151858) must start with <img> (151857)")
    if len(ids) != IMG_TOKEN_SPAN:
        raise ValueError(f"an image span holds exactly {IMG_TOKEN_SPAN} ids between <img> and </img>, got {len(ids)}")
    n = ids.index(IMAGE_PAD_ID) if IMAGE_PAD_ID in ids else IMG_TOKEN_SPAN
    if n == 0:
        raise ValueError("empty image path: the span starts with <imgpad>")
    bad = next((k for k in range(n) if ids[k] > 255), None)
    if bad is not None:
        raise ValueError(
            f"id {ids[bad]} at span position {bad} is not a path byte (0–255) nor <imgpad> ({IMAGE_PAD_ID})"
        )
    bad = next((k for k in range(n, IMG_TOKEN_SPAN) if ids[k] != IMAGE_PAD_ID), None)
    if bad is not None:
        raise ValueError(f"id {ids[bad]} at span position {bad} follows <imgpad>; only <imgpad> may follow it")
    try:
        return bytes(ids[:n]).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"the image path bytes are not valid UTF-8 ({err.reason} at byte {err.start})") from None


def _image_spans(ids: list[int]) -> dict[int, tuple[int, str]]:
    """{position of <img>: (position of </img>, path)} for every well-formed image path span in ids."""
    spans = {}
    for a, i in enumerate(ids):
        if i != IMAGE_START_ID:
            continue
        b = a + 1 + IMG_TOKEN_SPAN
        if b < len(ids) and ids[b] == IMAGE_END_ID:
            try:
                spans[a] = (b, decode_image_path(ids[a + 1 : b]))
            except ValueError:
                pass  # not a path span (e.g. fake prompt ids): its ids are read one by one
    return spans


def _kind_of(token_id: int) -> str:
    """Kind of one id without context (ids 0–255 count as text)."""
    if token_id < ENDOFTEXT_ID:
        return "text"
    if token_id in (IMAGE_START_ID, IMAGE_END_ID):
        return "image_tag"
    if token_id == IMAGE_PAD_ID:
        return "imgpad"
    if token_id < TOKENIZER_VOCAB_SIZE:
        return "special"
    return "vocab_pad" if token_id < MODEL_VOCAB_SIZE else "fake_prompt_id"


class Query(str):
    """A query string (as the official from_list_format returns) that remembers which `<img>` spans are images."""

    # segments: ("text", t) BPE-encoded, stored NFC as the official tokenizer encodes it; ("special", "<ref>") one
    # id; ("image", path) one 258-id span, the path stored NFC too: Qwen-VL's tokenize normalises the whole text,
    # path included, before it writes the span's bytes, so the model opens the NFC name. `+` with a str or a
    # Query gives a Query (an added str is plain text); other str methods return a plain str, which encodes as plain
    # text: images only come from Query segments.

    __slots__ = ("segments",)
    KINDS = ("text", "special", "image")

    def __new__(cls, segments):
        if isinstance(segments, str):
            raise TypeError(
                "Query takes (kind, value) segments, not a str; build queries with tokenizer.from_list_format"
            )
        checked = []
        for k, segment in enumerate(segments):
            if not isinstance(segment, tuple) or len(segment) != 2:
                raise TypeError(f"segment {k} must be a (kind, value) tuple, got {segment!r}")
            kind, value = segment
            if kind not in cls.KINDS:
                raise ValueError(f"segment {k} has kind {kind!r}; kinds are {cls.KINDS}")
            if kind == "image":
                _path_bytes(value)
                value = _image_path(value)
            elif not isinstance(value, str):
                raise TypeError(f"segment {k} ({kind}) must hold a str, got {type(value).__name__}")
            elif kind == "special" and (value not in SPECIAL_IDS or value in IMAGE_TAGS):
                raise ValueError(f"segment {k}: {value!r} is not a special token (images go in 'image' segments)")
            elif kind == "text":
                value = unicodedata.normalize("NFC", value)  # the form the official tokenizer encodes
            if value:
                checked.append((kind, value))
        text = "".join(f"<img>{v}</img>" if kind == "image" else v for kind, v in checked)
        query = super().__new__(cls, text)
        query.segments = tuple(checked)
        return query

    def __getnewargs__(self):
        return (self.segments,)

    def __repr__(self):
        return f"Query({str.__repr__(self)})"

    def __add__(self, other):
        """Query + str (plain text) or Query: a Query that keeps both sides' segments."""
        if not isinstance(other, str):
            return NotImplemented
        return Query._joined(self, other)

    def __radd__(self, other):
        """str (plain text) + Query: a Query."""
        if not isinstance(other, str):
            return NotImplemented
        return Query._joined(other, self)

    @staticmethod
    def _joined(left: str, right: str) -> "Query":
        """left + right as one Query; text meeting at the seam becomes one text segment, as in the joined string."""
        left, right = ([*s.segments] if isinstance(s, Query) else [("text", s)] for s in (left, right))
        if left and right and left[-1][0] == right[0][0] == "text":
            left[-1] = ("text", left[-1][1] + right.pop(0)[1])
        return Query(left + right)

    @property
    def images(self) -> tuple[str, ...]:
        """Image paths, in order."""
        return tuple(v for kind, v in self.segments if kind == "image")


def _boxes(boxes, k: int) -> list[tuple[int, int, int, int]]:
    """Element k's 'box' value: a list of (x1, y1, x2, y2) boxes on the 0–1000 grid."""
    if not isinstance(boxes, (list, tuple)):
        raise TypeError(f"element {k}: 'box' must be a list of (x1, y1, x2, y2) boxes, got {boxes!r}")
    for j, box in enumerate(boxes):
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            raise TypeError(
                f"element {k}: box {j} must be (x1, y1, x2, y2), got {box!r} "
                "(a single box still goes in a list: [(x1, y1, x2, y2)])"
            )
    return [tuple(_check_coord(v, f"element {k}: box {j} coordinate") for v in box) for j, box in enumerate(boxes)]


def _check_coord(value, where: str) -> int:
    if not is_int(value):
        raise TypeError(f"{where} must be an int on the 0–1000 scale, got {value!r}")
    if not 0 <= value <= 1000:
        raise ValueError(f"{where} must be on the 0–1000 scale, got {value}")
    return value


class QWenTokenizer:
    """Qwen-VL's tokenizer on tiktoken: plain text stays text; only Query image segments become image spans."""

    eod_id, im_start_id, im_end_id = ENDOFTEXT_ID, IM_START_ID, IM_END_ID
    img_start_id, img_end_id, img_pad_id = IMAGE_START_ID, IMAGE_END_ID, IMAGE_PAD_ID
    ref_start_id, ref_end_id = REF_START_ID, REF_END_ID
    box_start_id, box_end_id = BOX_START_ID, BOX_END_ID
    quad_start_id, quad_end_id = QUAD_START_ID, QUAD_END_ID

    def __init__(self, vocab_file):
        self.vocab_file = check_path("vocab_file", vocab_file)
        if not self.vocab_file.is_file():
            raise FileNotFoundError(
                f"{self.vocab_file} is not a file; use load_tokenizer() to locate {VOCAB_FILE_NAME}"
            )
        self.encoding = _load_encoding(self.vocab_file)
        self.special_tokens = dict(SPECIAL_IDS)

    def __len__(self) -> int:
        return self.encoding.n_vocab

    def __repr__(self):
        return f"QWenTokenizer(vocab_file={str(self.vocab_file)!r}, len={len(self)})"

    def encode(self, text) -> list[int]:
        """Ids of text: a plain str is always plain text (typed special tokens stay characters); a Query keeps its images."""
        if isinstance(text, Query):
            return self.encode_query(text)
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str or a Query, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"text has a character that UTF-8 cannot encode ({err.reason}) at index {err.start}"
            ) from None
        return _encode_ordinary(self.encoding, unicodedata.normalize("NFC", text))

    def encode_query(self, query: Query) -> list[int]:
        """Ids of a Query, segment by segment: text → BPE, special → its id, image → a 258-id image span."""
        if not isinstance(query, Query):
            raise TypeError(
                f"encode_query takes a Query (from from_list_format), got {type(query).__name__}; "
                "encode plain text with encode()"
            )
        ids = []
        for kind, value in query.segments:
            if kind == "text":
                ids += self.encode(value)
            elif kind == "special":
                ids.append(SPECIAL_IDS[value])
            else:
                ids += self.encode_image_span(value)
        return ids

    def encode_image_span(self, path) -> list[int]:
        """[<img>] + path bytes (NFC) + [<imgpad>] * (256 - len) + [</img>]: 258 ids."""
        data = _path_bytes(path)
        return [IMAGE_START_ID, *data, *[IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(data)), IMAGE_END_ID]

    def decode_image_span(self, ids) -> str:
        """Image path held by an image span (tags optional)."""
        return decode_image_path(ids)

    def from_list_format(self, list_format) -> Query:
        """Query from [{"image": path}, {"text": t}, {"box": [(x1, y1, x2, y2)], "ref": r}, …]."""
        if isinstance(list_format, (str, dict)) or not isinstance(list_format, (list, tuple)):
            raise TypeError(f"from_list_format takes a list of dicts, got {type(list_format).__name__}")
        segments, text, n_images = [], "", 0

        def flush():
            nonlocal text
            segments.append(("text", text))
            text = ""

        for k, element in enumerate(list_format):
            if not isinstance(element, dict):
                raise TypeError(f"element {k} must be a dict, got {type(element).__name__}")
            keys = set(element)
            if keys not in ({"image"}, {"text"}, {"box"}, {"ref"}, {"box", "ref"}):
                raise ValueError(
                    f"element {k} has keys {sorted(keys, key=repr)}; use one of {{'image'}}, {{'text'}}, "
                    "{'box', 'ref'}, {'box'} or {'ref'}"
                )
            if "image" in element:
                n_images += 1
                text += f"Picture {n_images}: "
                flush()
                segments.append(("image", element["image"]))
                text += "\n"
            if "text" in element:
                if not isinstance(element["text"], str):
                    raise TypeError(f"element {k}: 'text' must be a str, got {type(element['text']).__name__}")
                text += element["text"]
            if "ref" in element:
                if not isinstance(element["ref"], str):
                    raise TypeError(f"element {k}: 'ref' must be a str, got {type(element['ref']).__name__}")
                flush()
                segments += [("special", "<ref>"), ("text", element["ref"]), ("special", "</ref>")]
            for x1, y1, x2, y2 in _boxes(element.get("box", ()), k):
                flush()
                segments += [("special", "<box>"), ("text", f"({x1},{y1}),({x2},{y2})"), ("special", "</box>")]
        flush()
        return Query(segments)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of ids; image spans read back as `<img>path</img>`, ids past the tokenizer as placeholders.

        Ids in [151860, 151936) pad the model's vocab and render as `<|vocab_pad_{id}|>`; ids >= 151936 are fake
        prompt ids and render as `<|prompt_table_row_{id - 151936}|>`. With skip_special_tokens=True every id
        >= 151643 is dropped (an image span leaves its path). Broken UTF-8 in text becomes U+FFFD.
        """
        ids = _as_ids(ids)
        spans = _image_spans(ids)
        pieces: list = []  # bytes (text, merged before decoding) or str (rendered tokens)
        k = 0
        while k < len(ids):
            i = ids[k]
            if k in spans:
                end, path = spans[k]
                pieces.append(path.encode("utf-8") if skip_special_tokens else f"<img>{path}</img>")
                k = end + 1
                continue
            if i < ENDOFTEXT_ID:
                pieces.append(self.encoding.decode_single_token_bytes(i))
            elif not skip_special_tokens:
                pieces.append(self._placeholder(i))
            k += 1
        out, run = [], []
        for piece in pieces + [""]:
            if isinstance(piece, bytes):
                run.append(piece)
            else:
                out += [b"".join(run).decode("utf-8", errors="replace"), piece]
                run = []
        return "".join(out)

    @staticmethod
    def _placeholder(token_id: int) -> str:
        if token_id < TOKENIZER_VOCAB_SIZE:
            return SPECIAL_TOKENS[token_id - ENDOFTEXT_ID]
        if token_id < MODEL_VOCAB_SIZE:
            return f"<|vocab_pad_{token_id}|>"
        return f"<|prompt_table_row_{token_id - MODEL_VOCAB_SIZE}|>"

    def token_kinds(self, ids) -> list[str]:
        """Kind of each id: text, special, image_tag, image_path_byte, imgpad, vocab_pad or fake_prompt_id."""
        ids = _as_ids(ids)
        kinds = [_kind_of(i) for i in ids]
        for a, (b, _) in _image_spans(ids).items():
            for k in range(a + 1, b):
                if ids[k] != IMAGE_PAD_ID:
                    kinds[k] = "image_path_byte"
        return kinds

    def describe_token(self, token_id: int, kind: str | None = None) -> str:
        """Short human description of one id (pass kind="image_path_byte" for ids inside an image span)."""
        ids = _as_ids(token_id)
        if len(ids) != 1:
            raise TypeError(f"describe_token takes one id, got {len(ids)}; use describe_tokens for a sequence")
        token_id = ids[0]
        kind = _kind_of(token_id) if kind is None else kind
        if kind == "image_path_byte" and token_id <= 255:
            char = chr(token_id)
            return f"path byte 0x{token_id:02x}" + (
                f" {json.dumps(char)}" if char.isprintable() and token_id < 128 else ""
            )
        if kind != _kind_of(token_id):
            raise ValueError(
                f"id {token_id} cannot be of kind {kind!r}; kinds are {TOKEN_KINDS} "
                "(image_path_byte only for ids 0–255)"
            )
        if kind == "text":
            data = self.encoding.decode_single_token_bytes(token_id)
            try:
                return f"text {json.dumps(data.decode('utf-8'), ensure_ascii=False)}"
            except UnicodeDecodeError:
                return f"text bytes {data!r} (part of a UTF-8 character)"
        if kind == "vocab_pad":
            return f"{self._placeholder(token_id)} (model vocab padding, no token)"
        if kind == "fake_prompt_id":
            return f"fake prompt id → prompt_table row {token_id - MODEL_VOCAB_SIZE}"
        return f"{self._placeholder(token_id)} ({_SPECIAL_NAMES.get(token_id, 'unused')})"

    def describe_tokens(self, ids) -> list[str]:
        """describe_token for each id of a sequence, image path bytes recognised."""
        ids = _as_ids(ids)
        return [self.describe_token(i, kind) for i, kind in zip(ids, self.token_kinds(ids))]


def load_tokenizer(path=None) -> QWenTokenizer:
    """QWenTokenizer from `path`'s qwen.tiktoken, else the shipped copy; the content's sha256 is verified."""
    return QWenTokenizer(vocab_file_path(path))


def answer_query(answer) -> "Query":
    """An earlier answer as Qwen-VL's make_context encodes it in the history: the text NFC, its `<ref>`, `</ref>`,
    `<box>`, `</box>`, `<quad>` and `</quad>` the special tokens (Qwen-VL's allowed_special=IMAGE_ST) — but `<img>`,
    `</img>` and `<imgpad>` stay text, so that no text makes an image span. A Query is kept as it is."""
    if isinstance(answer, Query):
        return answer
    text, segments, start = unicodedata.normalize("NFC", answer), [], 0
    for tag in _GROUNDING_TAG.finditer(text):
        segments += [("text", text[start : tag.start()]), ("special", tag[0])]
        start = tag.end()
    return Query([*segments, ("text", text[start:])])


def warn_image_tags_as_text(text, what: str, fix: str) -> None:
    """Warn when plain text (a str, not a Query) holds `<img>…</img>`: typed text never makes an image span (the
    security rule), so the picture it names goes nowhere — a Qwen-VL query string, or a Query turned into a str."""
    if isinstance(text, str) and not isinstance(text, Query):
        start = text.find("<img>")
        if start >= 0 and text.find("</img>", start) >= 0:
            warnings.warn(
                f"{what} holds <img>…</img> as plain text: typed text never makes an image span, so no picture goes "
                f"with it; {fix}",
                stacklevel=3,
            )


def _message(role: str, value) -> list[tuple[str, str]]:
    """A chatml message's segments: <|im_start|>role, a newline, the text or Query, <|im_end|>."""
    content = list(value.segments) if isinstance(value, Query) else [("text", value)]
    return [("special", "<|im_start|>"), ("text", role), ("text", "\n"), *content, ("special", "<|im_end|>")]


def history_turn(query, response) -> Query:
    """An earlier turn as make_context lays it out in a prompt: a newline, the user's message, a newline, the
    assistant's (`answer_query`). A turn's ids do not depend on the turns around it (special tokens separate them)."""
    return Query(
        [("text", "\n"), *_message("user", query), ("text", "\n"), *_message("assistant", answer_query(response))]
    )


def make_context(
    tokenizer: QWenTokenizer,
    query,
    history=None,
    system: str = "You are a helpful assistant.",
    max_window_size: int = 6144,
) -> tuple[Query, list[int]]:
    """(raw_text, context_tokens) of a chatml prompt; history turns kept newest-first under max_window_size.

    A history's questions are user text (plain, or Queries from from_list_format); its answers are encoded as Qwen-VL
    re-encodes them, their grounding tags special tokens (`answer_query`)."""
    if not isinstance(tokenizer, QWenTokenizer):
        raise TypeError(f"make_context takes a QWenTokenizer first, got {type(tokenizer).__name__}")
    if not isinstance(system, str):
        raise TypeError(f"system must be a str, got {type(system).__name__}")
    if not is_int(max_window_size) or max_window_size <= 0:
        raise ValueError(f"max_window_size must be a positive int, got {max_window_size!r}")
    if not isinstance(query, str):
        raise TypeError(f"query must be a str (plain text) or a Query, got {type(query).__name__}")
    history = [] if history is None else history
    if isinstance(history, (str, dict)) or not isinstance(history, (list, tuple)):
        raise TypeError(f"history must be a list of (query, response) pairs, got {type(history).__name__}")
    for k, turn in enumerate(history):
        if not isinstance(turn, (list, tuple)) or len(turn) != 2 or not all(isinstance(t, str) for t in turn):
            raise ValueError(f"history[{k}] must be a (query, response) pair of str, got {turn!r}")
    fix = "build it with tokenizer.from_list_format([{'image': path}, {'text': …}]), which gives a Query"
    warn_image_tags_as_text(query, "the query", fix)
    for k, (turn_query, _) in enumerate(history):
        warn_image_tags_as_text(turn_query, f"history[{k}]'s query", fix)

    system_part = Query(_message("system", system))
    system_len = len(tokenizer.encode_query(system_part))
    turns, used = [], 0
    for turn_query, turn_response in reversed(history):
        turn = history_turn(turn_query, turn_response)
        n = len(tokenizer.encode_query(turn))
        if system_len + used + n >= max_window_size:
            break
        turns.insert(0, turn)
        used += n
    current = [
        ("text", "\n"),
        *_message("user", query),
        ("text", "\n"),
        ("special", "<|im_start|>"),
        ("text", "assistant"),
        ("text", "\n"),
    ]
    raw_text = Query([*system_part.segments, *(s for turn in turns for s in turn.segments), *current])
    return raw_text, tokenizer.encode_query(raw_text)
