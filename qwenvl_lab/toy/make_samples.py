"""Write data/images/ (sample pictures and README) from fixed scenes: `python -m qwenvl_lab.toy.make_samples`."""

from __future__ import annotations

import argparse
from pathlib import Path

from qwenvl_lab import files
from qwenvl_lab.checks.values import check_path
from qwenvl_lab.toy.shapes import (
    COLORS,
    KINDS,
    LANGS,
    PICTURE_SIZE,
    Scene,
    Shape,
    color_of,
    count,
    describe,
    no_picture,
    question,
    where_is,
    which_picture,
)

_REPO = Path(__file__).resolve().parents[2]
SAMPLES_WRITER = files.writer("sample pictures", "the sample pictures and their README.md")


def _scene(*shapes: tuple[str, str, tuple[float, float, float, float]]) -> Scene:
    """A scene on the default background from (color, kind, box) triples."""
    return Scene(tuple(Shape(kind, color, box) for color, kind, box in shapes))


# File name → scene; names list the shapes left to right. Boxes are (left, top, right, bottom) in [0, 1].
SAMPLES = {
    "red_circle.png": _scene(("red", "circle", (0.3, 0.3, 0.7, 0.7))),
    "blue_square.png": _scene(("blue", "square", (0.15, 0.35, 0.5, 0.7))),
    "green_triangle.png": _scene(("green", "triangle", (0.4, 0.2, 0.8, 0.6))),
    "yellow_circle.png": _scene(("yellow", "circle", (0.1, 0.5, 0.45, 0.85))),
    "red_circle_blue_square.png": _scene(
        ("red", "circle", (0.08, 0.2, 0.43, 0.55)), ("blue", "square", (0.55, 0.45, 0.9, 0.8))
    ),
    "green_triangle_yellow_square.png": _scene(
        ("green", "triangle", (0.1, 0.55, 0.45, 0.9)), ("yellow", "square", (0.55, 0.1, 0.9, 0.45))
    ),
    "blue_circle_red_triangle.png": _scene(
        ("blue", "circle", (0.12, 0.12, 0.42, 0.42)), ("red", "triangle", (0.5, 0.45, 0.9, 0.85))
    ),
    "green_square_yellow_triangle.png": _scene(
        ("green", "square", (0.1, 0.3, 0.4, 0.6)), ("yellow", "triangle", (0.55, 0.3, 0.9, 0.65))
    ),
    "three_shapes.png": _scene(
        ("red", "circle", (0.05, 0.1, 0.35, 0.4)),
        ("blue", "square", (0.38, 0.6, 0.65, 0.87)),
        ("green", "triangle", (0.66, 0.1, 0.96, 0.4)),
    ),
    "yellow_square_green_circle_red_square.png": _scene(
        ("yellow", "square", (0.06, 0.55, 0.36, 0.85)),
        ("green", "circle", (0.38, 0.12, 0.66, 0.4)),
        ("red", "square", (0.68, 0.5, 0.94, 0.76)),
    ),
    "pair_a_yellow_circle_red_triangle.png": _scene(
        ("yellow", "circle", (0.1, 0.3, 0.45, 0.65)), ("red", "triangle", (0.55, 0.3, 0.9, 0.65))
    ),
    "pair_b_blue_square_yellow_circle.png": _scene(
        ("blue", "square", (0.12, 0.5, 0.44, 0.82)), ("yellow", "circle", (0.55, 0.15, 0.88, 0.48))
    ),
}
# (Picture 1, Picture 2) for the two-picture question
PAIRS = (("pair_a_yellow_circle_red_triangle.png", "pair_b_blue_square_yellow_circle.png"),)


def _rows(scene: Scene) -> list[tuple[str, str]]:
    """(question, answer) rows of the one-picture questions, English then Chinese for each."""
    rows = [(question("what", lang), describe(scene, lang)) for lang in LANGS]
    for kind in KINDS:
        if sum(s.kind == kind for s in scene.shapes) == 1:
            rows += [(question("color", lang, shape=kind), color_of(scene, kind, lang)) for lang in LANGS]
    rows += [(question("count", lang), count(scene, lang)) for lang in LANGS]
    pairs = [(s.color, s.kind) for s in scene.left_to_right()]
    for color, kind in (p for p in pairs if pairs.count(p) == 1):
        rows += [
            (question("where", lang, shape=kind, color=color), where_is(scene, color, kind, lang)) for lang in LANGS
        ]
    return rows


