"""The course's map: the path from a picture and a question to an answer, drawn with a model's real shapes."""

import textwrap
from dataclasses import dataclass

from ..fonts import use_cjk_font
from ..tokenizing import IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE

# (fill, edge) of each path: the picture's (top row), the text's (bottom row), and where they meet (the lookup on)
PATH_COLORS = {
    "picture": ("#dbeafe", "#1d4ed8"),
    "text": ("#dcfce7", "#15803d"),
    "joined": ("#ede9fe", "#6d28d9"),
}
PATH_NAMES = {
    "picture": "the picture's path",
    "text": "the text's path",
    "joined": "where they meet",
}
HERE_EDGE, HERE_WIDTH, OTHER_WIDTH = "#ea580c", 3.5, 1.2  # the boxes of the notebook the map is shown in


@dataclass(frozen=True)
class Step:
    """One box of the map: where it sits, what it holds, its shape, and the notebook that builds it."""

    name: str
    label: str
    holds: str
    shape: str
    notebook: str
    path: str  # "picture", "text" or "joined" (PATH_COLORS)
    x: float
    y: float
    revisited: tuple[str, ...] = ()  # later notebooks that come back to this step (the full map names them too)


def pipeline_steps(config, images: int = 1, prompt_len: int = 300) -> list[Step]:
    """The map's boxes for a QWenVLConfig (shapes for `images` pictures and a prompt of `prompt_len` ids)."""
    visual = config.visual
    size, patch, hidden = visual["image_size"], visual["patch_size"], config.hidden_size
    side = size // patch
    n, span, v = images, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE
    return [
        Step("picture", "picture", "resized to a square", f"[{n}, 3, {size}, {size}]", "04", "picture", 0, 1),
        Step(
            "vit",
            "ViT",
            f"a vector per {patch}×{patch} patch",
            f"{side * side} × {visual['width']}",
            "04",
            "picture",
            1,
            1,
        ),  # fmt: skip
        Step("resampler", "resampler", f"{span} queries read the patches", f"{span} × {hidden}", "04", "picture", 2, 1),
        Step(
            "input_vit", "input_vit", f"{span} vectors per picture", f"[{n}, {span}, {hidden}]", "04", "picture", 3, 1
        ),
        Step("prompt_table", "prompt_table", "input_vit as rows", f"[{n * span}, {hidden}]", "04", "picture", 4, 1),
        Step("question", "question", "text and picture paths", "from_list_format", "01", "text", 0, 0),
        Step("ids", "input_ids", "a picture = <img> path </img>", f"[1, {prompt_len}]", "01", "text", 1, 0),
        Step("img_pos", "img_pos", "where each image span lies", f"[{n}, 3]", "02", "text", 2, 0),
        Step(
            "fake_ids", "fake prompt ids", f"ids ≥ {v} fill the spans", f"{v} … {v + n * span - 1}", "03", "text", 3, 0
        ),
        Step(
            "lookup",
            "lookup",
            "id < V: word embedding\nid ≥ V: table row",
            f"[1, {prompt_len}, {hidden}]",
            "04",
            "joined",
            4,
            0,
            revisited=("09",),
        ),  # fmt: skip
        Step(
            "lm", "language model", "the transformer layers", f"{config.num_hidden_layers} layers", "05", "joined", 5, 0
        ),
        Step("answer", "answer", "new ids, decoded", "generate", "06", "joined", 6, 0),
    ]


ARROWS = [
    ("picture", "vit"),
    ("vit", "resampler"),
    ("resampler", "input_vit"),
    ("input_vit", "prompt_table"),
    ("question", "ids"),
    ("ids", "img_pos"),
    ("img_pos", "fake_ids"),
    ("fake_ids", "lookup"),
    ("prompt_table", "lookup"),
    ("lookup", "lm"),
    ("lm", "answer"),
]


