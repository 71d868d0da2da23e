"""Notebook 06 — grounding: read Qwen-VL's `<ref>…</ref><box>(x1,y1),(x2,y2)</box>` answers, scale the boxes, draw them.

Reading. `to_list_format` turns token ids, a `Query` or plain text into the list format of
`tokenizer.from_list_format`, and is its inverse. In ids and Queries the tags are the special tokens 151851–151854
(exact: typed text never becomes a tag); in plain text they are the literal `<ref>`, `</ref>`, `<box>`, `</box>` and
`<img>path</img>`, as Qwen's own to_list_format reads them, so typed tags count as tags there. A `<ref>` and the
boxes right after it make one `{'ref': r, 'box': [(x1, y1, x2, y2), …]}` element, boxes right after each other one
`{'box': […]}`. The "Picture k: " before an image and the "\\n" after it, which from_list_format writes, are dropped
where both are there. Texts, refs and image paths come out NFC (as the tokenizer encodes them); `<quad>…</quad>`
and every other special token stay text.

Boxes. `parse_boxes` gives each box as a `Box` on the picture it refers to: the latest picture before it (Qwen-VL's
rule) or the `picture=` the caller names. Corners are edges: 0 is the picture's left (top) edge, 1000 its right
(bottom) edge, and a box covers pixel columns x1 … x2 − 1. Grid → pixels rounds half up (Qwen's
draw_bbox_on_latest_picture truncates), so pixels → grid → pixels is exact for pictures up to 1000 pixels.

Malformed input (an unclosed or stray tag, box text that is not `(x1,y1),(x2,y2)` with integers in 0–1000, x2 < x1
or y2 < y1, a box before any picture): with strict=True (the default) a ValueError says what is wrong; with
strict=False a warning says so and the broken tag is read as text, the box skipped.

Drawing. `draw_boxes` returns an RGB copy of the picture with each box's outline (on the box's edge pixels) and
label. Labels are drawn in Pillow's bundled font; labels with CJK (wide) characters in the machine's CJK font, else
in the course's own subset font (`fonts`), or in `font=`. When neither has them, their wide characters are drawn as
"?" and a warning says how to get a font. Every font uses Pillow's basic layout, so the pixels do not depend on
libraqm.
"""

import os
import re
import unicodedata
import warnings
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from .checks.values import is_int, is_number
from .fonts import GET_A_FONT, cjk_font_for, is_wide
from .pictures import load_image
from .tokenizing import (
    BOX_END_ID,
    BOX_START_ID,
    IMAGE_IDS,
    IMAGE_START_ID,
    REF_END_ID,
    REF_START_ID,
    Query,
    QWenTokenizer,
    decode_image_path,
)

TAG_IDS = {REF_START_ID: "<ref>", REF_END_ID: "</ref>", BOX_START_ID: "<box>", BOX_END_ID: "</box>"}
TAGS = frozenset(TAG_IDS.values())
CLOSING = {"<ref>": "</ref>", "<box>": "</box>"}
PALETTE = ((148, 103, 189), (255, 127, 14), (227, 119, 194), (23, 190, 207), (140, 86, 75), (127, 127, 127))  # k-th box
_TEXT_TAGS = re.compile(r"<img>|</?ref>|</?box>")  # fixed-width: each match looks at no more than 6 characters
_IMAGE_LABEL = re.compile(r"Picture [0-9]+: \Z")
_NUMBER = r"\s*(-?[0-9]{1,9})\s*"
_BOX_TEXT = re.compile(rf"\s*\({_NUMBER},{_NUMBER}\)\s*,\s*\({_NUMBER},{_NUMBER}\)\s*")  # (x1,y1),(x2,y2), spaces too


