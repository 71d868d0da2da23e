"""The course's interactive parts: token viewer, prompt-table explorer, ask-the-model panel, chat panel (logic +
widgets)."""

import base64
import html
import io
import os
from dataclasses import dataclass

import torch
from PIL import Image

from ..chat import ModelAsRunner, answer_inputs, engine_inputs, make_prompt
from ..checks.tensors import as_batch, one_int, parse_tasks
from ..checks.values import is_int
from ..grounding import boxes_picture, to_list_format
from ..pictures import load_image
from ..prompt_table import lookup_rows, table_layout
from ..tokenizing import IMAGE_PAD_ID, MODEL_VOCAB_SIZE, TOKEN_KINDS
from ..toy.shapes import is_trained_question, trained_questions
from .diagrams import figure_png, table_heatmap

# One colour per token kind (tokenizing.TOKEN_KINDS); vocab_pad is red because it should never occur
KIND_COLORS = {
    "text": "#e9ecef",
    "special": "#ffd166",
    "image_tag": "#e8590c",
    "image_path_byte": "#8ecae6",
    "imgpad": "#cdb4db",
    "vocab_pad": "#ef476f",
    "fake_prompt_id": "#95d5b2",
}
PADDING_COLOR = "#ffffff"
HEATMAP_CLASS = "qwenvl-heatmap"  # the CSS class of the Image widgets that show a prompt table
COLLAPSIBLE = ("imgpad", "fake_prompt_id")  # long runs of these kinds show as one chip
CHIP_STYLE = (
    "display:inline-block;margin:1px;padding:0 3px;border-radius:3px;white-space:pre;text-align:center;background:"
)
ID_STYLE = "display:block;font-size:9px;color:#444"


@dataclass(frozen=True)
class Chip:
    """One coloured box of the token view: positions start…stop-1, all of one kind."""

    start: int
    stop: int
    kind: str
    label: str
    title: str


def token_label(tokenizer, token_id: int, kind: str) -> str:
    """Short text shown on a token's chip (spaces as ·, newlines as ↵)."""
    if kind == "image_path_byte":
        return chr(token_id) if 32 < token_id < 127 else f"\\x{token_id:02x}"
    if kind == "fake_prompt_id":
        return f"V+{token_id - MODEL_VOCAB_SIZE}"
    return tokenizer.decode([token_id]).replace(" ", "·").replace("\n", "↵")


