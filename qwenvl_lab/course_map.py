"""The course's map: the path from a picture and a question to an answer, drawn with a model's real shapes."""

from dataclasses import dataclass

from .tokenizing import IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE

HERE_COLOR, BOX_COLOR, EDGE_COLOR = "#ffd166", "#e9ecef", "#495057"


@dataclass(frozen=True)
class Step:
    """One box of the map: where it sits, what it holds, and the notebook that builds it."""

    name: str
    label: str
    shape: str
    notebook: str
    x: float
    y: float
    revisited: tuple[str, ...] = ()  # later notebooks that come back to this step (the full map names them too)


def pipeline_steps(config, images: int = 1, prompt_len: int = 300) -> list[Step]:
    """The map's boxes for a QWenVLConfig (shapes for `images` pictures and a prompt of `prompt_len` ids)."""
    visual = config.visual
    size, patch, hidden = visual["image_size"], visual["patch_size"], config.hidden_size
    patches = (size // patch) ** 2
    n = images
    return [
        Step("picture", "picture", f"{n}×{size}×{size}×3", "04", 0, 1),
        Step("vit", "ViT", f"{patches} patches × {visual['width']}", "04", 1, 1),
        Step("resampler", "resampler", f"{IMG_TOKEN_SPAN} queries", "04", 2, 1),
        Step("input_vit", "input_vit", f"[{n}, {IMG_TOKEN_SPAN}, {hidden}]", "04", 3, 1),
        Step("prompt_table", "prompt_table", f"[{n * IMG_TOKEN_SPAN}, {hidden}]", "04", 4, 1),
        Step("question", "question", "text + pictures", "01", 0, 0),
        Step("ids", "input_ids", f"[1, {prompt_len}]", "01", 1, 0),
        Step("img_pos", "img_pos", f"[{n}, 3]", "02", 2, 0),
        Step("fake_ids", "fake ids", f"{MODEL_VOCAB_SIZE} …", "03", 3, 0),
        Step("lookup", "lookup", f"[1, {prompt_len}, {hidden}]", "04", 4, 0, revisited=("09",)),  # 09: today's engines
        Step("lm", "language model", f"{config.num_hidden_layers} layers", "05", 5, 0),
        Step("answer", "answer", "generate", "06", 6, 0),
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


def pipeline_map(config, here=None, small: bool = False, images: int = 1, prompt_len: int = 300):
    """A matplotlib figure of the pipeline for `config`; the boxes of notebook `here` (e.g. "03") are highlighted.
    small=True draws the compact "you are here" strip the notebooks start with."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 — matplotlib is the course extra's
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: PLC0415 — the course extra's

    steps = {s.name: s for s in pipeline_steps(config, images, prompt_len)}
    on_map = {n for s in steps.values() for n in (s.notebook, *s.revisited)}
    if here is not None and here not in on_map:
        raise ValueError(f"notebook {here!r} is not on the map; notebooks {sorted(on_map)}")
    width, height = (9.0, 1.9) if small else (13.0, 3.6)
    fig, ax = plt.subplots(figsize=(width, height))
    box_w, box_h = 0.84, 0.62
    for s in steps.values():
        mine = here in (s.notebook, *s.revisited)
        color = HERE_COLOR if mine else BOX_COLOR
        ax.add_patch(
            FancyBboxPatch(
                (s.x - box_w / 2, s.y - box_h / 2),
                box_w,
                box_h,
                boxstyle="round,pad=0.02",
                facecolor=color,
                edgecolor=EDGE_COLOR,
                linewidth=1.5 if mine else 0.8,
            )
        )
        ax.text(s.x, s.y + 0.1, s.label, ha="center", va="center", fontsize=8 if small else 10, weight="bold")
        if not small:
            ax.text(s.x, s.y - 0.12, s.shape, ha="center", va="center", fontsize=8, family="monospace")
        ax.text(
            s.x + box_w / 2 - 0.04,
            s.y + box_h / 2 - 0.08,
            " · ".join((s.notebook, *s.revisited)) if not small else s.notebook,
            ha="right",
            va="center",
            fontsize=7,
            color="#6c757d",
        )
    for start, end in ARROWS:
        a, b = steps[start], steps[end]
        tail = (a.x + box_w / 2, a.y) if a.y == b.y else (a.x, a.y - box_h / 2)
        head = (b.x - box_w / 2, b.y) if a.y == b.y else (b.x, b.y + box_h / 2)
        ax.add_patch(FancyArrowPatch(tail, head, arrowstyle="-|>", mutation_scale=10, color=EDGE_COLOR))
    ax.set_xlim(-0.6, 6.6)
    ax.set_ylim(-0.5, 1.5)
    ax.axis("off")
    title = "the course's pipeline" + (f" — notebook {here} builds the highlighted steps" if here else "")
    ax.set_title(title, fontsize=9 if small else 11)
    fig.tight_layout()
    return fig
