"""Toy data: pictures of coloured shapes and the questions and answers the toy model learns."""

from __future__ import annotations

import io
import os
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from ..checks.values import is_int, is_number
from ..grounding import box_answer, iou, to_grid
from ..grounding import to_list_format as read_list_format
from ..tokenizing import Query

COLORS = ("red", "green", "blue", "yellow")
KINDS = ("circle", "square", "triangle")
QUESTION_KINDS = ("what", "color", "count", "which", "where")  # "where" is answered with <ref>…</ref><box>…</box>
LANGS = ("en", "zh")

# Nominal fill of each colour; random scenes shift every channel by up to COLOR_JITTER
COLOR_RGB = {
    "red": (220, 40, 40),
    "green": (40, 170, 70),
    "blue": (40, 90, 220),
    "yellow": (240, 200, 30),
}
COLOR_JITTER = 20
BACKGROUND = (250, 250, 250)  # default background; random scenes draw each channel in 235…255
MAX_SHAPES = 3
PICTURE_SIZE = 224  # pictures are drawn at this size; the vision preprocessing resizes them to the model's input

# Layout rules, as fractions of the picture width (boxes are squares in [0, 1] coordinates)
EDGE = 0.04  # random shapes keep this distance from the border
MIN_GAP = 0.04  # two boxes are this far apart along x or along y
MIN_CENTER_GAP = 0.15  # horizontal centres this far apart: "left to right" is unambiguous
MIN_SIDE = 0.2  # 22 px of the toy model's 112×112 input: more than one 14-px patch across
MAX_SIDE = {1: 0.6, 2: 0.45, 3: 0.36}  # by number of shapes, so that they fit
_EPS = 1e-9
_MAX_DRAWS = 1000

_WORDS = {
    "en": {
        "red": "red",
        "green": "green",
        "blue": "blue",
        "yellow": "yellow",
        "circle": "circle",
        "square": "square",
        "triangle": "triangle",
    },
    "zh": {
        "red": "红色",
        "green": "绿色",
        "blue": "蓝色",
        "yellow": "黄色",
        "circle": "圆形",
        "square": "正方形",
        "triangle": "三角形",
    },
}
_COUNTS = {"en": ("One.", "Two.", "Three."), "zh": ("一个。", "两个。", "三个。")}
_QUESTIONS = {
    "en": {
        "what": "What is in the picture?",
        "color": "What color is the {shape}?",
        "count": "How many shapes are there?",
        "which": "Which picture has a {color} {shape}?",
        "where": "Where is the {color} {shape}?",
    },
    "zh": {
        "what": "图片里是什么？",
        "color": "{shape}是什么颜色？",
        "count": "图片里有几个图形？",
        "which": "哪张图片里有{color}的{shape}？",
        "where": "框出图中{color}的{shape}",
    },
}
_PICTURES = {"en": ("Picture 1.", "Picture 2."), "zh": ("第一张图片。", "第二张图片。")}
_NO_PICTURE = {"en": "There is no picture.", "zh": "没有图片。"}


