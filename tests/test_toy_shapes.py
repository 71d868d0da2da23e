"""Tests of the toy data: scenes, question/answer templates, determinism and the committed samples."""

import hashlib
import io
import math
import random
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from qwenvl_lab.grounding import box_answer, parse_boxes, to_pixels
from qwenvl_lab.grounding import to_list_format as read_list_format
from qwenvl_lab.tokenizing import BOX_END_ID, BOX_START_ID, ENDOFTEXT_ID, REF_END_ID, REF_START_ID, Query
from qwenvl_lab.toy import make_samples
from qwenvl_lab.toy.shapes import (
    COLOR_RGB,
    COLORS,
    KINDS,
    LANGS,
    QUESTION_KINDS,
    Example,
    Scene,
    Shape,
    answer_matches,
    color_of,
    count,
    describe,
    grounding_score,
    iou,
    make_dataset,
    make_example,
    question,
    random_scene,
    shape_name,
    to_list_format,
    where_is,
    which_picture,
)

DATA_IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"

# The templates of the spec, written out independently of the implementation
ZH_COLOR = {"红色": "red", "绿色": "green", "蓝色": "blue", "黄色": "yellow"}
ZH_KIND = {"圆形": "circle", "正方形": "square", "三角形": "triangle"}
EN_ONE = r"(red|green|blue|yellow) (circle|square|triangle)"
ZH_ONE = r"一个(红色|绿色|蓝色|黄色)的(圆形|正方形|三角形)"
WHAT = {
    "en": [rf"A {EN_ONE}\.", rf"A {EN_ONE} and a {EN_ONE}\.", rf"A {EN_ONE}, a {EN_ONE} and a {EN_ONE}\."],
    "zh": [rf"{ZH_ONE}。", rf"{ZH_ONE}和{ZH_ONE}。", rf"{ZH_ONE}、{ZH_ONE}和{ZH_ONE}。"],
}
COUNTS = {"en": ["One.", "Two.", "Three."], "zh": ["一个。", "两个。", "三个。"]}
PICTURE = {"en": ["Picture 1.", "Picture 2."], "zh": ["第一张图片。", "第二张图片。"]}

DATASET = make_dataset(seed=7, n=600)  # 60 of each (question kind, language)
WHERE = make_dataset(seed=5, n=120, kinds=("where",))  # 60 in each language
EN_WHERE = r"<ref>the (red|green|blue|yellow) (circle|square|triangle)</ref><box>\((\d+),(\d+)\),\((\d+),(\d+)\)</box>"
ZH_WHERE = r"<ref>(红色|绿色|蓝色|黄色)的(圆形|正方形|三角形)</ref><box>\((\d+),(\d+)\),\((\d+),(\d+)\)</box>"


def _to_en(word):
    """English name of a Chinese colour or kind word (English words pass through)."""
    return ZH_COLOR.get(word) or ZH_KIND.get(word) or word


def _parse_what(answer, lang):
    """[(color, kind), ...] read from a 'what' answer, or None when no template matches."""
    for n, pattern in enumerate(WHAT[lang], start=1):
        m = re.fullmatch(pattern, answer)
        if m:
            words = [_to_en(w) for w in m.groups()]
            assert len(words) == 2 * n
            return list(zip(words[0::2], words[1::2]))
    return None


def _pairs(scene):
    """(color, kind) of each shape, left to right by horizontal centre, computed here from the boxes."""
    return [(s.color, s.kind) for s in sorted(scene.shapes, key=lambda s: s.box[0] + s.box[2])]


def _kind_counts(scene):
    """How many shapes of each kind the scene has."""
    return {k: sum(s.kind == k for s in scene.shapes) for k in KINDS}


def test_dataset_is_deterministic_down_to_the_pixels():
    again = make_dataset(seed=7, n=600)
    assert again == DATASET
    for a, b in zip(DATASET[:40], again[:40]):
        assert [p.tobytes() for p in a.pictures()] == [p.tobytes() for p in b.pictures()]
    assert make_dataset(seed=8, n=40) != DATASET[:40]
    # global random state plays no part
    random.seed(123)
    assert make_dataset(seed=7, n=16) == DATASET[:16]


