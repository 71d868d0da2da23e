"""Tests of grounding: reading <ref>/<box> answers back into the list format, boxes on pictures, drawing them."""

import unicodedata
import warnings

import numpy as np
import pytest
import torch
from conftest import time_limit
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFont

from qwenvl_lab import fonts as qwenvl_fonts
from qwenvl_lab import grounding
from qwenvl_lab.grounding import (
    PALETTE,
    Box,
    box_answer,
    check_box,
    draw_boxes,
    iou,
    parse_boxes,
    to_grid,
    to_list_format,
    to_pixels,
)
from qwenvl_lab.tokenizing import (
    BOX_END_ID,
    BOX_START_ID,
    IMG_TOKEN_SPAN,
    QUAD_END_ID,
    QUAD_START_ID,
    REF_END_ID,
    REF_START_ID,
    Query,
    answer_query,
    make_context,
)

ANSWER = "<ref>the red circle</ref><box>(100,200),(600,900)</box>"


def _normal_form(elements):
    """What to_list_format gives back for a list from_list_format accepts, written out independently."""
    merged = []
    for e in elements:
        if e == {"box": []}:
            continue  # writes nothing
        if "text" in e and merged and "text" in merged[-1]:  # from_list_format joins texts before the Query's NFC
            merged[-1] = {"text": merged[-1]["text"] + e["text"]}
        else:
            merged.append(e)
    out = []
    for e in merged:
        if "text" in e:
            if unicodedata.normalize("NFC", e["text"]):
                out.append({"text": unicodedata.normalize("NFC", e["text"])})
        elif "ref" in e:
            ref = {"ref": unicodedata.normalize("NFC", e["ref"])}
            out.append({**ref, "box": list(e["box"])} if e.get("box") else ref)
        elif "box" in e and out and ("ref" in out[-1] or "box" in out[-1]):  # boxes right after a ref or a box join it
            out[-1].setdefault("box", []).extend(e["box"])
        elif "image" in e:
            out.append({"image": unicodedata.normalize("NFC", e["image"])})  # the tokenizer writes paths NFC
        else:
            out.append(dict(e, **({"box": list(e["box"])} if "box" in e else {})))
    return out


# reading the list format


def test_query_ids_and_text_read_back_to_the_list(tokenizer):
    elements = [
        {"image": "a.png"},
        {"text": "Where is it?"},
        {"ref": "the red circle", "box": [(1, 2, 300, 400)]},
        {"text": " and "},
        {"box": [(5, 6, 7, 8), (0, 0, 1000, 1000)]},
        {"image": "b.png"},
        {"ref": "红色"},
    ]
    query = tokenizer.from_list_format(elements)
    assert str(query) == (
        "Picture 1: <img>a.png</img>\nWhere is it?<ref>the red circle</ref><box>(1,2),(300,400)</box>"
        " and <box>(5,6),(7,8)</box><box>(0,0),(1000,1000)</box>Picture 2: <img>b.png</img>\n"
        "<ref>红色</ref>"
    )
    for source in (query, str(query)):
        assert to_list_format(source) == elements
    ids = tokenizer.encode(query)
    for form in (ids, tuple(ids), torch.tensor(ids), np.array(ids)):
        assert to_list_format(form, tokenizer) == elements


def test_a_ref_takes_the_boxes_right_after_it():
    text = "<ref>a</ref><box>(1,2),(3,4)</box><box>(5,6),(7,8)</box><ref>b</ref>x<box>(0,0),(1,1)</box>"
    assert to_list_format(text) == [
        {"ref": "a", "box": [(1, 2, 3, 4), (5, 6, 7, 8)]},
        {"ref": "b"},
        {"text": "x"},
        {"box": [(0, 0, 1, 1)]},
    ]
    assert to_list_format("<ref></ref> <box> ( 1, 2 ),(3 ,4) </box>") == [
        {"ref": ""},
        {"text": " "},
        {"box": [(1, 2, 3, 4)]},
    ]


def test_ids_read_tags_only_from_special_ids_and_text_reads_typed_tags(tokenizer):
    typed = Query([("text", "a <ref>b</ref><box>(1,2),(3,4)</box>")])
    assert to_list_format(typed) == [{"text": str(typed)}]
    assert to_list_format(tokenizer.encode(str(typed)), tokenizer) == [{"text": str(typed)}]
    assert to_list_format(str(typed)) == [{"text": "a "}, {"ref": "b", "box": [(1, 2, 3, 4)]}]
    ids = (
        tokenizer.encode("x")
        + [REF_START_ID]
        + tokenizer.encode("y")
        + [REF_END_ID, BOX_START_ID]
        + tokenizer.encode("(0,0),(10,10)")
        + [BOX_END_ID]
    )
    assert to_list_format(ids, tokenizer) == [{"text": "x"}, {"ref": "y", "box": [(0, 0, 10, 10)]}]


