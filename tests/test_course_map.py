"""The course's map is drawn from a model's real shapes, tells the two paths apart and highlights the notebook it is
shown in."""

import matplotlib
import pytest
from matplotlib.patches import FancyBboxPatch

from qwenvl_lab.course.course_map import HERE_EDGE, PATH_COLORS, pipeline_map, pipeline_steps
from qwenvl_lab.modeling import QWenVLConfig

matplotlib.use("Agg")


def boxes(fig) -> dict:
    """The map's boxes by step name."""
    return {p.get_gid(): p for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)}


def edged_in_orange(fig) -> set:
    """The steps whose box has the 'this notebook' edge."""
    return {n for n, p in boxes(fig).items() if p.get_edgecolor()[:3] == matplotlib.colors.to_rgb(HERE_EDGE)}


def test_the_steps_carry_qwen_vl_chats_shapes():
    steps = {s.name: s for s in pipeline_steps(QWenVLConfig(), images=2, prompt_len=600)}
    assert steps["picture"].shape == "[2, 3, 448, 448]"  # channels first, as the vision tower's conv1 takes them
    assert steps["vit"].shape == "1024 × 1664"  # 448 / 14 = 32 → 32² patches of width 1664
    assert steps["input_vit"].shape == "[2, 256, 4096]" and steps["prompt_table"].shape == "[512, 4096]"
    assert steps["lm"].shape == "32 layers" and steps["lookup"].shape == "[1, 600, 4096]"
    assert steps["fake_ids"].shape == "151936 … 152447"  # two pictures: 512 fake ids


def test_the_two_paths_have_their_own_colours():
    steps = pipeline_steps(QWenVLConfig())
    drawn = boxes(pipeline_map(QWenVLConfig()))
    for s in steps:
        assert drawn[s.name].get_facecolor()[:3] == matplotlib.colors.to_rgb(PATH_COLORS[s.path][0])
    assert {s.name for s in steps if s.path == "picture"} == {
        "picture",
        "vit",
        "resampler",
        "input_vit",
        "prompt_table",
    }
    assert {s.name for s in steps if s.path == "text"} == {"question", "ids", "img_pos", "fake_ids"}
    assert len({fill for fill, _ in PATH_COLORS.values()}) == 3
    texts = [t.get_text() for t in pipeline_map(QWenVLConfig()).axes[0].texts]
    assert all(s.holds.split("\n")[0].split()[0] in " ".join(texts) for s in steps)  # each box says what it holds
    matplotlib.pyplot.close("all")


def test_the_map_highlights_one_notebook():
    assert edged_in_orange(pipeline_map(QWenVLConfig(), here="02", small=True)) == {"img_pos"}
    assert edged_in_orange(pipeline_map(QWenVLConfig(), here="04", small=True)) == {
        "picture", "vit", "resampler", "input_vit", "prompt_table", "lookup"}  # fmt: skip
    assert edged_in_orange(pipeline_map(QWenVLConfig())) == set()
    with pytest.raises(ValueError, match="notebook '10' is not on the map"):
        pipeline_map(QWenVLConfig(), here="10")
    matplotlib.pyplot.close("all")


def test_the_full_map_names_the_notebook_that_revisits_the_lookup():
    fig = pipeline_map(QWenVLConfig(), here="09")
    assert edged_in_orange(fig) == {"lookup"}  # which notebook 09 does today's way
    assert "04 · 09" in [t.get_text() for t in fig.axes[0].texts]
    strip = pipeline_map(QWenVLConfig(), here="04", small=True)
    assert "04 · 09" not in [t.get_text() for t in strip.axes[0].texts]  # the notebooks' strips name one notebook
    matplotlib.pyplot.close("all")