@dataclass(frozen=True)
class TokenView:
    """A token sequence with each id's kind and meaning; shows as coloured chips (`_repr_html_`)."""

    ids: tuple[int, ...]
    kinds: tuple[str, ...]
    meanings: tuple[str, ...]
    labels: tuple[str, ...]
    collapse: int = 8

    @classmethod
    def of(cls, tokenizer, ids, collapse: int = 8) -> "TokenView":
        """Read kinds and meanings of `ids` [L] from the tokenizer (`token_kinds`, `describe_tokens`)."""
        ids = as_batch(ids)
        if ids.shape[0] != 1:
            raise ValueError(f"TokenView shows one sequence, got a batch of {ids.shape[0]}; pass input_ids[b]")
        if not is_int(collapse) or collapse < 2:
            raise ValueError(f"collapse must be an int >= 2 (the shortest run shown as one chip), got {collapse!r}")
        ids = ids[0].tolist()
        kinds = tokenizer.token_kinds(ids)
        labels = [token_label(tokenizer, i, kind) for i, kind in zip(ids, kinds)]
        return cls(tuple(ids), tuple(kinds), tuple(tokenizer.describe_tokens(ids)), tuple(labels), collapse)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"TokenView({len(self)} ids: " + ", ".join(f"{k} {n}" for k, n in self.counts().items()) + ")"

    def counts(self) -> dict[str, int]:
        """Number of ids of each kind present, in TOKEN_KINDS order."""
        return {kind: self.kinds.count(kind) for kind in TOKEN_KINDS if kind in self.kinds}

    def check_position(self, position) -> int:
        """Return `position` if it indexes the sequence, else raise a ValueError."""
        if not is_int(position):
            raise TypeError(f"position must be an int, got {type(position).__name__}")
        if not 0 <= position < len(self):
            raise ValueError(f"position {position} is outside the sequence: choose 0…{len(self) - 1}")
        return position

    def describe(self, position: int) -> str:
        """One line about the id at `position`: its value, kind and meaning."""
        p = self.check_position(position)
        return f"position {p}: id {self.ids[p]} · {self.kinds[p]} · {self.meanings[p]}"

    def chips(self) -> list[Chip]:
        """Chips in order: one per id, except runs of `collapse` or more `<imgpad>` / fake ids, or of one special token
        repeated (the `<|im_end|>` padding after an answer, `<|endoftext|>` padding before a prompt), which share one."""
        chips, p = [], 0
        while p < len(self):
            kind, q = self.kinds[p], p + 1
            if kind in COLLAPSIBLE:
                while q < len(self) and self.kinds[q] == kind:
                    q += 1
            elif kind == "special":
                while q < len(self) and self.ids[q] == self.ids[p]:
                    q += 1
            if q - p < self.collapse:
                q = p + 1
            if q - p == 1:
                label = self.labels[p]
                title = f"{p}: id {self.ids[p]} · {self.meanings[p]}"
            elif kind == "imgpad":
                label = f"<imgpad> ×{q - p}"
                title = f"{p}–{q - 1}: {q - p} × id {IMAGE_PAD_ID} <imgpad> (image_start_id + 2)"
            elif kind == "fake_prompt_id":
                first, last = self.ids[p], self.ids[q - 1]
                label = f"V+{first - MODEL_VOCAB_SIZE} … V+{last - MODEL_VOCAB_SIZE}"
                title = f"{p}–{q - 1}: {q - p} fake prompt ids {first} … {last} (V = {MODEL_VOCAB_SIZE})"
            else:
                label = f"{self.labels[p]} ×{q - p}"
                title = f"{p}–{q - 1}: {q - p} × id {self.ids[p]} · {self.meanings[p]}"
            chips.append(Chip(p, q, kind, label, title))
            p = q
        return chips

    def to_html(self, selected: int | None = None, legend: bool = True, show_ids: bool = True) -> str:
        """Chips as HTML (hover shows each id's meaning); the chip holding `selected` gets a black outline."""
        if selected is not None:
            self.check_position(selected)
        parts = [kind_legend_html(self.counts())] if legend else []
        parts.append('<div style="font-family:monospace;font-size:12px;line-height:1.8">')
        for chip in self.chips():
            outline = "outline:2px solid #000;" if selected is not None and chip.start <= selected < chip.stop else ""
            first, last = self.ids[chip.start], self.ids[chip.stop - 1]
            ids = f"{first}" if first == last else f"{first}…{last}"
            under = f'<span style="{ID_STYLE}">{ids}</span>' if show_ids else ""
            style = f"{outline}{CHIP_STYLE}{KIND_COLORS[chip.kind]}"
            label = html.escape(chip.label)
            parts.append(f'<span title="{html.escape(chip.title)}" style="{style}">{label}{under}</span>')
        parts.append("</div>")
        return "".join(parts)

    def _repr_html_(self) -> str:
        return self.to_html()


def kind_legend_html(counts: dict[str, int]) -> str:
    """A legend line: one coloured box per kind with its count."""
    for kind in counts:
        if kind not in KIND_COLORS:
            raise ValueError(f"unknown token kind {kind!r}; kinds are {TOKEN_KINDS}")
    boxes = "".join(
        f'<span style="{CHIP_STYLE}{KIND_COLORS[k]}">{html.escape(k)} {n}</span>' for k, n in counts.items()
    )
    return f'<div style="font-family:monospace;font-size:12px;margin-bottom:4px">{boxes}</div>'


def token_viewer(tokenizer, ids, collapse: int = 8):
    """Widget: the coloured sequence, a position slider and the selected id's meaning."""
    import ipywidgets as widgets

    view = TokenView.of(tokenizer, ids, collapse)
    if not len(view):
        raise ValueError("no ids to show: the sequence is empty")
    slider = widgets.IntSlider(
        value=0, min=0, max=len(view) - 1, description="position", layout=widgets.Layout(width="100%")
    )
    chips = widgets.HTML(view.to_html(selected=0))
    info = widgets.HTML(html.escape(view.describe(0)))

    def on_select(change):
        chips.value = view.to_html(selected=change["new"])
        info.value = html.escape(view.describe(change["new"]))

    slider.observe(on_select, names="value")
    return widgets.VBox([chips, slider, info])


