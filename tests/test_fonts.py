"""Chinese renders in the figures with only the course's install: the shipped font covers the course's text, and
matplotlib draws it without a CJK font of the machine."""

import warnings
from pathlib import Path

import matplotlib
import matplotlib.pyplot
import pytest

from qwenvl_lab import fonts

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[1]


def test_the_shipped_font_has_every_chinese_character_of_the_course():
    missing = fonts.course_characters(REPO) - fonts.shipped_characters()
    assert not missing, (
        f"data/fonts/qwenvl-lab-cjk.ttf lacks {''.join(sorted(missing))!r}: rebuild it (data/fonts/README.md)"
    )
    assert set(fonts.common_hanzi()) <= fonts.shipped_characters() and len(fonts.common_hanzi()) == 3755
    assert {chr(c) for c in range(32, 127)} <= fonts.shipped_characters()


def test_matplotlib_draws_chinese_with_the_shipped_font_alone(monkeypatch, tmp_path):
    monkeypatch.setattr(fonts, "system_cjk_font", lambda: None)  # a machine without a CJK font
    fonts.use_cjk_font.cache_clear()
    try:
        assert fonts.use_cjk_font() == (fonts.LATIN_FAMILY, fonts.FAMILY)
        fig, ax = matplotlib.pyplot.subplots()
        ax.set_title("图片里是什么？ 一个红色的圆形。")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # matplotlib warns "Glyph … missing from font(s)" for an empty box
            fig.savefig(tmp_path / "chinese.png")
        ax.set_title("龘")  # not a character the subset holds
        with pytest.warns(UserWarning, match="missing from font"):
            fig.savefig(tmp_path / "rare.png")
        matplotlib.pyplot.close(fig)
    finally:
        fonts.use_cjk_font.cache_clear()


def test_the_font_for_a_text():
    assert fonts.is_cjk_text("图") and fonts.is_cjk_text("？") and not fonts.is_cjk_text("🤗")
    found = fonts.system_cjk_font()
    expected = found[1] if found else str(fonts.shipped_font())
    assert fonts.cjk_font_for("红色的圆形") == expected