def test_quad_and_other_special_tokens_stay_text(tokenizer):
    ids = [QUAD_START_ID, *tokenizer.encode("(1,2),(3,4),(5,6),(7,8)"), QUAD_END_ID]
    assert to_list_format(ids, tokenizer) == [{"text": "<quad>(1,2),(3,4),(5,6),(7,8)</quad>"}]
    assert to_list_format("<quad>(1,2)</quad>") == [{"text": "<quad>(1,2)</quad>"}]
    raw_text, context = make_context(tokenizer, tokenizer.from_list_format([{"image": "a.png"}, {"text": "hi"}]))
    expected = [
        {"text": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"},
        {"image": "a.png"},
        {"text": "hi<|im_end|>\n<|im_start|>assistant\n"},
    ]
    assert to_list_format(raw_text) == to_list_format(context, tokenizer) == to_list_format(str(raw_text)) == expected


def test_picture_labels_are_dropped_only_where_from_list_format_wrote_both():
    assert to_list_format("<img>a</img>\nhi") == [{"image": "a"}, {"text": "\nhi"}]
    assert to_list_format("Picture 1: <img>a</img>hi") == [{"text": "Picture 1: "}, {"image": "a"}, {"text": "hi"}]
    assert to_list_format("Picture 3: Picture 7: <img>a</img>\n\n") == [
        {"text": "Picture 3: "},
        {"image": "a"},
        {"text": "\n"},
    ]
    # two turns of a conversation each number their pictures from 1
    assert to_list_format("Picture 1: <img>a</img>\nq<|im_end|>Picture 1: <img>b</img>\n") == [
        {"image": "a"},
        {"text": "q<|im_end|>"},
        {"image": "b"},
    ]


def test_plain_text_is_read_nfc_and_image_paths_exact():
    assert to_list_format("e\u0301<ref>e\u0301</ref><img>e\u0301.png</img>") == [
        {"text": "é"},
        {"ref": "é"},
        {"image": "e\u0301.png"},
    ]


def test_reading_ids_needs_the_tokenizer(tokenizer):
    with pytest.raises(TypeError, match="tokenizer=load_tokenizer"):
        to_list_format([1, 2, 3])
    with pytest.raises(TypeError, match="token ids"):
        to_list_format([{"text": "hi"}], tokenizer)
    with pytest.raises(ValueError, match=">= 0"):
        to_list_format([-1], tokenizer)


PATH = st.text(min_size=1, max_size=24).filter(lambda p: len(p.encode("utf-8")) <= IMG_TOKEN_SPAN)
TEXT = st.lists(
    st.one_of(
        st.text(max_size=8),
        st.sampled_from(["\n", "Picture 1: ", "Picture 2: ", "<ref>", "<box>", "</img>", "e\u0301", "\u0301", " "]),
    ),
    max_size=4,
).map("".join)
BOXES = st.lists(st.tuples(*[st.integers(0, 1000)] * 4), max_size=2)
ELEMENT = st.one_of(
    st.builds(lambda p: {"image": p}, PATH),
    st.builds(lambda t: {"text": t}, TEXT),
    st.builds(lambda r: {"ref": r}, TEXT),
    st.builds(lambda b: {"box": b}, BOXES),
    st.builds(lambda r, b: {"ref": r, "box": b}, TEXT, BOXES),
)


@settings(max_examples=150, deadline=None)
@given(elements=st.lists(ELEMENT, max_size=6))
def test_to_list_format_inverts_from_list_format(tokenizer, elements):
    query = tokenizer.from_list_format(elements)
    assert to_list_format(query) == _normal_form(elements)
    assert to_list_format(tokenizer.encode(query), tokenizer) == _normal_form(elements)


PLAIN = st.text(st.characters(exclude_characters="<>"), max_size=8)
# an image path is UTF-8 text (its bytes fill the image span): a lone surrogate such as "\ud800" is refused, with the
# package's message (test_a_path_that_cannot_be_encoded_is_refused_with_the_packages_message)
PLAIN_PATH = st.text(st.characters(codec="utf-8", exclude_characters="<>"), min_size=1, max_size=8)
PLAIN_ELEMENT = st.one_of(
    st.builds(lambda p: {"image": p}, PLAIN_PATH),
    st.builds(lambda t: {"text": t}, st.one_of(PLAIN, st.just("\n"), st.just("Picture 1: "))),
    st.builds(lambda r, b: {"ref": r, "box": b}, PLAIN, BOXES),
)


@settings(max_examples=100, deadline=None)
@given(elements=st.lists(PLAIN_ELEMENT, max_size=6))
def test_to_list_format_reads_the_query_text_when_texts_hold_no_tags(tokenizer, elements):
    assert to_list_format(str(tokenizer.from_list_format(elements))) == _normal_form(elements)


def test_a_path_that_cannot_be_encoded_is_refused_with_the_packages_message(tokenizer):
    for elements in ([{"image": "\ud800"}], [{"text": "a"}, {"image": "x\udfff.png"}]):
        with pytest.raises(ValueError, match=r"image path .* cannot be encoded as UTF-8 \(surrogates not allowed"):
            tokenizer.from_list_format(elements)


# boxes on pictures


def test_grid_and_pixels_round_trip_for_pictures_up_to_1000_pixels():
    for size in (1, 2, 3, 7, 36, 224, 448, 999, 1000):
        for p in range(size + 1):
            g = to_grid((p, p, p, p), (size, size))
            assert 0 <= g[0] <= 1000 and to_pixels(g, (size, size)) == (p, p, p, p), (size, p)
    assert to_pixels((125, 125, 875, 875), (36, 36)) == (5, 5, 32, 32)  # 4.5 → 5 and 31.5 → 32: half up
    assert to_grid((1, 0, 3, 4), (8, 16)) == (125, 0, 375, 250)
    with pytest.raises(ValueError, match="two positive ints"):
        to_pixels((0, 0, 1, 1), (0, 10))


def test_boxes_scale_to_the_pixels_of_pictures_of_any_size(image_files):
    # red: 40×30, noise: 36×36, gradient: 50×64 pixels
    expected = {"red": (4, 6, 24, 27), "noise": (4, 7, 22, 32), "gradient": (5, 13, 30, 58)}
    for name, pixels in expected.items():
        [box] = parse_boxes(ANSWER, picture=image_files[name])
        assert box == Box(
            "the red circle", (100, 200, 600, 900), pixels, image_files[name], Image.open(image_files[name]).size
        )
    picture = Image.new("RGB", (1000, 10))
    [box] = parse_boxes(ANSWER, picture=picture)
    assert box.pixels == (100, 2, 600, 9) and box.picture is picture and box.size == (1000, 10)


def test_each_box_refers_to_the_latest_picture_before_it(tokenizer, image_files):
    red, noise, gradient = (str(image_files[k]) for k in ("red", "noise", "gradient"))
    query = tokenizer.from_list_format(
        [
            {"image": red},
            {"text": "a"},
            {"ref": "first", "box": [(0, 0, 500, 500)]},
            {"image": noise},
            {"image": gradient},
            {"box": [(500, 500, 1000, 1000)]},
            {"ref": "third", "box": [(0, 0, 1000, 1000)]},
        ]
    )
    passed = [red, noise, gradient]  # text and ids open only the pictures the caller passes
    for boxes in (
        parse_boxes(query),
        parse_boxes(tokenizer.encode(query), tokenizer, pictures=passed),
        parse_boxes(str(query), pictures=passed),
    ):
        assert [(b.label, b.picture, b.size, b.pixels) for b in boxes] == [
            ("first", red, (40, 30), (0, 0, 20, 15)),
            (None, gradient, (50, 64), (25, 32, 50, 64)),
            ("third", gradient, (50, 64), (0, 0, 50, 64)),
        ]
    named = parse_boxes(query, picture=image_files["noise"])
    assert [b.pixels for b in named] == [(0, 0, 18, 18), (18, 18, 36, 36), (0, 0, 36, 36)]
    assert {b.picture for b in named} == {image_files["noise"]}


def test_a_history_answer_refers_to_the_picture_of_its_turn(tokenizer, image_files):
    first = tokenizer.from_list_format([{"image": str(image_files["red"])}, {"text": "where?"}])
    raw_text, _ = make_context(
        tokenizer,
        tokenizer.from_list_format([{"image": str(image_files["gradient"])}]),
        history=[(first, box_answer("the red circle", (100, 200, 600, 900)))],
    )
    conversation = Query([*raw_text.segments, ("text", "see "), *box_answer("it", (0, 0, 500, 500)).segments])
    for source in (conversation, tokenizer.encode(conversation)):
        [earlier, later] = parse_boxes(source, tokenizer, pictures=[image_files["red"], image_files["gradient"]])
        assert (earlier.picture, earlier.label) == (str(image_files["red"]), "the red circle")
        assert earlier.pixels == (4, 6, 24, 27)
        assert (later.picture, later.label, later.pixels) == (str(image_files["gradient"]), "it", (0, 0, 25, 32))


MALFORMED = [  # (text, what the error says, the boxes read from it with strict=False)
    ("<ref>the red circle</ref><box>(100,200),(600,900)", "is not closed by </box>", []),
    ("<ref>the red circle<box>(10,20),(60,90)</box>", "is not closed by </ref>", [(None, (10, 20, 60, 90))]),
    ("the red circle</ref>", "</ref> without its opening tag", []),
    ("(1,2),(3,4)</box>", "</box> without its opening tag", []),
    ("<box>(a,b),(c,d)</box>", "is not \\(x1,y1\\),\\(x2,y2\\) with integer corners", []),
    ("<box>(1,2),(3)</box>", "with integer corners", []),
    ("<box>1,2,3,4</box>", "with integer corners", []),
    ("<box>(1,2),(3,1001)</box>", "outside the 0–1000 grid", []),
    ("<box>(-1,2),(3,4)</box>", "outside the 0–1000 grid", []),
    ("<ref>x</ref><box>(600,200),(100,900)</box>", "x2 < x1 or y2 < y1", []),
    ("<box>(100,900),(600,200)</box>", "x2 < x1 or y2 < y1", []),
    ("<img>x.png", "<img> without </img>", []),
    ("<img></img>", "no image path", []),
]


@pytest.mark.parametrize("bad, message, kept", MALFORMED)
def test_malformed_boxes_raise_when_strict_and_are_skipped_with_a_warning_otherwise(bad, message, kept):
    picture = Image.new("RGB", (100, 100))
    with pytest.raises(ValueError, match=message):
        parse_boxes(bad, picture=picture)
    with pytest.warns(UserWarning, match=message):
        boxes = parse_boxes(f"{bad} then {ANSWER}", picture=picture, strict=False)
    assert [(b.label, b.grid) for b in boxes] == [*kept, ("the red circle", (100, 200, 600, 900))]


def test_a_box_before_any_picture_needs_a_named_picture(image_files):
    with pytest.raises(ValueError, match="before any picture; name the picture it refers to with picture="):
        parse_boxes(ANSWER)
    with pytest.warns(UserWarning, match="before any picture"):
        text = ANSWER + f"<img>{image_files['red']}</img>" + ANSWER
        assert parse_boxes(text, pictures=[image_files["red"]], strict=False) == [
            Box("the red circle", (100, 200, 600, 900), (4, 6, 24, 27), str(image_files["red"]), (40, 30))
        ]


def test_to_list_format_is_strict_about_tags_but_not_about_box_order():
    assert to_list_format("<box>(600,200),(100,900)</box>") == [{"box": [(600, 200, 100, 900)]}]  # from_list_format too
    with pytest.raises(ValueError, match="not closed"):
        to_list_format("<ref>a")
    with pytest.warns(UserWarning, match="read as text"):
        assert to_list_format("a<ref>b", strict=False) == [{"text": "a<ref>b"}]
    with pytest.warns(UserWarning, match="read as text"):
        assert to_list_format("<box>(1,2)</box>", strict=False) == [{"text": "<box>(1,2)</box>"}]


@pytest.mark.parametrize("strict", [True, False])
def test_long_runs_of_tags_are_read_in_linear_time(strict):
    # "<img>" * 32000 took 23 s when every unclosed <img> searched the rest of the text for its </img>
    text = "<img>" * 32000 + "<ref>a" * 8000 + "<box>(1,2),(3,4)</box>" * 8000
    with warnings.catch_warnings(), time_limit(3):
        warnings.simplefilter("ignore")
        try:
            elements = to_list_format(text, strict=strict)
        except ValueError:
            assert strict
            return
    assert not strict and elements[0] == {"text": "<img>" * 32000 + "<ref>a" * 8000}


def test_missing_or_unreadable_pictures_get_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.png"):
        parse_boxes(f"<img>{tmp_path / 'nope.png'}</img>{ANSWER}", pictures=[tmp_path / "nope.png"])
    (tmp_path / "notes.png").write_text("not a picture")
    with pytest.raises(ValueError, match="cannot read"):
        parse_boxes(ANSWER, picture=tmp_path / "notes.png")
    with pytest.raises(TypeError, match="PIL image or an image path"):
        parse_boxes(ANSWER, picture=123)


# box answers and IoU


def test_box_answer_is_made_of_the_special_tokens(tokenizer):
    answer = box_answer("红色的圆形", (12, 34, 560, 780))
    assert str(answer) == "<ref>红色的圆形</ref><box>(12,34),(560,780)</box>"
    ids = tokenizer.encode(answer)
    assert [i for i in ids if i >= REF_START_ID] == [REF_START_ID, REF_END_ID, BOX_START_ID, BOX_END_ID]
    assert tokenizer.decode(ids) == str(answer)
    assert to_list_format(ids, tokenizer) == [{"ref": "红色的圆形", "box": [(12, 34, 560, 780)]}]
    with pytest.raises(ValueError, match="x2 < x1"):
        box_answer("a", (5, 0, 4, 10))
    with pytest.raises(ValueError, match="0–1000"):
        box_answer("a", (0, 0, 4, 1001))
    with pytest.raises(TypeError, match="ints"):
        box_answer("a", (0, 0, 4.5, 10))
    with pytest.raises(TypeError, match="4 ints"):
        check_box("(0,0),(1,1)")


def test_iou_values():
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert iou((0, 0, 10, 10), (0, 0, 5, 5)) == 0.25
    assert iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0  # edges touch: no area in common
    assert iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert iou((2, 2, 8, 6), (4, 0, 10, 4)) == pytest.approx(8 / (24 + 24 - 8))
    assert iou((0.0, 0.0, 1.5, 2.0), (0.5, 0.0, 1.5, 2.0)) == pytest.approx(2 / 3)
    assert iou((3, 3, 3, 3), (3, 3, 3, 3)) == 1.0 and iou((3, 3, 3, 3), (4, 4, 4, 4)) == 0.0
    with pytest.raises(ValueError, match="x2 < x1"):
        iou((10, 0, 0, 10), (0, 0, 10, 10))
    with pytest.raises(TypeError, match="4 numbers"):
        iou((0, 0, 10), (0, 0, 10, 10))


# drawing


def _picture():
    return Image.new("RGB", (200, 100), (250, 250, 250))


def test_drawn_outlines_lie_on_the_box_edges_and_the_input_is_untouched():
    picture = _picture()
    before = picture.tobytes()
    boxes = parse_boxes("<box>(100,200),(600,900)</box><ref>b</ref><box>(700,300),(900,700)</box>", picture=picture)
    out = np.array(draw_boxes(picture, boxes))
    assert picture.tobytes() == before and picture.size == (200, 100)
    background = np.array(_picture())
    assert boxes[0].pixels == (20, 20, 120, 90)  # outline on the edge pixels: columns 20 and 119, rows 20 and 89
    for x, y in ((20, 55), (119, 55), (70, 20), (70, 89)):
        assert tuple(out[y, x]) == PALETTE[0], (x, y)
    for x, y in ((19, 55), (120, 55), (70, 19), (70, 90), (70, 55)):  # just outside, and the middle
        assert tuple(out[y, x]) == tuple(background[y, x]), (x, y)
    assert boxes[1].pixels == (140, 30, 180, 70)
    for x, y in ((140, 50), (179, 50), (160, 69)):
        assert tuple(out[y, x]) == PALETTE[1]
    assert (out[15:30, 140:160] != background[15:30, 140:160]).any()  # its label sits above it
    assert (out[:20, 20:60] == background[:20, 20:60]).all()  # the first box has no label


def test_drawing_is_deterministic_and_reads_answers_paths_and_other_modes(image_files):
    picture = _picture()
    first = draw_boxes(picture, ANSWER)
    assert first.tobytes() == draw_boxes(picture, parse_boxes(ANSWER, picture=picture)).tobytes()
    assert first.tobytes() == draw_boxes(picture, ANSWER).tobytes() and first is not picture
    grey = Image.new("L", (40, 30), 200)
    out = draw_boxes(grey, "<box>(0,0),(1000,1000)</box>")
    assert out.mode == "RGB" and grey.mode == "L" and (np.array(grey) == 200).all()
    assert out.getpixel((0, 15)) == out.getpixel((39, 15)) == out.getpixel((20, 29)) == PALETTE[0]  # the border
    from_file = draw_boxes(image_files["red"], ANSWER)
    assert from_file.getpixel((4, 20)) == PALETTE[0] and Image.open(image_files["red"]).getpixel((4, 20)) != PALETTE[0]
    with pytest.raises(TypeError, match="Box objects"):
        draw_boxes(picture, [(0, 0, 10, 10)])
    with pytest.raises(TypeError, match="PIL image or an image path"):
        draw_boxes(np.zeros((4, 4, 3)), ANSWER)


@pytest.fixture
def font_folders(tmp_path, monkeypatch):
    """System font folders made empty (a folder to put fonts in is returned); the CJK font looked up again."""
    fonts = tmp_path / "share" / "fonts"
    fonts.mkdir(parents=True)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    monkeypatch.setenv("XDG_DATA_DIRS", str(tmp_path / "none"))
    qwenvl_fonts.system_cjk_font.cache_clear()
    yield fonts
    qwenvl_fonts.system_cjk_font.cache_clear()


def _bundled_font_bytes() -> bytes:
    """Pillow's bundled TrueType font (Latin only), as a file's bytes."""
    return ImageFont.load_default(12).path.getvalue()


def test_without_a_cjk_font_the_courses_own_draws_common_characters_and_rare_ones_are_question_marks(font_folders):
    picture = _picture()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chinese = draw_boxes(picture, "<ref>红色的圆形</ref><box>(100,200),(600,900)</box>")
        marks = draw_boxes(picture, "<ref>?????</ref><box>(100,200),(600,900)</box>")
    assert chinese.tobytes() != marks.tobytes()  # the shipped subset font has these five
    with pytest.warns(UserWarning, match="no font for the wide characters.*fonts-noto-cjk"):
        rare = draw_boxes(picture, "<ref>龘龖</ref><box>(100,200),(600,900)</box>")  # not in the subset
    assert rare.tobytes() == draw_boxes(picture, "<ref>??</ref><box>(100,200),(600,900)</box>").tobytes()


def test_a_cjk_font_in_the_font_folders_or_named_draws_the_label(font_folders, tmp_path):
    (font_folders / "wqy-microhei.ttc").write_bytes(_bundled_font_bytes())  # stands in for a CJK font
    assert qwenvl_fonts.system_cjk_font() == ("WenQuanYi Micro Hei", str(font_folders / "wqy-microhei.ttc"))
    picture = _picture()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = draw_boxes(picture, "<ref>红色的圆形</ref><box>(100,200),(600,900)</box>")
    marks = draw_boxes(picture, "<ref>?????</ref><box>(100,200),(600,900)</box>")
    assert found.tobytes() != marks.tobytes()
    named = draw_boxes(picture, ANSWER, font=font_folders / "wqy-microhei.ttc")
    assert named.tobytes() == draw_boxes(picture, ANSWER).tobytes()  # the same glyphs as Pillow's own font
    with pytest.raises(FileNotFoundError, match="font"):
        draw_boxes(picture, ANSWER, font=tmp_path / "missing.ttf")
    (tmp_path / "bad.ttf").write_text("not a font")
    with pytest.raises(ValueError, match="cannot read"):
        draw_boxes(picture, ANSWER, font=tmp_path / "bad.ttf")


@pytest.mark.parametrize("named", ["/etc/passwd", "{red}", "{tmp}/nowhere.png", "../../etc/shadow"])
@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "ids"])
def test_text_opens_only_the_pictures_the_caller_passes(named, as_ids, tokenizer, image_files, tmp_path, monkeypatch):
    """A model's answer (text or ids) may name any path in <img>…</img>: a box after it is refused (skipped with a
    warning when not strict) and nothing is opened, unless the caller passed that path in pictures=."""
    opened = []
    monkeypatch.setattr(grounding, "load_image", lambda p, *a, **k: opened.append(p))
    path = named.format(red=image_files["red"], tmp=tmp_path)
    text = f"<img>{path}</img>{ANSWER}"
    ids = tokenizer.encode(tokenizer.from_list_format([{"image": path}])) + tokenizer.encode(answer_query(ANSWER))
    source, more = (ids, [tokenizer]) if as_ids else (text, [])
    for passed in (None, [image_files["noise"]]):
        with pytest.raises(ValueError, match="which is not among the pictures passed: it is not opened"):
            parse_boxes(source, *more, pictures=passed)
        with pytest.warns(UserWarning, match="not among the pictures passed"):
            assert parse_boxes(source, *more, pictures=passed, strict=False) == []
    assert opened == []