def _check_choice(value, allowed, what):
    """Raise a ValueError unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}: use one of {allowed}")


def _check_size(size):
    """Raise a ValueError unless `size` (pixels of a square picture) is an int >= 16."""
    if not is_int(size) or size < 16:
        raise ValueError(f"size must be an int >= 16 pixels, got {size!r}")


def _check_rgb(rgb, what):
    """Raise unless `rgb` is three ints in 0…255."""
    if not isinstance(rgb, tuple) or len(rgb) != 3 or not all(is_int(c) and 0 <= c <= 255 for c in rgb):
        raise ValueError(f"{what} must be a tuple of three ints in 0..255, got {rgb!r}")


@dataclass(frozen=True)
class Shape:
    """One solid shape: `kind` in KINDS, `color` in COLORS, `box` = (left, top, right, bottom) in [0, 1]."""

    kind: str
    color: str
    box: tuple[float, float, float, float]
    rgb: tuple[int, int, int] | None = None  # exact fill; None means COLOR_RGB[color]

    def __post_init__(self):
        _check_choice(self.kind, KINDS, "shape kind")
        _check_choice(self.color, COLORS, "color")
        if self.rgb is not None:
            _check_rgb(self.rgb, "rgb")
        box = tuple(self.box)
        if len(box) != 4 or not all(is_number(v) for v in box):
            raise ValueError(f"box must be 4 numbers (left, top, right, bottom) in [0, 1], got {self.box!r}")
        left, top, right, bottom = box
        if not (0 <= left < right <= 1 and 0 <= top < bottom <= 1):
            raise ValueError(f"box {box} must satisfy 0 <= left < right <= 1 and 0 <= top < bottom <= 1")
        if abs((right - left) - (bottom - top)) > 1e-6:
            raise ValueError(f"box {box} must be a square (width == height) so circles and squares stay true")
        object.__setattr__(self, "box", box)

    @property
    def fill(self) -> tuple[int, int, int]:
        """The RGB colour the shape is painted with."""
        return self.rgb if self.rgb is not None else COLOR_RGB[self.color]

    @property
    def center(self) -> tuple[float, float]:
        """Centre of the box, (x, y) in [0, 1]; it lies inside every kind of shape."""
        left, top, right, bottom = self.box
        return ((left + right) / 2, (top + bottom) / 2)

    def pixel_box(self, size: int = PICTURE_SIZE) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of the pixels render(size) paints for the shape, right and bottom included."""
        _check_size(size)
        left, top = round(self.box[0] * size), round(self.box[1] * size)
        last = round((self.box[2] - self.box[0]) * size) - 1  # side in pixels, minus one
        return left, top, left + last, top + last

    def grid_box(self, size: int = PICTURE_SIZE) -> tuple[int, int, int, int]:
        """The shape's box on Qwen-VL's 0–1000 grid of the size×size picture: the edges of its painted pixels."""
        left, top, right, bottom = self.pixel_box(size)
        return to_grid((left, top, min(right + 1, size), min(bottom + 1, size)), (size, size))


def _separated(a: Shape, b: Shape) -> bool:
    """True when two shapes keep MIN_GAP between their boxes and MIN_CENTER_GAP between their centres."""
    gap_x = max(b.box[0] - a.box[2], a.box[0] - b.box[2])
    gap_y = max(b.box[1] - a.box[3], a.box[1] - b.box[3])
    far_enough = max(gap_x, gap_y) >= MIN_GAP - _EPS
    return far_enough and abs(a.center[0] - b.center[0]) >= MIN_CENTER_GAP - _EPS


@dataclass(frozen=True)
class Scene:
    """One picture: 1…3 non-overlapping shapes with distinct horizontal centres on a plain background."""

    shapes: tuple[Shape, ...]
    background: tuple[int, int, int] = BACKGROUND

    def __post_init__(self):
        shapes = tuple(self.shapes)
        if not 1 <= len(shapes) <= MAX_SHAPES:
            raise ValueError(f"a scene holds 1 to {MAX_SHAPES} shapes, got {len(shapes)}")
        if not all(isinstance(s, Shape) for s in shapes):
            raise TypeError("Scene.shapes must contain Shape objects")
        _check_rgb(self.background, "background")
        for i, a in enumerate(shapes):
            for b in shapes[i + 1 :]:
                if not _separated(a, b):
                    raise ValueError(
                        f"shapes {a.box} and {b.box} are too close: boxes need a gap of {MIN_GAP} "
                        f"and horizontal centres {MIN_CENTER_GAP} apart (fractions of the width)"
                    )
        object.__setattr__(self, "shapes", shapes)

    def left_to_right(self) -> tuple[Shape, ...]:
        """The shapes sorted by horizontal centre, the order in which answers list them."""
        return tuple(sorted(self.shapes, key=lambda s: s.center[0]))

    def render(self, size: int = PICTURE_SIZE) -> Image.Image:
        """Draw the scene as a size×size RGB picture (deterministic, no anti-aliasing)."""
        _check_size(size)
        image = Image.new("RGB", (size, size), self.background)
        draw = ImageDraw.Draw(image)
        for shape in self.shapes:
            left, top, right, bottom = shape.pixel_box(size)
            if shape.kind == "circle":
                draw.ellipse((left, top, right, bottom), fill=shape.fill)
            elif shape.kind == "square":
                draw.rectangle((left, top, right, bottom), fill=shape.fill)
            else:  # upright isosceles triangle filling the box
                draw.polygon([(left, bottom), (right, bottom), ((left + right) / 2, top)], fill=shape.fill)
        return image

    def _repr_png_(self) -> bytes:
        """Show the scene as a picture in Jupyter."""
        buffer = io.BytesIO()
        self.render().save(buffer, format="PNG")
        return buffer.getvalue()


