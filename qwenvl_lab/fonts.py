"""Chinese in the course's figures: a CJK font for matplotlib and Pillow on every machine.

The course ships `data/fonts/qwenvl-lab-cjk.ttf`, a subset of WenQuanYi Micro Hei (Apache-2.0, data/fonts/README.md):
printable ASCII, the 3,755 most common Chinese characters (GB2312 level 1) and every wide character the course's
own files use, so every figure the course draws reads its Chinese with only the course's install. A CJK font of the
machine (`SYSTEM_CJK_FONTS`), when there is one, comes first: it also covers rarer characters.

`python -m qwenvl_lab.fonts --make-subset SOURCE` rebuilds the shipped file from SOURCE (the Debian package
fonts-wqy-microhei's /usr/share/fonts/truetype/wqy/wqy-microhei.ttc), after the course's texts change.
"""

import argparse
import logging
import sys
import unicodedata
from functools import lru_cache
from pathlib import Path

from PIL import ImageFont

from . import files, resources
from .checks.values import check_path

FAMILY = "qwenvl-lab CJK"  # the shipped subset's family name (renamed: the machine may hold the full font too)
FONT_FILE_NAME = "qwenvl-lab-cjk.ttf"
FONT_WRITER = files.writer("font subset", "the CJK font subset")
LATIN_FAMILY = "DejaVu Sans"  # matplotlib's own default font: Latin text keeps its usual look
SYSTEM_CJK_FONTS = (  # (family name, file name): fonts of Linux packages, macOS and Windows with Chinese glyphs
    ("Noto Sans CJK SC", "NotoSansCJK-Regular.ttc"),
    ("Noto Sans SC", "NotoSansSC-Regular.otf"),
    ("Source Han Sans SC", "SourceHanSansSC-Regular.otf"),
    ("WenQuanYi Micro Hei", "wqy-microhei.ttc"),
    ("WenQuanYi Zen Hei", "wqy-zenhei.ttc"),
    ("Droid Sans Fallback", "DroidSansFallbackFull.ttf"),
    ("PingFang SC", "PingFang.ttc"),
    ("Hiragino Sans GB", "Hiragino Sans GB.ttc"),
    ("Microsoft YaHei", "msyh.ttc"),
    ("SimHei", "simhei.ttf"),
)
GET_A_FONT = (
    "Debian/Ubuntu: apt-get install fonts-noto-cjk (or fonts-wqy-microhei); Fedora: dnf install "
    "google-noto-sans-cjk-fonts; macOS and Windows ship one (PingFang SC, Microsoft YaHei); then restart the kernel"
)
TEXT_SUFFIXES = (".py", ".ipynb", ".md", ".json")  # the files whose wide characters the subset must cover
TEXT_FOLDERS = ("qwenvl_lab", "notebooks", "data", "docs")


def is_wide(char: str) -> bool:
    """True for a wide (CJK) character."""
    return unicodedata.east_asian_width(char) in ("W", "F")


def is_cjk_text(char: str) -> bool:
    """True for a wide character that is text (a Chinese character or CJK punctuation), not a symbol like an emoji."""
    return is_wide(char) and unicodedata.category(char) != "So"


def shipped_font() -> Path:
    """The shipped CJK subset font (data/fonts/qwenvl-lab-cjk.ttf)."""
    return resources.data_dir() / "fonts" / FONT_FILE_NAME


@lru_cache(maxsize=1)
def shipped_characters() -> frozenset[str]:
    """The characters the shipped font has glyphs for."""
    from fontTools.ttLib import TTFont  # matplotlib's own dependency

    return frozenset(chr(code) for code in TTFont(str(shipped_font()))["cmap"].getBestCmap())


@lru_cache(maxsize=1)
def system_cjk_font() -> tuple[str, str] | None:
    """(family, path) of the machine's first CJK font of SYSTEM_CJK_FONTS, or None: looked up by file name in the
    system font folders (Pillow's search), so a font installed after matplotlib built its font cache counts too."""

    for family, file_name in SYSTEM_CJK_FONTS:
        try:
            return family, ImageFont.truetype(file_name).path
        except OSError:
            continue
    return None