def pipeline_map(config, here=None, small: bool = False, images: int = 1, prompt_len: int = 300, title=None):
    """A matplotlib figure of the pipeline for `config`, the picture's and the text's paths in their own colours; the
    boxes of notebook `here` (e.g. "03") get a thick orange edge. small=True draws the compact "you are here" strip
    the notebooks start with (names and shapes; the full map also says what each box holds). Sized for a notebook's
    output area (under 970 pixels wide at 100 dpi), so its text is shown at its size."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 — matplotlib is the course extra's
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch  # noqa: PLC0415 — the course extra's

    use_cjk_font()
    steps = {s.name: s for s in pipeline_steps(config, images, prompt_len)}
    on_map = {n for s in steps.values() for n in (s.notebook, *s.revisited)}
    if here is not None and here not in on_map:
        raise ValueError(f"notebook {here!r} is not on the map; notebooks {sorted(on_map)}")
    fig, ax = plt.subplots(figsize=(9.6, 2.3) if small else (9.6, 4.4))
    box_w, box_h = 0.94, 0.68 if small else 0.8
    for s in steps.values():
        mine = here in (s.notebook, *s.revisited)
        fill, edge = PATH_COLORS[s.path]
        box = FancyBboxPatch(
            (s.x - box_w / 2, s.y - box_h / 2),
            box_w,
            box_h,
            boxstyle="round,pad=0.02",
            facecolor=fill,
            edgecolor=HERE_EDGE if mine else edge,
            linewidth=HERE_WIDTH if mine else OTHER_WIDTH,
            gid=s.name,
        )
        ax.add_patch(box)
        top = s.y + box_h / 2
        badge = " · ".join((s.notebook, *s.revisited)) if not small else s.notebook
        ax.text(s.x + box_w / 2 - 0.06, top, badge, ha="right", va="center", fontsize=8.5, color=edge, weight="bold",
                bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor=edge, linewidth=1))  # fmt: skip
        if small:
            ax.text(s.x, s.y + 0.08, s.label, ha="center", va="center", fontsize=9.5, weight="bold")
            ax.text(s.x, s.y - 0.15, s.shape, ha="center", va="center", fontsize=8.5, family="monospace")
        else:
            ax.text(s.x, top - 0.16, s.label, ha="center", va="center", fontsize=9.5, weight="bold")
            ax.text(s.x, s.y + 0.0, "\n".join(textwrap.fill(line, 17) for line in s.holds.split("\n")), ha="center", va="center", fontsize=9,
                    linespacing=1.15)  # fmt: skip
            ax.text(s.x, s.y - box_h / 2 + 0.12, s.shape, ha="center", va="center", fontsize=8.5, family="monospace")
    for start, end in ARROWS:
        a, b = steps[start], steps[end]
        tail = (a.x + box_w / 2, a.y) if a.y == b.y else (a.x, a.y - box_h / 2)
        head = (b.x - box_w / 2, b.y) if a.y == b.y else (b.x, b.y + box_h / 2)
        color = PATH_COLORS[a.path][1]
        ax.add_patch(FancyArrowPatch(tail, head, arrowstyle="-|>", mutation_scale=14, color=color, linewidth=1.5))
    handles = [Patch(facecolor=f, edgecolor=e, label=PATH_NAMES[p]) for p, (f, e) in PATH_COLORS.items()]
    if here is not None:
        handles.append(Patch(facecolor="white", edgecolor=HERE_EDGE, linewidth=2.5, label=f"notebook {here}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.72, 1.0), fontsize=9,
              frameon=False, borderaxespad=0.2)  # fmt: skip
    ax.set_xlim(-0.5, 6.5)
    ax.set_ylim(-box_h / 2 - 0.04, 1 + box_h / 2 + 0.1)
    ax.axis("off")
    if title is None:
        title = "the course's pipeline" + (f" — notebook {here} builds the steps edged in orange" if here else "")
    ax.set_title(title, fontsize=10.5, loc="left")
    fig.tight_layout(pad=0.3)
    return fig