def _four_ints(corners) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) as a tuple of 4 ints, else a TypeError."""
    if (
        isinstance(corners, (str, bytes))
        or not isinstance(corners, (list, tuple))
        or len(corners) != 4
        or not all(is_int(v) for v in corners)
    ):
        raise TypeError(f"a box is 4 ints (x1, y1, x2, y2), got {corners!r}")
    return tuple(corners)


def check_box(corners) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) as ints on the 0–1000 grid with x1 <= x2 and y1 <= y2, else a ValueError or TypeError."""
    x1, y1, x2, y2 = corners = _four_ints(corners)
    if not all(0 <= v <= 1000 for v in corners):
        raise ValueError(f"box {corners} has corners outside the 0–1000 grid")
    if x2 < x1 or y2 < y1:
        raise ValueError(f"box {corners} has x2 < x1 or y2 < y1: write (left,top),(right,bottom)")
    return corners


def _check_size(size) -> tuple[int, int]:
    """(width, height) as positive ints."""
    if not isinstance(size, (list, tuple)) or len(size) != 2 or not all(is_int(v) and v > 0 for v in size):
        raise ValueError(f"a picture size is (width, height) in pixels, two positive ints, got {size!r}")
    return tuple(size)


def to_pixels(corners, size) -> tuple[int, int, int, int]:
    """Grid corners (0–1000) → pixel edges of a picture of size (width, height), rounded half up."""
    w, h = _check_size(size)
    return tuple((2 * c * s + 1000) // 2000 for c, s in zip(_four_ints(corners), (w, h, w, h)))


def to_grid(corners, size) -> tuple[int, int, int, int]:
    """Pixel edges of a picture of size (width, height) → grid corners (0–1000), rounded half up."""
    w, h = _check_size(size)
    return tuple((2000 * c + s) // (2 * s) for c, s in zip(_four_ints(corners), (w, h, w, h)))


def iou(a, b) -> float:
    """Intersection over union of two boxes (x1, y1, x2, y2) on one scale; two equal empty boxes give 1.0."""
    for box in (a, b):
        if (
            isinstance(box, (str, bytes))
            or not isinstance(box, (list, tuple))
            or len(box) != 4
            or not all(is_number(v) for v in box)
        ):
            raise TypeError(f"a box is 4 numbers (x1, y1, x2, y2), got {box!r}")
        if box[2] < box[0] or box[3] < box[1]:
            raise ValueError(f"box {tuple(box)} has x2 < x1 or y2 < y1: write (left, top, right, bottom)")
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else float(tuple(a) == tuple(b))


def box_answer(label: str, corners) -> Query:
    """`<ref>label</ref><box>(x1,y1),(x2,y2)</box>` as a Query whose tags are the special tokens."""
    if not isinstance(label, str):
        raise TypeError(f"label must be a str, got {type(label).__name__}")
    x1, y1, x2, y2 = check_box(corners)
    return Query(
        [
            ("special", "<ref>"),
            ("text", label),
            ("special", "</ref>"),
            ("special", "<box>"),
            ("text", f"({x1},{y1}),({x2},{y2})"),
            ("special", "</box>"),
        ]
    )


def _malformed(message: str, strict: bool, fallback: str):
    """Raise a ValueError (strict) or warn that the input is read with `fallback`."""
    if strict:
        raise ValueError(f"{message} (pass strict=False to skip what is malformed, with a warning)")
    warnings.warn(f"{message}: {fallback}", stacklevel=3)


def _pieces(source, tokenizer) -> list[tuple[str, str]]:
    """("text", t), ("tag", "<ref>"…) and ("image", path) pieces of ids, a Query or plain text."""
    if isinstance(source, Query):
        return [("tag" if v in TAGS else "text", v) if kind == "special" else (kind, v) for kind, v in source.segments]
    if isinstance(source, str):
        return _text_pieces(source)
    if not isinstance(tokenizer, QWenTokenizer):
        raise TypeError(
            f"to read token ids pass tokenizer=load_tokenizer() (got {type(tokenizer).__name__}); "
            "text and Queries need none"
        )
    kinds = tokenizer.token_kinds(source)  # checks the ids; marks the path bytes of well-formed image spans
    ids = source.tolist() if hasattr(source, "tolist") else source
    ids = [ids] if isinstance(ids, int) else list(ids)
    pieces, run, k = [], [], 0
    while k < len(ids):
        span = ids[k] == IMAGE_START_ID and k + 1 < len(ids) and kinds[k + 1] == "image_path_byte"
        if span or ids[k] in TAG_IDS:
            pieces.append(("text", tokenizer.decode(run)))
            run = []
        if span:
            pieces.append(("image", decode_image_path(ids[k : k + IMAGE_IDS])))
            k += IMAGE_IDS
            continue
        if ids[k] in TAG_IDS:
            pieces.append(("tag", TAG_IDS[ids[k]]))
        else:
            run.append(ids[k])
        k += 1
    return pieces + [("text", tokenizer.decode(run))]


def _text_pieces(text: str) -> list[tuple[str, str]]:
    """The pieces of plain text, in one pass: an `<img>` with a `</img>` after it holds the path up to the first one,
    an `<img>` without one is a tag, as are `<ref>`, `</ref>`, `<box>` and `</box>`.

    Each character is looked at a bounded number of times: the tag search only moves forward, a search for `</img>`
    that finds one moves past it, and once a search finds none it is not made again.
    """
    pieces, start, unclosed = [], 0, False  # unclosed: no </img> lies after the current position
    while (m := _TEXT_TAGS.search(text, start)) is not None:
        pieces.append(("text", text[start : m.start()]))
        closing = -1 if m[0] != "<img>" or unclosed else text.find("</img>", m.end())
        if closing != -1:
            pieces.append(("image", text[m.end() : closing]))
            start = closing + len("</img>")
            continue
        unclosed = unclosed or m[0] == "<img>"
        pieces.append(("tag", m[0]))
        start = m.end()
    return pieces + [("text", text[start:])]


def _clean(pieces) -> list[tuple[str, str]]:
    """Adjacent texts joined and NFC; the "Picture k: " before an image and the "\\n" after it dropped."""
    out = []
    for kind, value in pieces:
        if kind == "text" and out and out[-1][0] == "text":
            out[-1][1].append(value)
        else:
            out.append((kind, [value] if kind == "text" else value))
    out = [("text", unicodedata.normalize("NFC", "".join(v))) if kind == "text" else (kind, v) for kind, v in out]
    for k in range(1, len(out) - 1):
        (before_kind, before), (kind, _), (after_kind, after) = out[k - 1 : k + 2]
        label = _IMAGE_LABEL.search(before) if kind == "image" and before_kind == "text" else None
        if label and after_kind == "text" and after.startswith("\n"):
            out[k - 1], out[k + 1] = ("text", before[: label.start()]), ("text", after[1:])
    return out


def _corners(text: str) -> tuple[int, int, int, int]:
    """Integer corners of box text `(x1,y1),(x2,y2)` on the 0–1000 grid (any order), else a ValueError."""
    m = _BOX_TEXT.fullmatch(text)
    if m is None:
        raise ValueError(f"box text {text!r} is not (x1,y1),(x2,y2) with integer corners on the 0–1000 grid")
    corners = tuple(int(v) for v in m.groups())
    if not all(0 <= v <= 1000 for v in corners):
        raise ValueError(f"box {corners} has corners outside the 0–1000 grid")
    return corners


def to_list_format(source, tokenizer=None, *, strict=True) -> list[dict]:
    """[{'image': p}, {'text': t}, {'ref': r, 'box': [(x1, y1, x2, y2)]}, …] of ids, a Query or plain text."""
    pieces, out = _clean(_pieces(source, tokenizer)), []

    def add(element):
        last = out[-1] if out else {}
        if element.get("text") == "":
            return
        if "text" in element and "text" in last:
            last["text"].append(element["text"])  # joined at the end: adding to a long str each time is quadratic
        elif "text" in element:
            out.append({"text": [element["text"]]})
        elif "box" in element and last.keys() & {"ref", "box"}:
            last.setdefault("box", []).extend(element["box"])
        else:
            out.append(element)

    k = 0
    while k < len(pieces):
        kind, value = pieces[k]
        k += 1
        if kind == "image" and not value:
            _malformed("<img></img> holds no image path", strict, "read as text")
            kind, value = "text", "<img></img>"
        if kind != "tag":
            add({kind: value})
            continue
        if value not in CLOSING:  # a closing tag, or an <img> that is never closed
            _malformed(
                "<img> without </img>" if value == "<img>" else f"{value} without its opening tag",
                strict,
                "read as text",
            )
            add({"text": value})
            continue
        inner, end = (pieces[k][1], k + 1) if k < len(pieces) and pieces[k][0] == "text" else ("", k)
        if end == len(pieces) or pieces[end] != ("tag", CLOSING[value]):
            _malformed(f"{value + inner!r} is not closed by {CLOSING[value]}", strict, "read as text")
            add({"text": value})
            continue
        k = end + 1
        if value == "<ref>":
            add({"ref": inner})
            continue
        try:
            add({"box": [_corners(inner)]})
        except ValueError as err:
            _malformed(str(err), strict, "read as text")
            add({"text": f"<box>{inner}</box>"})
    return [{"text": "".join(e["text"])} if "text" in e else e for e in out]


@dataclass(frozen=True)
class Box:
    """One box: its `<ref>` label, corners on the 0–1000 grid and in pixels of the picture it refers to."""

    label: str | None  # the <ref> text the box belongs to, None when it has none
    grid: tuple[int, int, int, int]  # (x1, y1, x2, y2) on the 0–1000 grid
    pixels: tuple[int, int, int, int]  # the same corners as pixel edges of the picture: to_pixels(grid, size)
    picture: object  # the image path in the conversation, or the picture the caller named
    size: tuple[int, int]  # (width, height) of the picture


def _picture_size(picture) -> tuple[int, int]:
    """(width, height) of a PIL image or an image file."""
    if isinstance(picture, Image.Image):
        return picture.size
    if not isinstance(picture, (str, os.PathLike)):
        raise TypeError(f"a picture is a PIL image or an image path, got {type(picture).__name__}")
    return load_image(picture).size


def _passed(pictures) -> set[str]:
    """The picture paths a caller passes (NFC, as image spans write them), which an `<img>` of text or ids may name."""
    if pictures is None:
        return set()
    if isinstance(pictures, (str, os.PathLike)) or not all(isinstance(p, (str, os.PathLike)) for p in pictures):
        raise TypeError(f"pictures must be a list of picture paths, got {pictures!r:.80}")
    return {unicodedata.normalize("NFC", os.fspath(p)) for p in pictures}


def parse_boxes(source, tokenizer=None, *, picture=None, pictures=None, strict=True) -> list[Box]:
    """Every box of ids, a Query or text, scaled to the latest picture before it (or to `picture`).

    A picture named in an `<img>` of a Query (built from the caller's list) is opened; one named in text or ids (a
    model's answer may say anything) only when it is among `pictures`, the paths the caller passes."""
    named_size = None if picture is None else _picture_size(picture)
    passed, trusted = _passed(pictures), isinstance(source, Query)
    sizes, latest, boxes = {}, None, []
    for element in to_list_format(source, tokenizer, strict=strict):
        latest = element.get("image", latest)
        for corners in element.get("box", ()):
            try:
                check_box(corners)
                if picture is None and latest is None:
                    raise ValueError(
                        f"box {corners} comes before any picture; name the picture it refers to with picture="
                    )
                if picture is None and not trusted and unicodedata.normalize("NFC", latest) not in passed:
                    raise ValueError(
                        f"box {corners} refers to {latest!r}, named in <img>…</img> of the text, which is not among "
                        "the pictures passed: it is not opened; pass the paths the text may name as pictures=[…], or "
                        "the picture the boxes refer to as picture="
                    )
            except ValueError as err:
                _malformed(str(err), strict, "box skipped")
                continue
            if picture is None and latest not in sizes:
                sizes[latest] = _picture_size(latest)
            target, size = (picture, named_size) if picture is not None else (latest, sizes[latest])
            boxes.append(Box(element.get("ref"), corners, to_pixels(corners, size), target, size))
    return boxes


def _label_font(label: str, size: int, font):
    """(text, font) of a label: `font`, else Pillow's bundled font, or a CJK font for wide characters (the machine's,
    else the course's own, fonts.cjk_font_for)."""
    if font is not None:
        try:
            return label, ImageFont.truetype(font, size, layout_engine=ImageFont.Layout.BASIC)
        except OSError as err:
            raise ValueError(f"cannot read {str(font)!r} as a font ({err}); pass a .ttf/.otf/.ttc file") from None
    if not any(map(is_wide, label)):
        return label, ImageFont.load_default(size)
    found = cjk_font_for(label)
    if found is not None:
        return label, ImageFont.truetype(found, size, layout_engine=ImageFont.Layout.BASIC)
    warnings.warn(
        f"no font for the wide characters of the label {label!r}: the machine has no CJK font and the course's own "
        f"covers only common characters, so they are drawn as '?'; install one ({GET_A_FONT}) or pass font=path",
        stacklevel=3,
    )
    return "".join("?" if is_wide(c) else c for c in label), ImageFont.load_default(size)


def draw_boxes(image, boxes, font=None) -> Image.Image:
    """RGB copy of `image` (PIL image or path) with each Box (or the boxes of an answer text) outlined and labelled."""
    if not isinstance(image, (Image.Image, str, os.PathLike)):
        raise TypeError(f"image must be a PIL image or an image path, got {type(image).__name__}")
    if font is not None and not (isinstance(font, (str, os.PathLike)) and os.path.isfile(font)):
        raise FileNotFoundError(f"font must be the path of a .ttf/.otf/.ttc file, got {font!r}")
    picture = load_image(image)  # a new RGB image: the caller's stays as it is
    if isinstance(boxes, str):
        boxes = parse_boxes(boxes, picture=picture)
    boxes = list(boxes)
    for box in boxes:
        if not isinstance(box, Box):
            raise TypeError(f"boxes must be Box objects (from parse_boxes) or an answer text, got {type(box).__name__}")
    draw = ImageDraw.Draw(picture)
    line, text_size = max(2, round(min(picture.size) / 100)), max(10, round(min(picture.size) / 18))
    for k, box in enumerate(boxes):
        color = PALETTE[k % len(PALETTE)]
        x1, y1, x2, y2 = to_pixels(box.grid, picture.size)
        draw.rectangle((x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)), outline=color, width=line)  # on the edge pixels
        if box.label:
            text, label_font = _label_font(box.label, text_size, font)
            left, top, right, bottom = draw.textbbox((0, 0), text, font=label_font)
            w, h = right - left + 4, bottom - top + 4
            y = y1 - h if y1 >= h else y1  # above the box, or inside it when the box touches the top
            draw.rectangle((x1, y, x1 + w - 1, y + h - 1), fill=color)
            draw.text((x1 + 2 - left, y + 2 - top), text, fill=(255, 255, 255), font=label_font)
    return picture


def boxes_picture(pictures, answer: str):
    """The latest of `pictures` with the answer's <ref>/<box> boxes drawn, or None without boxes (or pictures)."""
    if not pictures or "<box>" not in answer:
        return None
    boxes = parse_boxes(answer, picture=pictures[-1], strict=False)
    return draw_boxes(pictures[-1], boxes) if boxes else None