# Figures


ROW_HEIGHT = 0.62  # of each sequence's band in plot_token_kinds: the gaps between them keep the rows apart


def plot_token_kinds(tokenizer, input_ids, img_pos=None, attention_mask=None, ax=None, title: str = "token kinds"):
    """A batch [B, L] as bands of coloured cells, one band per sequence and one colour per token kind (padding white);
    the image tags are drawn as bars wide enough to see, and `img_pos` as black triangles above them."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from ..fonts import use_cjk_font

    use_cjk_font()
    input_ids = as_batch(input_ids)  # [B, L]
    batch, length = input_ids.shape
    kinds = [tokenizer.token_kinds(row) for row in input_ids.tolist()]
    grid = torch.tensor([[TOKEN_KINDS.index(k) for k in row] for row in kinds])  # [B, L]
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids "
                f"{tuple(input_ids.shape)}; give one mask value per id"
            )
        grid[attention_mask == 0] = len(TOKEN_KINDS)  # padding
    if img_pos is not None:
        img_pos = torch.as_tensor(img_pos).reshape(-1, 3)
        outside = len(img_pos) and (int(img_pos[:, 0].max()) >= batch or int(img_pos[:, 1:].max()) >= length)
        if outside:
            raise ValueError(f"img_pos points outside the batch of shape {tuple(input_ids.shape)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * batch))
    cmap = ListedColormap([KIND_COLORS[k] for k in TOKEN_KINDS] + [PADDING_COLOR])
    half = ROW_HEIGHT / 2
    for b in range(batch):
        ax.imshow(grid[b : b + 1].numpy(), aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(TOKEN_KINDS) + 0.5,
                  interpolation="nearest", extent=(-0.5, length - 0.5, b + half, b - half))  # fmt: skip
        tags = (grid[b] == TOKEN_KINDS.index("image_tag")).nonzero().reshape(-1).tolist()
        ax.vlines(tags, b - half, b + half, color=KIND_COLORS["image_tag"], linewidth=3)
    if img_pos is not None and len(img_pos):
        rows, starts, ends = img_pos.T.tolist()
        ax.plot(starts + ends, [r - half - 0.08 for r in rows + rows], "v", color="black", markersize=6,
                linestyle="none")  # fmt: skip
    shown = set(grid.unique().tolist())
    handles = [Patch(color=KIND_COLORS[k], label=k) for n, k in enumerate(TOKEN_KINDS) if n in shown]
    if len(TOKEN_KINDS) in shown:
        handles.append(Patch(facecolor=PADDING_COLOR, edgecolor="#999999", label="padding"))
    if img_pos is not None and len(img_pos):
        handles.append(Line2D([], [], marker="v", color="black", linestyle="none", label="img_pos: <img>, </img>"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9, frameon=False)
    ax.set(xlabel="position", ylabel="sequence", yticks=range(batch), title=title)
    ax.set_xlim(-0.5, length - 0.5)
    ax.set_ylim(batch - 0.5, -0.5 - 0.12)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return ax


# The prompt-table explorer


def describe_lookup(entry, tasks, task_vocab_size, vocab_size: int) -> str:
    """One line: which prompt-table row the fake id at (sequence, position) reads, and why."""
    seq, pos, fake, row = (int(v) for v in entry)
    task = parse_tasks(tasks, None)[seq]
    tvs = one_int(task_vocab_size, "task_vocab_size", 0)
    return (
        f"sequence {seq}, position {pos}: fake id {fake} = V + {fake - vocab_size} → "
        f"row {fake - vocab_size} + task {task} × {tvs} = prompt_table row {row}"
    )


def fake_id_label(entry) -> str:
    """The table explorer's name for a fake id of the batch: the id and its sequence, as describe_lookup names them."""
    seq, _, fake, _ = (int(v) for v in entry)
    return f"{fake} (seq {seq})"


def heatmap_png(prompt_table, highlight=(), title: str = "prompt_table", layout=()) -> bytes:
    """table_heatmap drawn at one fixed size, as PNG bytes for an Image widget."""
    ax = table_heatmap(prompt_table, highlight=highlight, title=title, layout=layout)
    return figure_png(ax.figure)