@pytest.mark.slow
def test_dataset_does_not_depend_on_the_hash_seed():
    code = (
        "from qwenvl_lab.toy.shapes import make_dataset;"
        "print(repr([(e.question, e.answer, e.images) for e in make_dataset(3, 40)]))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=Path(__file__).resolve().parents[1],
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


def test_dataset_cycles_through_every_kind_and_language():
    combos = [(e.kind, e.lang) for e in DATASET]
    assert set(combos) == {(k, lang) for k in QUESTION_KINDS for lang in LANGS}
    assert len(set(combos[:10])) == 10
    only = make_dataset(seed=1, n=10, kinds=("count",), langs=("zh",))
    assert {(e.kind, e.lang) for e in only} == {("count", "zh")}
    assert make_dataset(seed=1, n=0) == []


def test_the_default_dataset_cycles_through_every_kind_and_stays_as_it_is():
    # the default questions the shipped toy model is evaluated on, the same on every machine
    assert [e.kind for e in DATASET[:10]] == ["what", "color", "count", "which", "where"] * 2
    assert hashlib.sha256(repr(DATASET).encode()).hexdigest() == (
        "d32c0fc0e91afa4610270b20f6d2def191b6c6d6e0ef496954e85a781ab9afb9"
    )
    assert make_dataset(7, 48, kinds=("what", "color", "count", "which", "where")) == DATASET[:48]


def test_what_answers_follow_the_template_left_to_right():
    examples = [e for e in DATASET if e.kind == "what"]
    assert {len(e.images[0].shapes) for e in examples} == {1, 2, 3}
    for e in examples:
        assert e.question == {"en": "What is in the picture?", "zh": "图片里是什么？"}[e.lang]
        assert _parse_what(e.answer, e.lang) == _pairs(e.images[0]), e.answer


def test_color_questions_only_ask_about_a_kind_that_appears_once():
    examples = [e for e in DATASET if e.kind == "color"]
    for e in examples:
        scene = e.images[0]
        if e.lang == "en":
            kind = re.fullmatch(r"What color is the (circle|square|triangle)\?", e.question).group(1)
            color = re.fullmatch(r"(Red|Green|Blue|Yellow)\.", e.answer).group(1).lower()
        else:
            kind = ZH_KIND[re.fullmatch(r"(圆形|正方形|三角形)是什么颜色？", e.question).group(1)]
            color = ZH_COLOR[re.fullmatch(r"(红色|绿色|蓝色|黄色)。", e.answer).group(1)]
        assert _kind_counts(scene)[kind] == 1
        assert [s.color for s in scene.shapes if s.kind == kind] == [color]
    assert len({e.answer for e in examples}) == 8  # every colour in both languages


def test_count_answers_match_the_number_of_shapes():
    for e in (e for e in DATASET if e.kind == "count"):
        assert e.question == {"en": "How many shapes are there?", "zh": "图片里有几个图形？"}[e.lang]
        assert e.answer == COUNTS[e.lang][len(e.images[0].shapes) - 1]


def test_which_questions_have_exactly_one_matching_picture():
    examples = [e for e in DATASET if e.kind == "which"]
    for e in examples:
        assert len(e.images) == 2
        if e.lang == "en":
            color, kind = re.fullmatch(rf"Which picture has a {EN_ONE}\?", e.question).groups()
        else:
            color, kind = (
                _to_en(w)
                for w in re.fullmatch(r"哪张图片里有(红色|绿色|蓝色|黄色)的(圆形|正方形|三角形)？", e.question).groups()
            )
        having = [i for i, scene in enumerate(e.images) if (color, kind) in _pairs(scene)]
        assert len(having) == 1
        assert e.answer == PICTURE[e.lang][having[0]]
    assert {e.answer for e in examples} == set(PICTURE["en"] + PICTURE["zh"])


def test_random_scenes_keep_their_shapes_apart_and_in_the_picture():
    rng = random.Random(0)
    for _ in range(300):
        scene = random_scene(rng)
        assert all(235 <= c <= 255 for c in scene.background)
        for s in scene.shapes:
            left, top, right, bottom = s.box
            assert 0.04 - 1e-9 <= left and right <= 0.96 + 1e-9 and 0.04 - 1e-9 <= top and bottom <= 0.96 + 1e-9
            assert right - left >= 0.2 - 1e-9 and abs((right - left) - (bottom - top)) < 1e-6
        for i, a in enumerate(scene.shapes):
            for b in scene.shapes[i + 1 :]:
                gap_x = max(b.box[0] - a.box[2], a.box[0] - b.box[2])
                gap_y = max(b.box[1] - a.box[3], a.box[1] - b.box[3])
                assert max(gap_x, gap_y) >= 0.04 - 1e-9
                assert abs((a.box[0] + a.box[2]) - (b.box[0] + b.box[2])) / 2 >= 0.15 - 1e-9
    assert len(random_scene(rng, n_shapes=3).shapes) == 3


def test_rendered_pictures_show_each_shape_colour_at_its_centre():
    for e in DATASET[:80]:
        pictures = e.pictures()
        assert len(pictures) == len(e.images)
        for scene, picture in zip(e.images, pictures):
            assert picture.mode == "RGB" and picture.size == (224, 224)
            assert picture.getpixel((0, 0)) == scene.background
            small = picture.resize((112, 112), Image.BICUBIC)  # what the toy model sees
            for s in scene.shapes:
                cx, cy = s.center
                assert picture.getpixel((int(cx * 224), int(cy * 224))) == s.fill
                seen = np.array(small.getpixel((int(cx * 112), int(cy * 112))))
                nearest = min(COLORS, key=lambda c: np.abs(seen - COLOR_RGB[c]).sum())
                assert nearest == s.color
    assert Scene((Shape("circle", "red", (0.2, 0.2, 0.6, 0.6)),)).render(size=64).size == (64, 64)


def test_triangle_is_upright_and_square_fills_its_box():
    scene = Scene((Shape("triangle", "green", (0.1, 0.1, 0.5, 0.5)), Shape("square", "blue", (0.6, 0.1, 0.9, 0.4))))
    pixels = np.array(scene.render(100))
    green = (pixels == COLOR_RGB["green"]).all(axis=-1)
    assert green[48, 11] and green[48, 48] and not green[12, 11] and green[12, 30]  # wide base, pointed top
    blue = (pixels == COLOR_RGB["blue"]).all(axis=-1)
    assert blue[10:40, 60:90].all() and blue.sum() == 900


def test_fixed_answers_match_the_spec_in_both_languages():
    three = make_samples.SAMPLES["three_shapes.png"]
    assert describe(three, "en") == "A red circle, a blue square and a green triangle."
    assert describe(three, "zh") == "一个红色的圆形、一个蓝色的正方形和一个绿色的三角形。"
    two = make_samples.SAMPLES["red_circle_blue_square.png"]
    assert describe(two, "en") == "A red circle and a blue square."
    assert describe(two, "zh") == "一个红色的圆形和一个蓝色的正方形。"
    assert describe(make_samples.SAMPLES["red_circle.png"], "zh") == "一个红色的圆形。"
    assert (color_of(two, "circle", "en"), color_of(two, "circle", "zh")) == ("Red.", "红色。")
    assert (count(two, "en"), count(two, "zh")) == ("Two.", "两个。")
    pair = [make_samples.SAMPLES[name] for name in make_samples.PAIRS[0]]
    assert which_picture(pair, "blue", "square", "en") == "Picture 2."
    assert which_picture(pair, "blue", "square", "zh") == "第二张图片。"
    assert question("which", "en", shape="square", color="blue") == "Which picture has a blue square?"
    assert question("which", "zh", shape="square", color="blue") == "哪张图片里有蓝色的正方形？"
    assert question("color", "zh", shape="circle") == "圆形是什么颜色？"


def test_to_list_format_and_answer_matches():
    example = next(e for e in DATASET if e.kind == "which")
    items = to_list_format(example, ["a.png", Path("b.png")])
    assert items == [{"image": "a.png"}, {"image": "b.png"}, {"text": example.question}]
    assert answer_matches(f"  {example.answer}\n", example)
    assert not answer_matches("Picture 3.", example)
    with pytest.raises(ValueError, match="2 picture"):
        to_list_format(example, ["a.png"])
    with pytest.raises(TypeError, match="list of paths"):
        to_list_format(example, "a.png")
    with pytest.raises(TypeError, match="str"):
        answer_matches(None, example)


def test_scene_repr_png_is_the_rendered_picture():
    scene = make_samples.SAMPLES["three_shapes.png"]
    shown = Image.open(io.BytesIO(scene._repr_png_())).convert("RGB")
    assert shown.tobytes() == scene.render().tobytes()


def test_bad_input_gets_a_clear_error():
    circle = Shape("circle", "red", (0.1, 0.1, 0.4, 0.4))
    with pytest.raises(ValueError, match="unknown shape kind 'star'"):
        Shape("star", "red", (0.1, 0.1, 0.4, 0.4))
    with pytest.raises(ValueError, match="unknown color 'purple'"):
        Shape("circle", "purple", (0.1, 0.1, 0.4, 0.4))
    with pytest.raises(ValueError, match="square"):
        Shape("circle", "red", (0.1, 0.1, 0.4, 0.6))
    with pytest.raises(ValueError, match="left < right"):
        Shape("circle", "red", (0.5, 0.1, 0.4, 0.0))
    with pytest.raises(ValueError, match="too close"):
        Scene((circle, Shape("square", "blue", (0.3, 0.3, 0.6, 0.6))))
    with pytest.raises(ValueError, match="1 to 3 shapes"):
        Scene(())
    with pytest.raises(ValueError, match="background"):
        Scene((circle,), background=(300, 0, 0))
    with pytest.raises(ValueError, match="size"):
        Scene((circle,)).render(size=0)
    with pytest.raises(TypeError, match="random.Random"):
        random_scene(0)
    with pytest.raises(ValueError, match="n_shapes"):
        random_scene(random.Random(0), n_shapes=4)
    twins = Scene((circle, Shape("circle", "blue", (0.6, 0.6, 0.9, 0.9))))
    with pytest.raises(ValueError, match="2 circle.*exactly once"):
        color_of(twins, "circle")
    with pytest.raises(ValueError, match="exactly one must"):
        which_picture([twins, twins], "red", "circle")
    with pytest.raises(ValueError, match="unknown lang 'fr'"):
        describe(twins, "fr")
    with pytest.raises(ValueError, match="needs shape"):
        question("color", "en")
    with pytest.raises(ValueError, match="takes no color"):
        question("count", "en", color="red")
    with pytest.raises(ValueError, match="unknown question kind"):
        make_example(random.Random(0), "why", "en")
    with pytest.raises(TypeError, match="single string"):
        make_dataset(0, 4, kinds="what")
    with pytest.raises(ValueError, match="unknown kind 'why'"):
        make_dataset(0, 4, kinds=("what", "why"))
    with pytest.raises(ValueError, match="n must be"):
        make_dataset(0, -1)
    with pytest.raises(TypeError, match="Scene"):
        Example([], "q", "a", "what", "en")


def test_sample_names_list_their_shapes_left_to_right():
    for name, scene in make_samples.SAMPLES.items():
        if name == "three_shapes.png":
            continue
        words = re.sub(r"^pair_[ab]_", "", name.removesuffix(".png")).split("_")
        assert list(zip(words[0::2], words[1::2])) == _pairs(scene)
    for first, second in make_samples.PAIRS:
        assert first in make_samples.SAMPLES and second in make_samples.SAMPLES


def test_make_samples_output_matches_the_committed_files(tmp_path):
    make_samples.main(["--out", str(tmp_path)])
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(p.name for p in DATA_IMAGES.iterdir())
    assert len(written) == len(make_samples.SAMPLES) + 1 >= 12
    for name in make_samples.SAMPLES:
        fresh, committed = Image.open(tmp_path / name), Image.open(DATA_IMAGES / name)
        assert committed.mode == "RGB" and committed.size == (224, 224)
        assert np.array_equal(np.array(fresh), np.array(committed)), name
    readme = (DATA_IMAGES / "README.md").read_text(encoding="utf-8")
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == readme
    for name in make_samples.SAMPLES:
        assert f"## {name}" in readme
    assert "| Which picture has a blue square? | Picture 2. |" in readme


# grounding: "where" questions


def _round_half_up(value: Fraction) -> int:
    return math.floor(value + Fraction(1, 2))


def _asked(example):
    """(color, kind) named in a 'where' question, in English words."""
    pattern = (
        r"Where is the (red|green|blue|yellow) (circle|square|triangle)\?"
        if example.lang == "en"
        else r"框出图中(红色|绿色|蓝色|黄色)的(圆形|正方形|三角形)"
    )
    return tuple(_to_en(w) for w in re.fullmatch(pattern, example.question).groups())


def test_where_questions_name_a_shape_that_appears_once_and_answer_with_its_name_and_box():
    assert {e.lang for e in WHERE} == set(LANGS) and {e.kind for e in WHERE} == {"where"}
    for e in WHERE:
        color, kind = _asked(e)
        assert [(s.color, s.kind) for s in e.images[0].shapes].count((color, kind)) == 1
        assert isinstance(e.answer, Query)
        m = re.fullmatch(EN_WHERE if e.lang == "en" else ZH_WHERE, str(e.answer))
        assert m, str(e.answer)
        assert tuple(_to_en(w) for w in m.groups()[:2]) == (color, kind)
    assert {_asked(e) for e in WHERE} >= {("red", "circle"), ("blue", "square"), ("green", "triangle")}


def test_where_boxes_are_the_edges_of_the_painted_pixels():
    for e in WHERE:
        color, kind = _asked(e)
        [shape] = [s for s in e.images[0].shapes if (s.color, s.kind) == (color, kind)]
        alone = np.array(Scene((shape,), background=(0, 0, 0) if shape.fill != (0, 0, 0) else (1, 1, 1)).render())
        ys, xs = np.nonzero((alone == shape.fill).all(axis=-1))
        painted = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)  # pixel edges: right and bottom exclusive
        grid = tuple(_round_half_up(Fraction(v * 1000, 224)) for v in painted)
        [element] = read_list_format(e.answer)
        assert element["box"] == [grid]
        [box] = parse_boxes(e.answer, picture=e.pictures()[0])
        assert box.pixels == painted and box.label == element["ref"]


