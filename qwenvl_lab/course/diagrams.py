"""The course's diagrams, drawn from the package's own functions: the prompt table's layout (which rows each request's
pictures read, the unused rows, where each task starts), the two sources of one embedding sequence, the prompt table
as a heat map, and a distribution over the next token."""

import io

import torch

from ..checks.tensors import as_batch
from ..fonts import use_cjk_font
from ..prompt_table import lookup_rows, table_layout

UNUSED_COLOR = "#e5e7eb"
WORD_EMBEDDING_COLOR, PROMPT_TABLE_COLOR = "#93c5fd", "#4ade80"  # the two sources of an embedding sequence


def figure_png(fig, dpi: int = 100) -> bytes:
    """A matplotlib figure as PNG bytes (for an Image widget), the figure closed."""

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def request_color(request: int, picture: int) -> str:
    """A colour per request, a lighter or darker shade of it for its pictures in turn (matplotlib's tab20)."""
    import matplotlib

    return matplotlib.colors.to_hex(matplotlib.colormaps["tab20"]((2 * request + picture % 2) % 20))


def _range(start: int, stop: int) -> str:
    return f"row {start}" if stop - start == 1 else f"rows {start}–{stop - 1}"


def plot_table_layout(requests, tasks, task_vocab_size, vocab_size: int, table_rows: int, ax=None, title=None):
    """A prompt table of `table_rows` rows as a bar: the rows each request's pictures read (`table_layout`), the
    unused rows hatched, and above it the row each task starts at (task × task_vocab_size)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    use_cjk_font()
    blocks = table_layout(requests, tasks, task_vocab_size, vocab_size, table_rows)
    tasks = [int(t) for t in torch.as_tensor(tasks).reshape(-1).tolist()]
    tvs = int(torch.as_tensor(task_vocab_size).reshape(-1)[0])
    if ax is None:
        _, ax = plt.subplots(figsize=(9.6, 2.3))
    bottom, height = 0.0, 1.0
    for block in blocks:
        width = block.stop - block.start
        if block.request is None:
            color, label = UNUSED_COLOR, f"unused\n{_range(block.start, block.stop)}"
            ax.add_patch(Rectangle((block.start, bottom), width, height, facecolor=color, edgecolor="#6b7280",
                                   hatch="//", linewidth=0.8))  # fmt: skip
        else:
            color = request_color(block.request, block.picture)
            label = f"request {block.request}\npicture {block.picture}\n{_range(block.start, block.stop)}"
            ax.add_patch(Rectangle((block.start, bottom), width, height, facecolor=color, edgecolor="white",
                                   linewidth=1.5))  # fmt: skip
        if width >= 0.07 * table_rows:
            ax.text(block.start + width / 2, bottom + height / 2, label, ha="center", va="center", fontsize=9,
                    bbox=dict(facecolor="white", alpha=0.75, edgecolor="none", pad=1.5))  # fmt: skip
    starts = {}
    for request, task in enumerate(tasks):
        starts.setdefault(task * tvs, []).append((task, request))
    for row, found in sorted(starts.items()):
        names = sorted({t for t, _ in found})
        who = [r for _, r in found]
        requests_text = f"request {who[0]}" if len(who) == 1 else f"requests {', '.join(map(str, who))}"
        text = f"task {', '.join(map(str, names))} ({requests_text})\nstarts at row {row} = {names[0]} × {tvs}"
        ax.annotate(text, xy=(row, bottom + height), xytext=(row, bottom + height + 0.75), ha="left", va="center",
                    fontsize=9, arrowprops=dict(arrowstyle="-|>", color="black", linewidth=1.2))  # fmt: skip
    ax.set_xlim(0, table_rows)
    ax.set_ylim(-0.05, bottom + height + 1.25)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel(f"prompt_table row (of {table_rows}; task_vocab_size {tvs})")
    if title:
        ax.set_title(title, loc="left", fontsize=11)
    return ax


def plot_embedding_sources(input_ids, tasks, task_vocab_size, vocab_size: int, table_rows=None, ax=None):
    """One sequence's positions coloured by where the lookup reads their embeddings (the word embedding for ids < V,
    the prompt table for fake ids), and below them the table row each fake id reads (`lookup_rows`)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    use_cjk_font()
    input_ids = as_batch(input_ids)  # [1, L]
    if input_ids.shape[0] != 1:
        raise ValueError(f"plot_embedding_sources draws one sequence, got a batch of {input_ids.shape[0]}; pass ids[b]")
    entries = lookup_rows(input_ids, tasks, task_vocab_size, vocab_size, table_rows)  # [M, 4]
    length = input_ids.shape[1]
    from_table = torch.zeros(length, dtype=torch.bool)
    from_table[entries[:, 1]] = True
    if ax is None:
        _, (strip, rows) = plt.subplots(2, 1, figsize=(9.6, 3.8), sharex=True, gridspec_kw=dict(height_ratios=[1, 2.2]))
    else:
        strip, rows = ax
    colors = [PROMPT_TABLE_COLOR if t else WORD_EMBEDDING_COLOR for t in from_table.tolist()]
    strip.bar(range(length), 1, width=1.0, color=colors, align="center")
    start = 0
    for p in range(1, length + 1):  # each run of one source, labelled with its positions
        if p == length or from_table[p] != from_table[start]:
            source = "prompt_table" if from_table[start] else "word embedding"
            if p - start >= 0.3 * length:  # a narrow run: the legend names its colour
                strip.text((start + p - 1) / 2, 0.5, f"{source}: positions {start}–{p - 1}", ha="center",
                           va="center", fontsize=9)  # fmt: skip
            start = p
    strip.set(yticks=[], ylim=(0, 1))
    n_table = int(from_table.sum())
    strip.set_title(f"{length - n_table} ids from the word embedding, {n_table} from the prompt table", loc="left",
                    fontsize=11)  # fmt: skip
    rows.legend(handles=[Patch(color=WORD_EMBEDDING_COLOR, label="id < V: wte row id"),
                         Patch(color=PROMPT_TABLE_COLOR, label="id ≥ V: prompt_table row")],
                loc="upper left", fontsize=9, framealpha=0.9)  # fmt: skip
    rows.plot(entries[:, 1].tolist(), entries[:, 3].tolist(), ".", color="#15803d", markersize=3)
    if len(entries):
        first, last = entries[0].tolist(), entries[-1].tolist()
        height = max(1, last[3] - first[3])  # the annotations go under the rising line, where it leaves room
        for (_, pos, fake, row), x, y in (
            (first, first[1] + 0.3 * length, first[3] + 0.06 * height),
            (last, last[1] - 0.02 * length, first[3] + 0.42 * height),
        ):
            rows.annotate(f"position {pos}: fake id {fake}\n→ prompt_table row {row}", xy=(pos, row), xytext=(x, y),
                          ha="left" if pos == first[1] else "right", va="center", fontsize=9,
                          arrowprops=dict(arrowstyle="-|>", color="gray"))  # fmt: skip
    rows.set(xlabel="position in the sequence", ylabel="table row read", xlim=(-0.5, length - 0.5))
    rows.grid(alpha=0.3)
    return strip, rows