def table_explorer(input_ids, prompt_table, tasks, task_vocab_size, vocab_size: int):
    """Widget: pick a fake id of the batch (the slider names it), see which table row it reads, marked on the heat map
    of the table, whose blocks say which request's picture they hold and which rows nobody reads."""
    import ipywidgets as widgets

    entries = lookup_rows(input_ids, tasks, task_vocab_size, vocab_size, table_rows=prompt_table.shape[0])
    if not len(entries):
        raise ValueError(f"the ids hold no fake prompt ids (>= {vocab_size}); replace the image spans first")
    layout = table_layout(input_ids, tasks, task_vocab_size, vocab_size, prompt_table.shape[0])
    slider = widgets.SelectionSlider(
        options=[(fake_id_label(e), k) for k, e in enumerate(entries)],
        value=0,
        description="fake id",
        continuous_update=False,
        layout=widgets.Layout(width="100%"),
        style={"description_width": "initial"},
    )
    info = widgets.HTML()
    heat_map = widgets.Image(format="png", layout=widgets.Layout(align_self="flex-start"))  # at its size, not stretched
    heat_map.add_class(HEATMAP_CLASS)

    def on_select(change):
        entry = entries[change["new"]]
        info.value = html.escape(describe_lookup(entry, tasks, task_vocab_size, vocab_size))
        heat_map.value = heatmap_png(prompt_table, highlight=[int(entry[3])], layout=layout)

    slider.observe(on_select, names="value")
    on_select({"new": 0})
    return widgets.VBox([slider, info, heat_map])


# The ask-the-model panel


@dataclass
class PanelResult:
    """What the ask panel shows: the ids before and after the fake ids go in, the prompt table and the answer."""

    ids: list[int]  # [L] context ids as the tokenizer made them (the image span holds the path)
    fake_ids: list[int]  # [L] the same ids with the span replaced by fake prompt ids
    prompt_table: torch.Tensor  # [256, H] = input_vit[0]
    answer: str


def picture_from_upload(value) -> Image.Image:
    """The picture of a FileUpload value (ipywidgets 8: a tuple of dicts with 'content'), or of raw bytes, read by
    `load_image` as the same file from a path would be."""
    name = ""
    if isinstance(value, (tuple, list)):
        if not value:
            raise ValueError("no file uploaded: choose a picture first")
        value = value[0]
    if isinstance(value, dict):
        if "content" not in value:
            raise ValueError("an uploaded file is a dict with a 'content' entry (ipywidgets 8 FileUpload.value)")
        name = f" {str(value.get('name', ''))!r}" if value.get("name") else ""
        value = value["content"]
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected uploaded bytes, got {type(value).__name__}")
    try:
        return load_image(value)
    except ValueError as err:  # load_image's reason, as a file from a path gets it: what to upload instead
        raise ValueError(f"the uploaded file{name} is refused: {err}") from None