def test_grid_boxes_map_back_to_the_painted_pixels_at_any_size():
    rng = random.Random(3)
    shapes = [s for _ in range(40) for s in random_scene(rng).shapes] + [Shape("square", "red", (0.5, 0.5, 1.0, 1.0))]
    for size in (16, 17, 37, 100, 224, 448, 1000):
        for s in shapes:
            left, top, right, bottom = s.pixel_box(size)
            expected = (left, top, min(right + 1, size), min(bottom + 1, size))
            assert to_pixels(s.grid_box(size), (size, size)) == expected
            assert all(0 <= v <= 1000 for v in s.grid_box(size))


def test_where_answers_encode_to_the_special_ids(tokenizer):
    for e in WHERE[:20]:
        ids = tokenizer.encode(e.answer)
        assert [i for i in ids if i >= ENDOFTEXT_ID] == [REF_START_ID, REF_END_ID, BOX_START_ID, BOX_END_ID]
        assert ids[0] == REF_START_ID and ids[-1] == BOX_END_ID
        assert tokenizer.decode(ids) == str(e.answer)
        assert read_list_format(ids, tokenizer) == read_list_format(e.answer)
        # typed as plain text the same characters hold no special id
        assert all(i < ENDOFTEXT_ID for i in tokenizer.encode(str(e.answer)))