def _draw(make, what: str):
    """Call `make()` until it returns something (not None); a RuntimeError if it never does."""
    for _ in range(_MAX_DRAWS):
        result = make()
        if result is not None:
            return result
    raise RuntimeError(f"could not draw {what} in {_MAX_DRAWS} tries")


def _check_rng(rng):
    """Raise a TypeError unless `rng` is a random.Random."""
    if not isinstance(rng, random.Random):
        raise TypeError(f"rng must be a random.Random (e.g. random.Random(0)), got {type(rng).__name__}")


def random_scene(rng: random.Random, n_shapes: int | None = None) -> Scene:
    """A random scene of `n_shapes` shapes (1…3, uniform when None), drawn only from `rng`."""
    # kind and colour are independent per shape; size, position, shade and background vary
    # so that pictures a learner draws by hand look like the training data
    _check_rng(rng)
    if n_shapes is None:
        n_shapes = rng.randint(1, MAX_SHAPES)
    if not is_int(n_shapes) or not 1 <= n_shapes <= MAX_SHAPES:
        raise ValueError(f"n_shapes must be None or an int in 1..{MAX_SHAPES}, got {n_shapes!r}")
    background = tuple(rng.randint(235, 255) for _ in range(3))

    def place(placed):
        color = rng.choice(COLORS)
        rgb = tuple(min(255, max(0, c + rng.randint(-COLOR_JITTER, COLOR_JITTER))) for c in COLOR_RGB[color])
        side = round(rng.uniform(MIN_SIDE, MAX_SIDE[n_shapes]), 3)
        left = round(rng.uniform(EDGE, 1 - EDGE - side), 3)
        top = round(rng.uniform(EDGE, 1 - EDGE - side), 3)
        shape = Shape(rng.choice(KINDS), color, (left, top, round(left + side, 3), round(top + side, 3)), rgb)
        return shape if all(_separated(shape, other) for other in placed) else None

    def layout():
        placed = []
        for _ in range(n_shapes):
            for _ in range(50):
                shape = place(placed)
                if shape is not None:
                    break
            else:
                return None  # no room left: start the layout again
            placed.append(shape)
        return Scene(tuple(placed), background)

    return _draw(layout, f"a scene of {n_shapes} shapes")


def _check_lang(lang):
    """Raise a ValueError unless `lang` is in LANGS."""
    _check_choice(lang, LANGS, "lang")


def _phrase(shape: Shape, lang: str) -> str:
    """'a red circle' / '一个红色的圆形'."""
    words = _WORDS[lang]
    if lang == "en":
        return f"a {words[shape.color]} {words[shape.kind]}"
    return f"一个{words[shape.color]}的{words[shape.kind]}"


def describe(scene: Scene, lang: str = "en") -> str:
    """Answer to 'What is in the picture?': the shapes listed left to right."""
    _check_lang(lang)
    parts = [_phrase(s, lang) for s in scene.left_to_right()]
    if lang == "en":
        text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        return text[0].upper() + text[1:] + "."
    text = parts[0] if len(parts) == 1 else "、".join(parts[:-1]) + "和" + parts[-1]
    return text + "。"


def color_of(scene: Scene, kind: str, lang: str = "en") -> str:
    """Answer to 'What color is the <kind>?'; `kind` must appear exactly once in the scene."""
    _check_choice(kind, KINDS, "shape kind")
    _check_lang(lang)
    matches = [s for s in scene.shapes if s.kind == kind]
    if len(matches) != 1:
        raise ValueError(
            f"the picture has {len(matches)} {kind}(s); a colour question needs a kind that appears exactly once"
        )
    word = _WORDS[lang][matches[0].color]
    return word.capitalize() + "." if lang == "en" else word + "。"


def count(scene: Scene, lang: str = "en") -> str:
    """Answer to 'How many shapes are there?'."""
    _check_lang(lang)
    return _COUNTS[lang][len(scene.shapes) - 1]


def which_picture(scenes, color: str, kind: str, lang: str = "en") -> str:
    """Answer to 'Which picture has a <color> <kind>?' for two scenes; exactly one must have it."""
    _check_choice(color, COLORS, "color")
    _check_choice(kind, KINDS, "shape kind")
    _check_lang(lang)
    if len(scenes) != 2:
        raise ValueError(f"the 'which' question compares exactly 2 pictures, got {len(scenes)}")
    having = [i for i, scene in enumerate(scenes) if any(s.color == color and s.kind == kind for s in scene.shapes)]
    if len(having) != 1:
        raise ValueError(f"{len(having)} of the 2 pictures have a {color} {kind}; exactly one must")
    return _PICTURES[lang][having[0]]