def picture_png(picture, size: int = 160) -> bytes:
    """A picture (path or PIL image) as PNG bytes, at most `size` pixels on its longer side, for an Image widget."""
    image = load_image(picture)
    image.thumbnail((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def show_png(image, png: bytes) -> None:
    """Put PNG bytes into an Image widget; without any it is hidden (a browser would draw a broken picture)."""
    image.value = png
    image.layout.display = None if png else "none"


def ask_panel_result(model, tokenizer, picture, question: str, max_new_tokens: int = 24) -> PanelResult:
    """Ids, prompt table and greedy answer for one picture (path or PIL image) and one question."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("type a question, e.g. 图片里是什么？")
    runner, (_, ids) = ModelAsRunner(model), make_prompt(tokenizer, question, [picture])  # [L]
    inputs = engine_inputs(runner, model.transformer.visual, tokenizer, [([picture], question)])
    [answer] = answer_inputs(runner, tokenizer, inputs, max_new_tokens)
    return PanelResult(ids, inputs.batch_input_ids[0].tolist(), inputs.prompt_table, answer)


UPLOADED = "(the uploaded picture)"  # the dropdown's entry while an upload is the picture
NO_PICTURE = "(no new picture)"  # the chat panel's entry for a question without a picture


def answer_html(question: str, answer: str) -> str:
    """What the ask panel shows for `answer` to `question`: the answer, and, for a question the course's model was not
    trained on, a note in the question's language that it knows only its trained questions (it answers others with
    words it has seen, often in the other language)."""
    shown = f"<b>answer:</b> {html.escape(answer)}"
    if is_trained_question(question):
        return shown
    chinese = any("\u4e00" <= c <= "\u9fff" for c in question)
    examples = " · ".join(html.escape(q) for q in trained_questions("zh" if chinese else "en")[::7])
    note = (
        "课程的模型只认识训练过的问题，例如："
        if chinese
        else "The course's model knows only the questions it was trained on (data/images/README.md), such as: "
    )
    return f"{shown}<br><i>{note}{examples}</i>"


def stale_note(what: str) -> str:
    """What the ask panel says in place of a result once its picture or question has changed."""
    return f"<i>the {html.escape(what)} changed: press <b>Ask</b> for an answer about the {html.escape(what)} shown</i>"


def picture_preview(load, caption: str, size: int = 160) -> tuple[bytes, str]:
    """(PNG bytes, HTML caption) of the picture `load()` gives, for a panel; one that cannot be read gives no PNG and
    says why."""
    try:
        return picture_png(load(), size), html.escape(caption)
    except (ValueError, TypeError, FileNotFoundError, IsADirectoryError) as err:
        return b"", f"<b>cannot show the picture:</b> {html.escape(str(err))}"


def ask_panel(model, tokenizer, pictures: dict, question: str = "图片里是什么？"):
    """Widget: choose (or upload) a picture, see it, type a question, see the ids, the prompt table and the answer; a
    result is cleared the moment the picture or the question changes, so what is shown always belongs to them."""
    import ipywidgets as widgets

    if not pictures:
        raise ValueError("give at least one picture: {label: path}")
    choice = widgets.Dropdown(options=list(pictures.items()), description="picture")
    upload = widgets.FileUpload(accept="image/*", multiple=False, description="or upload")
    shown = widgets.Image(format="png")
    source = widgets.HTML()
    text = widgets.Text(value=question, description="question")
    button = widgets.Button(description="Ask", button_style="primary")
    answer = widgets.HTML()
    ids_view = widgets.HTML()
    table = widgets.Image(
        format="png", layout=widgets.Layout(display="none", align_self="flex-start")
    )  # with an answer
    table.add_class(HEATMAP_CLASS)

    def current_picture():
        return picture_from_upload(upload.value) if upload.value else choice.value

    def clear_result(what):
        if answer.value and not answer.value.startswith("<i>"):  # a result (or an error) about what was there
            answer.value = stale_note(what)
        ids_view.value = ""
        show_png(table, b"")

    def show_picture(_=None):
        caption = f"uploaded: {upload.value[0]['name']}" if upload.value else f"sample: {choice.label}"
        png, source.value = picture_preview(current_picture, caption)
        show_png(shown, png)
        clear_result("picture")

    def on_upload(_):
        if upload.value:
            choice.options = [(UPLOADED, UPLOADED), *pictures.items()]
            choice.value = UPLOADED
        show_picture()

    def on_choice(change):
        if change["new"] != UPLOADED:  # a sample was picked: it replaces the upload, even the sample shown before
            if upload.value:
                upload.value = ()
            choice.options = list(pictures.items())
        show_picture()

    def on_ask(_):
        ids_view.value = ""
        show_png(table, b"")
        try:
            result = ask_panel_result(model, tokenizer, current_picture(), text.value)
        except (ValueError, TypeError, FileNotFoundError, IsADirectoryError) as err:
            answer.value = f"<b>cannot ask:</b> {html.escape(str(err))}"
            return
        answer.value = answer_html(text.value, result.answer)
        ids_view.value = TokenView.of(tokenizer, result.fake_ids).to_html()
        show_png(table, heatmap_png(result.prompt_table, title="this picture's prompt_table"))

    button.on_click(on_ask)
    upload.observe(on_upload, names="value")
    choice.observe(on_choice, names="value")
    text.observe(lambda _: clear_result("question"), names="value")
    show_picture()
    return widgets.VBox(
        [
            widgets.HBox([choice, upload]),
            widgets.HBox([shown, source]),
            widgets.HBox([text, button]),
            answer,
            ids_view,
            table,
        ]
    )


# The chat panel


def chat_turn(conversation, question: str, picture=None):
    """Ask one question of a Conversation (with a new picture or none): yields the answer so far, piece by piece."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("type a question, e.g. 框出图中红色的圆形")
    answer = ""
    for piece in conversation.stream(question, [] if picture is None else [picture]):
        answer += piece
        yield answer


def thumbnail_html(picture, size: int = 72) -> str:
    """A picture (path or PIL image) as an inline <img> of at most `size` pixels, or "" when it cannot be read."""
    try:
        png = picture_png(picture, size)
    except (ValueError, TypeError, FileNotFoundError, IsADirectoryError, OSError):
        return ""
    return (
        f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" '
        'style="vertical-align:middle;margin:2px 4px;border:1px solid #ccc">'
    )


def transcript_html(conversation, drawings=None) -> str:
    """The conversation so far as HTML: each question with a thumbnail of every picture it brought, then its answer,
    and `drawings[k]` (PNG bytes: the boxes of turn k's answer drawn on its picture) under turn k's answer."""
    rows = []
    for k, (query, answer) in enumerate(conversation.history):
        elements = to_list_format(query)
        paths = [e["image"] for e in elements if "image" in e]
        pictures = "".join(thumbnail_html(p) + f"<i>[{html.escape(os.path.basename(p))}]</i> " for p in paths)
        question = "".join(e.get("text", "") for e in elements)
        drawn = (drawings or {}).get(k)
        boxes = (
            f'<div><img src="data:image/png;base64,{base64.b64encode(drawn).decode()}" '
            'style="margin:2px 0 6px 3em;border:1px solid #ccc"></div>'
            if drawn
            else ""
        )
        rows.append(
            f"<div><b>you:</b> {html.escape(question)}{f' {pictures}' if pictures else ''}</div>"
            f"<div><b>model:</b> {html.escape(answer)}</div>{boxes}"
        )
    return "".join(rows)


def chat_panel(conversation, pictures: dict, question: str = "框出图中红色的圆形"):
    """Widget: a chat with the engine — attach a picture (or not; a thumbnail shows it), ask, watch the answer stream,
    see each turn's pictures and the boxes of its answer drawn on its picture; "clear history" starts over."""
    import ipywidgets as widgets

    if not pictures:
        raise ValueError("give at least one picture: {label: path}")
    choice = widgets.Dropdown(options=[(NO_PICTURE, NO_PICTURE), *pictures.items()], description="picture")
    attached = widgets.Image(
        format="png", layout=widgets.Layout(display="none")
    )  # the picture the next question brings
    text = widgets.Text(value=question, description="you")
    send = widgets.Button(description="Send", button_style="primary")
    clear = widgets.Button(description="Clear history")
    transcript, answer = widgets.HTML(), widgets.HTML()
    drawings = {}  # turn → PNG of its answer's boxes on its picture

    def on_choice(_=None):
        if choice.value == NO_PICTURE:
            png = b""
        else:
            png, caption = picture_preview(lambda: choice.value, "", size=96)
            answer.value = caption  # empty, or why the picture cannot be shown (Send then says it again)
        show_png(attached, png)

    def on_send(_):
        send.disabled = True
        try:
            for so_far in chat_turn(conversation, text.value, None if choice.value == NO_PICTURE else choice.value):
                answer.value = f"<b>model:</b> {html.escape(so_far)}"
        except (ValueError, TypeError, FileNotFoundError, IsADirectoryError) as err:
            answer.value = f"<b>cannot ask:</b> {html.escape(str(err))}"
            return
        finally:
            send.disabled = False
        drawn = boxes_picture(conversation.pictures, conversation.history[-1][1])
        if drawn is not None:
            drawings[len(conversation.history) - 1] = picture_png(drawn, size=240)
        transcript.value, answer.value = transcript_html(conversation, drawings), ""
        choice.value = NO_PICTURE

    def on_clear(_):
        conversation.clear()
        drawings.clear()
        transcript.value = answer.value = ""

    send.on_click(on_send)
    clear.on_click(on_clear)
    choice.observe(on_choice, names="value")
    return widgets.VBox([widgets.HBox([choice, attached]), widgets.HBox([text, send, clear]), transcript, answer])