def test_fixed_where_answers_match_the_spec_in_both_languages():
    # red circle (0.3, 0.3, 0.7, 0.7) at 224 px: pixels 67 … 156 painted, edges 67 and 157: 67000/224 = 299.1,
    # 157000/224 = 700.9
    red = make_samples.SAMPLES["red_circle.png"]
    assert str(where_is(red, "red", "circle", "en")) == "<ref>the red circle</ref><box>(299,299),(701,701)</box>"
    assert str(where_is(red, "red", "circle", "zh")) == "<ref>红色的圆形</ref><box>(299,299),(701,701)</box>"
    # blue square (0.38, 0.6, 0.65, 0.87): left 85, top 134, side 60 px → edges 85, 134, 145, 194
    three = make_samples.SAMPLES["three_shapes.png"]
    assert str(where_is(three, "blue", "square", "en")) == "<ref>the blue square</ref><box>(379,598),(647,866)</box>"
    assert question("where", "en", shape="circle", color="red") == "Where is the red circle?"
    assert question("where", "zh", shape="circle", color="red") == "框出图中红色的圆形"
    assert (shape_name("green", "triangle", "en"), shape_name("green", "triangle", "zh")) == (
        "the green triangle",
        "绿色的三角形",
    )
    twins = Scene((Shape("circle", "red", (0.1, 0.1, 0.4, 0.4)), Shape("circle", "red", (0.6, 0.6, 0.9, 0.9))))
    with pytest.raises(ValueError, match="2 red circle.*exactly once"):
        where_is(twins, "red", "circle")
    with pytest.raises(ValueError, match="0 blue circle"):
        where_is(twins, "blue", "circle")
    with pytest.raises(ValueError, match="needs color"):
        question("where", "en", shape="circle")