def table_heatmap(prompt_table: torch.Tensor, highlight=(), ax=None, title: str = "prompt_table", layout=()):
    """Heat map of a prompt table [rows, H] (rows down, hidden dims across), with a colour bar; `highlight` rows are
    boxed, marked and named; `layout` (prompt_table.table_layout's blocks) labels whose rows are whose and hatches
    the unused ones."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    use_cjk_font()
    if not isinstance(prompt_table, torch.Tensor) or prompt_table.dim() != 2:
        raise ValueError("table_heatmap takes a 2-D prompt table [rows, H] (flatten input_vit with ptuning_setup)")
    table = prompt_table.detach().float().cpu()
    rows, hidden = table.shape
    highlight = [int(r) for r in highlight]
    for r in highlight:
        if not 0 <= r < rows:
            raise ValueError(f"cannot highlight row {r}: the table has rows 0…{rows - 1}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.2))
    limit = float(table.abs().max()) or 1.0
    image = ax.imshow(table.numpy(), aspect="auto", cmap="coolwarm", vmin=-limit, vmax=limit, interpolation="nearest")
    ticks, labels = [], []
    for block in layout:
        if block.request is None:
            ax.add_patch(Rectangle((-0.5, block.start - 0.5), hidden, block.stop - block.start, facecolor="none",
                                   edgecolor="#6b7280", hatch="//", linewidth=0))  # fmt: skip
        ax.axhline(block.start - 0.5, color="black", linewidth=0.8)
        ticks.append((block.start + block.stop - 1) / 2)
        labels.append(
            f"unused\n{_range(block.start, block.stop)}"
            if block.request is None
            else f"request {block.request}, picture {block.picture}\n{_range(block.start, block.stop)}"
        )
    for r in highlight:
        ax.add_patch(Rectangle((-0.5, r - 0.5), hidden, 1, fill=False, edgecolor="black", linewidth=1.5))
        ax.plot([-0.5, hidden - 0.5], [r, r], color="black", linewidth=2.5)
        ax.plot([hidden - 0.5], [r], marker="<", color="black", markersize=9, clip_on=False)
        ax.text(hidden * 0.02, r, f"row {r}", ha="left", va="bottom" if r > rows / 8 else "top", fontsize=10,
                bbox=dict(facecolor="white", edgecolor="black", pad=2))  # fmt: skip
    if layout:
        ax.set_yticks(ticks, labels, fontsize=8.5)
        ax.set_ylabel("")
    else:
        ax.set_ylabel("row")
    ax.set(xlabel="hidden dimension", title=f"{title} [{rows}, {hidden}]")
    ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.03, label="value")
    return ax


def plot_next_token(tokenizer, logits: torch.Tensor, kept=None, min_p: float = 0.005, most: int = 8, ax=None,
                    title: str = "the next token"):  # fmt: skip
    """The distribution over the next token from `logits` [V]: a bar per token of probability ≥ `min_p` (at most
    `most`), named by its text, and one bar for all the others together; `kept` [V] (bool, e.g. what top_p keeps)
    colours the tokens a sampler may draw."""
    import matplotlib.pyplot as plt

    use_cjk_font()
    probs = logits.detach().float().reshape(-1).softmax(dim=-1)  # [V]
    top = probs.topk(most)
    shown = [(int(i), float(p)) for i, p in zip(top.indices, top.values) if p >= min_p] or [(int(top.indices[0]),
                                                                                            float(top.values[0]))]  # fmt: skip
    rest = max(0.0, 1.0 - sum(p for _, p in shown))
    labels = [repr(tokenizer.decode([i])) for i, _ in shown] + [f"the other\n{len(probs) - len(shown):,} tokens"]
    colors = ["#2563eb" if kept is None or bool(kept[i]) else "#9ca3af" for i, _ in shown] + ["#e5e7eb"]
    values = [p for _, p in shown] + [rest]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.3 * len(values) + 2, 2.8))
    bars = ax.bar(range(len(values)), values, color=colors, edgecolor="#374151", linewidth=0.6)
    bars[-1].set_hatch("//")
    for bar, value in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, value + 0.02, f"{value:.2f}" if value >= 0.01 else f"{value:.0e}",
                ha="center", va="bottom", fontsize=9)  # fmt: skip
    ax.set_xticks(range(len(values)), labels, fontsize=10)
    ax.set(ylabel="probability", ylim=(0, 1.12), title=title)
    return ax
