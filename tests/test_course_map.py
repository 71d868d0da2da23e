"""The course's map is drawn from a model's real shapes and highlights the notebook it is shown in."""

import matplotlib
import pytest

from qwenvl_lab.course_map import pipeline_map, pipeline_steps
from qwenvl_lab.modeling import QWenVLConfig

matplotlib.use("Agg")


def test_the_steps_carry_qwen_vl_chats_shapes():
    steps = {s.name: s for s in pipeline_steps(QWenVLConfig(), images=2, prompt_len=600)}
    assert steps["vit"].shape == "1024 patches × 1664"  # 448 / 14 = 32 → 32² patches of width 1664
    assert steps["input_vit"].shape == "[2, 256, 4096]" and steps["prompt_table"].shape == "[512, 4096]"
    assert steps["lm"].shape == "32 layers" and steps["lookup"].shape == "[1, 600, 4096]"


def test_the_map_highlights_one_notebook():
    fig = pipeline_map(QWenVLConfig(), here="02", small=True)
    highlighted = [p for p in fig.axes[0].patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("#ffd166")]
    assert len(highlighted) == 1  # img_pos
    with pytest.raises(ValueError, match="notebook '10' is not on the map"):
        pipeline_map(QWenVLConfig(), here="10")


def test_the_full_map_names_the_notebook_that_revisits_the_lookup():
    fig = pipeline_map(QWenVLConfig(), here="09")
    highlighted = [p for p in fig.axes[0].patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("#ffd166")]
    assert len(highlighted) == 1  # the lookup, which notebook 09 does today's way
    assert "04 · 09" in [t.get_text() for t in fig.axes[0].texts]
    strip = pipeline_map(QWenVLConfig(), here="04", small=True)
    assert "04 · 09" not in [t.get_text() for t in strip.axes[0].texts]  # the notebooks' strips stay as they were