def test_grounding_score(tokenizer):
    e = next(e for e in WHERE if e.lang == "en")
    [truth] = read_list_format(e.answer)
    x1, y1, x2, y2 = truth["box"][0]
    perfect = {"well_formed": True, "right_shape": True, "iou": 1.0}
    assert grounding_score(str(e.answer), e) == perfect
    assert grounding_score(f" {tokenizer.decode(tokenizer.encode(e.answer))}\n", e) == perfect
    other = next(n for n in (shape_name(c, k) for c in COLORS for k in KINDS) if n != truth["ref"])
    assert grounding_score(str(box_answer(other, (x1, y1, x2, y2))), e) == {
        "well_formed": True,
        "right_shape": False,
        "iou": 1.0,
    }
    d = (x2 - x1) // 4
    shifted = grounding_score(str(box_answer(truth["ref"], (x1 + d, y1, x2 + d, y2))), e)
    w, h = x2 - x1, y2 - y1
    assert shifted["right_shape"] and shifted["iou"] == pytest.approx((w - d) * h / (2 * w * h - (w - d) * h))
    assert shifted["iou"] == pytest.approx(iou((x1 + d, y1, x2 + d, y2), (x1, y1, x2, y2))) and 0.5 < shifted["iou"] < 1
    box_text = f"({x1},{y1}),({x2},{y2})"
    for bad in (
        tokenizer.decode(tokenizer.encode(e.answer), skip_special_tokens=True),  # the tags dropped
        f"<ref>{truth['ref']}</ref>",
        f"<box>{box_text}</box>",
        f"It is <ref>{truth['ref']}</ref><box>{box_text}</box>",
        f"<ref>{truth['ref']}</ref><box>{box_text}</box><box>{box_text}</box>",
        f"<ref>{truth['ref']}</ref><box>({x2},{y1}),({x1},{y2})</box>",
        f"<ref>{truth['ref']}<box>{box_text}</box>",
        f"<ref>{truth['ref']}</ref><box>({x1},{y1}),({x2},1200)</box>",
        "",
    ):
        assert grounding_score(bad, e) == {"well_formed": False, "right_shape": False, "iou": 0.0}, bad
    zh = next(e for e in WHERE if e.lang == "zh")
    assert grounding_score(str(zh.answer), zh) == perfect
    with pytest.raises(ValueError, match="'where' examples"):
        grounding_score("Red.", DATASET[1])
    with pytest.raises(TypeError, match="answer text"):
        grounding_score(tokenizer.encode(e.answer), e)