def _pair_rows(scenes: list[Scene]) -> list[tuple[str, str]]:
    """(question, answer) rows of every 'which' question that exactly one of the two pictures answers."""
    present = [{(s.color, s.kind) for s in scene.shapes} for scene in scenes]
    rows = []
    for color in COLORS:
        for kind in KINDS:
            if ((color, kind) in present[0]) != ((color, kind) in present[1]):
                rows += [
                    (question("which", lang, shape=kind, color=color), which_picture(scenes, color, kind, lang))
                    for lang in LANGS
                ]
    return rows


def sample_questions() -> list[tuple[list[str], str, str]]:
    """Every question data/images/README.md lists, as (picture file names, question, the trained answer): each
    sample's one-picture questions, then the two-picture ones of PAIRS."""
    rows = [([name], q, a) for name, scene in SAMPLES.items() for q, a in _rows(scene)]
    for pair in PAIRS:
        rows += [(list(pair), q, a) for q, a in _pair_rows([SAMPLES[name] for name in pair])]
    return rows


def _table(rows: list[tuple[str, str]]) -> list[str]:
    """A markdown table of (question, answer) rows."""
    return ["| question | answer |", "|---|---|"] + [f"| {q} | {f'`{a}`' if '<' in a else a} |" for q, a in rows]


def readme_text() -> str:
    """The README of data/images/: every file with the exact answers the toy model is trained to give."""
    lines = [
        "# Sample pictures for the toy model",
        "",
        "Generated by `python -m qwenvl_lab.toy.make_samples` from fixed scenes; do not edit by hand.",
        f"Each file is a {PICTURE_SIZE}×{PICTURE_SIZE} RGB PNG, drawn as the training pictures are; the vision "
        "preprocessing resizes it (bicubic), like any picture, to the toy model's input size.",
        "Shapes are listed left to right. A colour question is only asked about a kind that appears once, a 'where' "
        "question about a colour and kind that appear once; its box is on Qwen-VL's 0–1000 grid. Asked with no "
        f"picture, every question is answered '{no_picture('en')}' / {no_picture('zh')}",
        "",
    ]
    for name, scene in SAMPLES.items():
        lines += [f"## {name}", ""] + _table(_rows(scene)) + [""]
    for first, second in PAIRS:
        lines += [f"## Two pictures: {first} (Picture 1) and {second} (Picture 2)", ""]
        lines += _table(_pair_rows([SAMPLES[first], SAMPLES[second]])) + [""]
    return "\n".join(lines)


def write_samples(out_dir, overwrite: bool = False) -> list[Path]:
    """Render every sample to `out_dir` (created if needed) with README.md, each a new file (overwrite=True: replacing
    one there); return the written paths. Every path is checked before the first is written."""
    out_dir = check_path("out_dir", out_dir)
    names = [*SAMPLES, "README.md"]
    for name in names:
        files.check_destination(out_dir / name, SAMPLES_WRITER, folder=False, overwrite=overwrite, parents=True)
    for name, scene in SAMPLES.items():
        with files.writing_file(out_dir / name, SAMPLES_WRITER, overwrite=overwrite, parents=True) as part:
            scene.render(PICTURE_SIZE).save(part, format="PNG")
    files.write_text(out_dir / "README.md", readme_text(), SAMPLES_WRITER, overwrite=overwrite, parents=True)
    return [out_dir / name for name in names]


def main(argv=None) -> None:
    """Command line: write the samples to --out (default: data/images of the source checkout)."""
    parser = argparse.ArgumentParser(description=__doc__)
    default = _REPO / "data" / "images" if (_REPO / "pyproject.toml").is_file() else None
    parser.add_argument("--out", type=Path, default=default, help="output folder (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace the pictures and README.md already there")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("not running from a source checkout: pass --out FOLDER")
    paths = write_samples(args.out, overwrite=args.overwrite)
    print(f"wrote {len(paths)} files to {args.out}")


if __name__ == "__main__":
    main()