def no_picture(lang: str = "en") -> str:
    """Answer to any question asked without a picture."""
    _check_lang(lang)
    return _NO_PICTURE[lang]


def shape_name(color: str, kind: str, lang: str = "en") -> str:
    """'the red circle' / '红色的圆形': the <ref> text of a grounding answer."""
    _check_choice(color, COLORS, "color")
    _check_choice(kind, KINDS, "shape kind")
    _check_lang(lang)
    words = _WORDS[lang]
    return f"the {words[color]} {words[kind]}" if lang == "en" else f"{words[color]}的{words[kind]}"


def where_is(scene: Scene, color: str, kind: str, lang: str = "en", size: int = PICTURE_SIZE) -> Query:
    """Answer to 'Where is the <color> <kind>?': `<ref>name</ref><box>(x1,y1),(x2,y2)</box>` as a Query."""
    name = shape_name(color, kind, lang)
    matches = [s for s in scene.shapes if (s.color, s.kind) == (color, kind)]
    if len(matches) != 1:
        raise ValueError(
            f"the picture has {len(matches)} {color} {kind}(s); a 'where' question needs one that appears exactly once"
        )
    return box_answer(name, matches[0].grid_box(size))


def question(kind: str, lang: str = "en", *, shape: str | None = None, color: str | None = None) -> str:
    """The question text of a question kind; 'color' needs `shape`, 'which' and 'where' `shape` and `color`."""
    _check_choice(kind, QUESTION_KINDS, "question kind")
    _check_lang(lang)
    template = _QUESTIONS[lang][kind]
    given = {"shape": shape, "color": color}
    for name, value in given.items():
        needed = "{" + name + "}" in template
        if needed and value is None:
            raise ValueError(f"a {kind!r} question needs {name}=...")
        if not needed and value is not None:
            raise ValueError(f"a {kind!r} question takes no {name}")
    if shape is not None:
        _check_choice(shape, KINDS, "shape kind")
    if color is not None:
        _check_choice(color, COLORS, "color")
    return template.format(**{k: _WORDS[lang][v] for k, v in given.items() if v is not None})


def trained_questions(lang: str = "en") -> tuple[str, ...]:
    """Every question text the toy model was trained on in `lang` ("en" or "zh"): each kind, with each shape and
    colour it can name."""
    _check_lang(lang)
    found = []
    for kind in QUESTION_KINDS:
        template = _QUESTIONS[lang][kind]
        shapes = KINDS if "{shape}" in template else (None,)
        colors = COLORS if "{color}" in template else (None,)
        found += [question(kind, lang, shape=s, color=c) for s in shapes for c in colors]
    return tuple(found)


def is_trained_question(text: str) -> bool:
    """Whether `text` is one of the trained questions, in either language (spaces and letter case aside)."""
    wanted = " ".join(str(text).split()).casefold()
    return any(wanted == q.casefold() for lang in _QUESTIONS for q in trained_questions(lang))


@dataclass
class Example:
    """One training example: the pictures, the question, its answer, the question kind and language."""

    images: list[Scene]
    question: str
    answer: str  # a Query for 'where': its <ref>/<box> tags are special tokens
    kind: str
    lang: str

    def __post_init__(self):
        _check_choice(self.kind, QUESTION_KINDS, "question kind")
        _check_lang(self.lang)
        if not self.images or not all(isinstance(s, Scene) for s in self.images):
            raise TypeError("Example.images must be a non-empty list of Scene objects")

    def pictures(self, size: int = PICTURE_SIZE) -> list[Image.Image]:
        """Render every picture of the example at size×size."""
        return [scene.render(size) for scene in self.images]