def cjk_font_for(text: str) -> str | None:
    """Path of a font with glyphs for every wide character of `text`: the machine's CJK font, else the shipped subset
    when it covers them, else None."""
    found = system_cjk_font()
    if found is not None:
        return found[1]
    wide = {c for c in text if is_wide(c)}
    return str(shipped_font()) if wide <= shipped_characters() else None


@lru_cache(maxsize=1)
def use_cjk_font() -> tuple[str, ...]:
    """Make matplotlib draw Chinese: register the CJK fonts and put them after DejaVu Sans in `font.family`, each
    glyph taken from the first font that has it. Returns the family list (called again, it does nothing more)."""

    import matplotlib
    from matplotlib import font_manager

    # a CJK font has no bold face: matplotlib then draws its regular one, and says so on every bold title
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    families = [LATIN_FAMILY]
    found = system_cjk_font()
    if found is not None:
        font_manager.fontManager.addfont(found[1])
        families.append(found[0])
    font_manager.fontManager.addfont(str(shipped_font()))
    families.append(FAMILY)
    matplotlib.rcParams["font.family"] = families
    return tuple(families)


def course_characters(root: Path) -> set[str]:
    """Every CJK character of the course's text files under `root` (a checkout)."""
    chars = set()
    for folder in TEXT_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in TEXT_SUFFIXES and path.is_file():
                chars |= {c for c in path.read_text(encoding="utf-8", errors="ignore") if is_cjk_text(c)}
    return chars


def common_hanzi() -> list[str]:
    """The 3,755 most common Chinese characters: level 1 of GB2312 (rows 16–55)."""
    chars = []
    for row in range(0xB0, 0xD8):
        for cell in range(0xA1, 0xFF):
            try:
                chars.append(bytes([row, cell]).decode("gb2312"))
            except UnicodeDecodeError:
                continue
    return chars


def make_subset(source: Path, characters, out: Path, overwrite: bool = False) -> int:
    """Write the glyphs of `characters` from font `source` (face 0 of a .ttc) to `out` (a new file, or with
    overwrite=True replacing it), renamed FAMILY; its size."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    source = check_path("source", source)
    files.check_destination(out, FONT_WRITER, folder=False, overwrite=overwrite)  # before the work

    options = subset.Options()
    options.layout_features, options.hinting, options.name_IDs = [], False, ["*"]
    font = TTFont(str(source), fontNumber=0, recalcTimestamp=False)  # the same subset from the same font
    subsetter = subset.Subsetter(options)
    subsetter.populate(text="".join(sorted(set(characters))))
    subsetter.subset(font)
    original = font["name"].getDebugName(1)
    for record in font["name"].names:
        if record.nameID in (1, 3, 4, 16):
            record.string = FAMILY
        elif record.nameID == 6:
            record.string = FAMILY.replace(" ", "-")
        elif record.nameID == 5:
            record.string = f"{record.toUnicode()}; subset of {original} for qwenvl-lab"
    with files.writing_file(out, FONT_WRITER, overwrite=overwrite, need_bytes=Path(source).stat().st_size) as part:
        font.save(str(part))
    return Path(out).stat().st_size


def main(argv=None) -> int:
    """Command line: rebuild the shipped subset from a WenQuanYi Micro Hei file."""
    parser = argparse.ArgumentParser(prog="python -m qwenvl_lab.fonts", description=__doc__.split("\n")[0])
    parser.add_argument("--make-subset", metavar="SOURCE", type=Path, required=True, help="wqy-microhei.ttc")
    args = parser.parse_args(argv)
    root = resources.checkout_dir()
    if root is None:
        parser.error("run it in a checkout of the course: it reads the course's texts for their characters")
    characters = [chr(c) for c in range(32, 127)] + common_hanzi() + sorted(course_characters(root))
    size = make_subset(args.make_subset, characters, root / "data" / "fonts" / FONT_FILE_NAME, overwrite=True)
    print(f"{root / 'data' / 'fonts' / FONT_FILE_NAME}: {len(set(characters))} characters, {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