def make_example(rng: random.Random, kind: str, lang: str) -> Example:
    """A random example of question kind `kind` in language `lang`, drawn only from `rng`."""
    _check_rng(rng)
    _check_choice(kind, QUESTION_KINDS, "question kind")
    _check_lang(lang)
    if kind == "what":
        scene = random_scene(rng)
        return Example([scene], question("what", lang), describe(scene, lang), kind, lang)
    if kind == "count":
        scene = random_scene(rng)
        return Example([scene], question("count", lang), count(scene, lang), kind, lang)
    if kind == "color":

        def unique_kind_scene():
            scene = random_scene(rng)
            once = [k for k in KINDS if sum(s.kind == k for s in scene.shapes) == 1]
            return (scene, once) if once else None

        scene, once = _draw(unique_kind_scene, "a scene with a shape kind that appears once")
        shape = rng.choice(once)
        return Example([scene], question("color", lang, shape=shape), color_of(scene, shape, lang), kind, lang)
    if kind == "where":

        def unique_shape_scene():
            scene = random_scene(rng)
            pairs = [(s.color, s.kind) for s in scene.shapes]
            once = [p for p in pairs if pairs.count(p) == 1]  # scene order: reproducible
            return (scene, once) if once else None

        scene, once = _draw(unique_shape_scene, "a scene with a (colour, kind) that appears once")
        color, shape = rng.choice(once)
        answer = where_is(scene, color, shape, lang)
        return Example([scene], question("where", lang, shape=shape, color=color), answer, kind, lang)

    def pair_with_a_difference():
        scenes = [random_scene(rng), random_scene(rng)]
        first, second = ({(s.color, s.kind) for s in scene.shapes} for scene in scenes)
        only_one = sorted(first ^ second)  # sorted: set order is not reproducible across processes
        return (scenes, only_one) if only_one else None

    scenes, only_one = _draw(pair_with_a_difference, "two pictures that differ")
    color, shape = rng.choice(only_one)
    answer = which_picture(scenes, color, shape, lang)
    return Example(scenes, question("which", lang, shape=shape, color=color), answer, kind, lang)


def make_dataset(seed: int, n: int, kinds=QUESTION_KINDS, langs=LANGS) -> list[Example]:
    """`n` examples cycling through every (kind, lang) pair, deterministic given `seed`."""
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if not is_int(n) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    for values, allowed, what in ((kinds, QUESTION_KINDS, "kinds"), (langs, LANGS, "langs")):
        if isinstance(values, str):
            raise TypeError(f"{what} must be a tuple of names such as {allowed[:1]}, not a single string")
        if not values:
            raise ValueError(f"{what} must not be empty: use some of {allowed}")
        for value in values:
            _check_choice(value, allowed, what[:-1])
    kinds, langs = tuple(kinds), tuple(langs)
    rng = random.Random(seed)
    return [make_example(rng, kinds[i % len(kinds)], langs[(i // len(kinds)) % len(langs)]) for i in range(n)]


def to_list_format(example: Example, image_paths) -> list[dict]:
    """Qwen-VL's list format for the tokenizer: one {'image': path} per picture, then {'text': question}."""
    if isinstance(image_paths, (str, os.PathLike)):
        raise TypeError("image_paths must be a list of paths, one per picture, not a single path")
    paths = list(image_paths)
    if len(paths) != len(example.images):
        raise ValueError(f"the example has {len(example.images)} picture(s) but {len(paths)} path(s) were given")
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"each image path must be a str or os.PathLike, got {type(p).__name__}")
    return [{"image": os.fspath(p)} for p in paths] + [{"text": example.question}]


def answer_matches(pred: str, example: Example) -> bool:
    """Exact-match metric: the prediction equals the answer once surrounding whitespace is stripped."""
    if not isinstance(pred, str):
        raise TypeError(f"pred must be the decoded answer text (str), got {type(pred).__name__}")
    return pred.strip() == example.answer.strip()


def grounding_score(pred: str, example: Example) -> dict:
    """Score of a predicted 'where' answer (text with its tags): well_formed, right_shape, iou with the true box."""
    if not isinstance(example, Example) or example.kind != "where":
        raise ValueError("grounding_score scores 'where' examples (make_example(rng, 'where', lang))")
    if not isinstance(pred, str):
        raise TypeError(
            f"pred must be the answer text with its tags (tokenizer.decode(ids)), got {type(pred).__name__}"
        )
    [truth] = read_list_format(example.answer)
    try:
        elements = read_list_format(pred.strip())
    except ValueError:  # unclosed tags, box text that is not (x1,y1),(x2,y2) on the grid
        elements = []
    one = len(elements) == 1 and set(elements[0]) == {"ref", "box"} and len(elements[0]["box"]) == 1
    x1, y1, x2, y2 = elements[0]["box"][0] if one else (0, 0, 0, 0)
    if not one or x2 < x1 or y2 < y1:
        return {"well_formed": False, "right_shape": False, "iou": 0.0}
    return {
        "well_formed": True,
        "right_shape": elements[0]["ref"] == truth["ref"],
        "iou": iou((x1, y1, x2, y2), truth["box"][0]),
    }
