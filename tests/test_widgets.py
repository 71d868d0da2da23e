"""Tests for the course's interactive parts: token viewer, prompt-table explorer and ask-the-model panel."""

import html
import io
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from qwenvl_lab.chat import SPAN_NAME, Conversation, GenerationSettings
from qwenvl_lab.course.widgets import (
    ID_STYLE,
    KIND_COLORS,
    NO_PICTURE,
    ROW_HEIGHT,
    UPLOADED,
    PanelResult,
    TokenView,
    answer_html,
    ask_panel,
    ask_panel_result,
    chat_panel,
    chat_turn,
    describe_lookup,
    kind_legend_html,
    lookup_rows,
    picture_from_upload,
    plot_token_kinds,
    table_explorer,
    table_heatmap,
    token_label,
    token_viewer,
    transcript_html,
)
from qwenvl_lab.grounding import boxes_picture
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.pictures import load_image
from qwenvl_lab.prompt_table import per_request_tables, prompt_tuning_embedding, single_table_batch, table_layout
from qwenvl_lab.tokenizing import (
    IMAGE_END_ID,
    IMAGE_PAD_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    MODEL_VOCAB_SIZE,
    TOKEN_KINDS,
    make_context,
)
from qwenvl_lab.toy.evaluate import ask
from qwenvl_lab.toy.shapes import trained_questions

IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"
widgets = pytest.importorskip("ipywidgets")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


@pytest.fixture(scope="module")
def chat_ids(tokenizer):
    """Context ids of one image and the article's question 图片里是什么？."""
    query = tokenizer.from_list_format([{"image": "../data/images/red_circle.png"}, {"text": "图片里是什么？"}])
    return make_context(tokenizer, query)[1]


def fake_batch(seed: int = 0, hidden: int = 8):
    """Two sequences (one image, two images) and their input_vit [3, 256, hidden]."""
    span = [IMAGE_START_ID, *b"a.png", *[IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - 5), IMAGE_END_ID]
    rows = [[11, *span, 12, 13], [14, *span, *span, 15]]
    length = max(map(len, rows))
    ids = torch.tensor([r + [0] * (length - len(r)) for r in rows])
    input_vit = torch.randn(3, IMG_TOKEN_SPAN, hidden, generator=torch.Generator().manual_seed(seed))
    return ids, input_vit


# The token viewer


def test_token_view_reads_kinds_and_meanings_from_the_tokenizer(tokenizer, chat_ids):
    view = TokenView.of(tokenizer, chat_ids)
    assert list(view.ids) == chat_ids
    assert list(view.kinds) == tokenizer.token_kinds(chat_ids)
    assert list(view.meanings) == tokenizer.describe_tokens(chat_ids)
    assert sum(view.counts().values()) == len(view) == len(chat_ids)
    assert list(view.counts()) == [k for k in TOKEN_KINDS if k in view.kinds]
    path_bytes = len(b"../data/images/red_circle.png")
    assert view.counts()["image_path_byte"] == path_bytes
    assert view.counts()["imgpad"] == IMG_TOKEN_SPAN - path_bytes
    assert TokenView.of(tokenizer, torch.tensor(chat_ids)).ids == view.ids
    counts = ", ".join(f"{k} {n}" for k, n in view.counts().items())
    assert repr(view) == f"TokenView({len(chat_ids)} ids: {counts})"


def test_chips_cover_every_position_once_and_collapse_long_runs(tokenizer, chat_ids):
    view = TokenView.of(tokenizer, chat_ids)
    chips = view.chips()
    assert [c.start for c in chips[1:]] == [c.stop for c in chips[:-1]]
    assert chips[0].start == 0 and chips[-1].stop == len(chat_ids)
    (pad,) = [c for c in chips if c.kind == "imgpad"]
    assert pad.stop - pad.start == view.counts()["imgpad"]
    assert pad.label == f"<imgpad> ×{pad.stop - pad.start}"
    assert all(c.stop - c.start == 1 for c in chips if c.kind != "imgpad")
    assert len(chips) == len(chat_ids) - (pad.stop - pad.start) + 1


def test_short_runs_stay_one_chip_per_id(tokenizer):
    path = "p" * (IMG_TOKEN_SPAN - 3)  # leaves 3 <imgpad>, fewer than `collapse`
    ids = tokenizer.encode_image_span(path)
    chips = TokenView.of(tokenizer, ids, collapse=4).chips()
    assert len(chips) == len(ids)
    assert [c.label for c in chips if c.kind == "imgpad"] == ["<imgpad>"] * 3
    assert len(TokenView.of(tokenizer, ids, collapse=3).chips()) == len(ids) - 2


def test_a_run_of_one_repeated_id_folds_like_01s_imgpad_chip(tokenizer):
    answer = tokenizer.encode("一个红色的圆形。")
    ids = answer + [tokenizer.im_end_id] * 19  # an answer, its <|im_end|>, and 18 pad ids that are <|im_end|> too
    chips = TokenView.of(tokenizer, ids).chips()
    assert len(chips) == len(answer) + 1
    assert (chips[-1].label, chips[-1].start, chips[-1].stop) == ("<|im_end|> ×19", len(answer), len(ids))
    assert chips[-1].title.startswith(f"{len(answer)}–{len(ids) - 1}: 19 × id {tokenizer.im_end_id} ")
    assert ">151645<" in TokenView.of(tokenizer, ids).to_html()  # one id under the chip, not 151645…151645
    assert len(TokenView.of(tokenizer, answer + [tokenizer.im_end_id] * 7).chips()) == len(answer) + 7  # < collapse
    assert len(TokenView.of(tokenizer, [tokenizer.eod_id] * 12 + answer).chips()) == 1 + len(answer)  # left padding


def test_fake_prompt_ids_collapse_and_label_their_offset(tokenizer, chat_ids):
    fake_ids = single_table_batch(chat_ids, torch.zeros(1, IMG_TOKEN_SPAN, 4), MODEL_VOCAB_SIZE)[0][0]
    view = TokenView.of(tokenizer, fake_ids)
    assert view.counts()["fake_prompt_id"] == IMG_TOKEN_SPAN
    assert "imgpad" not in view.counts() and "image_path_byte" not in view.counts()
    (fake,) = [c for c in view.chips() if c.kind == "fake_prompt_id"]
    assert fake.label == f"V+0 … V+{IMG_TOKEN_SPAN - 1}"
    assert str(MODEL_VOCAB_SIZE) in fake.title and str(MODEL_VOCAB_SIZE + IMG_TOKEN_SPAN - 1) in fake.title
    single = TokenView.of(tokenizer, fake_ids, collapse=IMG_TOKEN_SPAN + 1).chips()
    assert [c.label for c in single if c.kind == "fake_prompt_id"][:3] == ["V+0", "V+1", "V+2"]


def test_token_labels(tokenizer):
    assert token_label(tokenizer, ord("a"), "image_path_byte") == "a"
    assert token_label(tokenizer, 0xE5, "image_path_byte") == "\\xe5"
    assert token_label(tokenizer, MODEL_VOCAB_SIZE + 7, "fake_prompt_id") == "V+7"
    assert token_label(tokenizer, tokenizer.encode(" are")[0], "text") == "·are"
    assert token_label(tokenizer, tokenizer.encode("\n")[0], "text") == "↵"
    assert token_label(tokenizer, IMAGE_START_ID, "image_tag") == "<img>"
    assert token_label(tokenizer, tokenizer.im_end_id, "special") == "<|im_end|>"


def test_describe_position_and_its_errors(tokenizer, chat_ids):
    view = TokenView.of(tokenizer, chat_ids)
    start = chat_ids.index(IMAGE_START_ID)
    assert view.describe(start) == f"position {start}: id {IMAGE_START_ID} · image_tag · <img> (image_start_id)"
    assert view.describe(start + 1).endswith('path byte 0x2e "."')
    with pytest.raises(ValueError, match=f"outside the sequence: choose 0…{len(chat_ids) - 1}"):
        view.describe(len(chat_ids))
    with pytest.raises(ValueError, match="outside the sequence"):
        view.describe(-1)
    with pytest.raises(TypeError, match="position must be an int"):
        view.describe("3")


def test_token_view_rejects_batches_and_bad_collapse(tokenizer):
    with pytest.raises(ValueError, match="one sequence, got a batch of 2"):
        TokenView.of(tokenizer, [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="collapse must be an int >= 2"):
        TokenView.of(tokenizer, [1, 2], collapse=1)


def test_html_escapes_tags_and_outlines_the_selected_chip(tokenizer, chat_ids):
    view = TokenView.of(tokenizer, chat_ids)
    page = view.to_html(selected=100)  # inside the <imgpad> run
    assert "<img>" not in page and "&lt;img&gt;" in page  # the tag is shown, not rendered as an HTML image
    assert page.count("outline:") == 1
    outlined = page.split("outline:")[1]
    assert outlined.split("</span>")[0].count("&lt;imgpad&gt; ×") == 1
    for kind, n in view.counts().items():
        assert f"{kind} {n}</span>" in page and KIND_COLORS[kind] in page
    assert view._repr_html_() == view.to_html()
    assert "outline:" not in view.to_html()
    assert f'{ID_STYLE}">{chat_ids[0]}</span>' in page
    bare = view.to_html(show_ids=False, legend=False)
    assert ID_STYLE not in bare and "margin-bottom" not in bare
    with pytest.raises(ValueError, match="outside the sequence"):
        view.to_html(selected=len(chat_ids))


def test_kind_legend_rejects_unknown_kinds():
    assert "text 3" in kind_legend_html({"text": 3})
    with pytest.raises(ValueError, match="unknown token kind 'picture'"):
        kind_legend_html({"picture": 1})


def test_token_viewer_wires_the_slider_to_describe_and_to_html(tokenizer, chat_ids):
    box = token_viewer(tokenizer, chat_ids)
    chips, slider, info = box.children
    view = TokenView.of(tokenizer, chat_ids)
    assert slider.max == len(chat_ids) - 1
    assert info.value == html.escape(view.describe(0))
    slider.value = 19
    assert info.value == html.escape(view.describe(19))
    assert chips.value == view.to_html(selected=19)
    with pytest.raises(ValueError, match="empty"):
        token_viewer(tokenizer, [])


def test_plot_token_kinds_colours_each_cell_by_kind_in_bands_apart(tokenizer, chat_ids):

    batch = torch.tensor([[tokenizer.eod_id] * 5 + chat_ids[:-5], chat_ids])  # [2, L], row 0 shifted and cut
    img_pos = locate_img_pos(batch)
    ax = plot_token_kinds(tokenizer, batch, img_pos)
    assert len(ax.images) == 2  # one band per sequence
    for row, band in enumerate(ax.images):
        cells = band.get_array()
        assert cells.shape == (1, batch.shape[1])
        assert [TOKEN_KINDS[int(k)] for k in cells[0]] == tokenizer.token_kinds(batch[row])
        top, bottom = sorted(band.get_extent()[2:])
        assert bottom - top == pytest.approx(ROW_HEIGHT) and ROW_HEIGHT < 0.8  # a gap between the bands
    (ticks,) = ax.lines
    assert sorted(ticks.get_xdata()) == sorted(img_pos[:, 1:].reshape(-1).tolist())
    tags = [c for c in ax.collections if c.get_segments()]
    assert sum(len(c.get_segments()) for c in tags) == 2 * len(img_pos)  # every tag drawn as a bar
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "text",
        "special",
        "image_tag",
        "image_path_byte",
        "imgpad",
        "img_pos: <img>, </img>",
    ]
    matplotlib.pyplot.close(ax.figure)
    mask = torch.ones_like(batch)
    mask[0, :5] = 0
    ax = plot_token_kinds(tokenizer, batch, attention_mask=mask)
    cells = ax.images[0].get_array()
    assert (cells[0, :5] == len(TOKEN_KINDS)).all() and (cells[0, 5:] < len(TOKEN_KINDS)).all()
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "padding"
    matplotlib.pyplot.close(ax.figure)
    with pytest.raises(ValueError, match="outside the batch"):
        plot_token_kinds(tokenizer, batch, [[2, 0, 1]])
    with pytest.raises(ValueError, match="attention_mask has shape"):
        plot_token_kinds(tokenizer, batch, attention_mask=mask[:, 1:])


# The prompt-table explorer


def test_lookup_rows_follow_the_embedding_lookup():
    ids, input_vit = fake_batch()
    for fake_ids, table, tasks, tvs in (
        single_table_batch(ids, input_vit, MODEL_VOCAB_SIZE),
        per_request_tables(ids, input_vit, MODEL_VOCAB_SIZE),
    ):
        vocab = torch.randn(MODEL_VOCAB_SIZE, 8, generator=torch.Generator().manual_seed(1))
        embedded = prompt_tuning_embedding(fake_ids, vocab, table, tasks, tvs, MODEL_VOCAB_SIZE)  # [B, L, 8]
        entries = lookup_rows(fake_ids, tasks, tvs, MODEL_VOCAB_SIZE, table_rows=table.shape[0])
        assert entries.shape == (3 * IMG_TOKEN_SPAN, 4)
        seq, pos, fake, row = entries.T
        assert torch.equal(fake_ids[seq, pos], fake) and bool((fake >= MODEL_VOCAB_SIZE).all())
        assert torch.equal(embedded[seq, pos], table[row])
    # the python session reads the one table from top to bottom
    fake_ids, _, tasks, tvs = single_table_batch(ids, input_vit, MODEL_VOCAB_SIZE)
    assert torch.equal(lookup_rows(fake_ids, tasks, tvs, MODEL_VOCAB_SIZE)[:, 3], torch.arange(3 * IMG_TOKEN_SPAN))


def test_lookup_rows_errors():
    ids, input_vit = fake_batch()
    fake_ids, table, tasks, tvs = single_table_batch(ids, input_vit, MODEL_VOCAB_SIZE)
    with pytest.raises(ValueError, match="1 tasks for 2 requests"):
        lookup_rows(fake_ids, [0], tvs, MODEL_VOCAB_SIZE)
    with pytest.raises(ValueError, match=r"tasks must be in \[0, "):
        lookup_rows(fake_ids, [0, -1], tvs, MODEL_VOCAB_SIZE)
    with pytest.raises(ValueError, match="reads prompt-table row 256, but the table has 256 rows"):
        lookup_rows(fake_ids, tasks, tvs, MODEL_VOCAB_SIZE, table_rows=IMG_TOKEN_SPAN)
    assert lookup_rows(ids, tasks, tvs, MODEL_VOCAB_SIZE).shape == (0, 4)


def test_describe_lookup_states_the_rule():
    ids, input_vit = fake_batch()
    fake_ids, _, tasks, tvs = per_request_tables(ids, input_vit, MODEL_VOCAB_SIZE)
    entry = lookup_rows(fake_ids, tasks, tvs, MODEL_VOCAB_SIZE)[-1]  # last fake id of sequence 1
    text = describe_lookup(entry, tasks, tvs, MODEL_VOCAB_SIZE)
    last = 2 * IMG_TOKEN_SPAN - 1
    assert text == (
        f"sequence 1, position {int(entry[1])}: fake id {MODEL_VOCAB_SIZE + last} = V + {last} → "
        f"row {last} + task 1 × {2 * IMG_TOKEN_SPAN} = prompt_table row {last + 2 * IMG_TOKEN_SPAN}"
    )


def test_table_heatmap_draws_the_table_marks_rows_and_labels_blocks():
    table = torch.randn(IMG_TOKEN_SPAN, 8, generator=torch.Generator().manual_seed(2))
    ax = table_heatmap(table, highlight=[5])
    assert ax.images[0].get_array().shape == (IMG_TOKEN_SPAN, 8)
    (box,) = ax.patches
    assert box.get_y() == pytest.approx(4.5) and box.get_height() == 1
    assert "row 5" in [t.get_text() for t in ax.texts]  # named, visible at any size
    assert ax.get_title() == "prompt_table [256, 8]" and len(ax.figure.axes) == 2  # the map and its colour bar
    matplotlib.pyplot.close(ax.figure)
    ids, input_vit = fake_batch()
    fake_ids, flight, tasks, tvs = per_request_tables(ids, input_vit, MODEL_VOCAB_SIZE, 2 * IMG_TOKEN_SPAN)
    layout = table_layout(fake_ids, tasks, tvs, MODEL_VOCAB_SIZE, len(flight))
    ax = table_heatmap(flight, layout=layout)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [
        "request 0, picture 0\nrows 0–255",
        "unused\nrows 256–511",
        "request 1, picture 0\nrows 512–767",
        "request 1, picture 1\nrows 768–1023",
    ]
    assert [p.get_hatch() for p in ax.patches] == ["//"]  # the unused rows
    matplotlib.pyplot.close(ax.figure)
    with pytest.raises(ValueError, match="2-D prompt table"):
        table_heatmap(table[None])
    with pytest.raises(ValueError, match="cannot highlight row 256"):
        table_heatmap(table, highlight=[IMG_TOKEN_SPAN])


def test_table_explorer_names_the_fake_id_on_the_slider_and_marks_its_row_from_the_start():
    ids, input_vit = fake_batch()
    fake_ids, table, tasks, tvs = per_request_tables(ids, input_vit, MODEL_VOCAB_SIZE)
    slider, info, heat_map = table_explorer(fake_ids, table, tasks, tvs, MODEL_VOCAB_SIZE).children
    entries = lookup_rows(fake_ids, tasks, tvs, MODEL_VOCAB_SIZE)
    assert len(slider.options) == len(entries)
    assert info.value == html.escape(describe_lookup(entries[0], tasks, tvs, MODEL_VOCAB_SIZE))
    first_map = bytes(heat_map.value)
    assert first_map.startswith(b"\x89PNG") and Image.open(io.BytesIO(first_map)).size[0] > 500  # full size at once
    slider.value = 300
    seq, _, fake, row = entries[300].tolist()
    assert slider.label == f"{fake} (seq {seq})" and f"fake id {fake} " in info.value  # slider and text agree
    assert info.value == html.escape(describe_lookup(entries[300], tasks, tvs, MODEL_VOCAB_SIZE))
    assert bytes(heat_map.value) != first_map
    assert Image.open(io.BytesIO(bytes(heat_map.value))).size == Image.open(io.BytesIO(first_map)).size
    with pytest.raises(ValueError, match="no fake prompt ids"):
        table_explorer(ids, table, tasks, tvs, MODEL_VOCAB_SIZE)
    with pytest.raises(ValueError, match=f"the table has {IMG_TOKEN_SPAN} rows"):
        table_explorer(fake_ids, table[:IMG_TOKEN_SPAN], tasks, tvs, MODEL_VOCAB_SIZE)


# The ask-the-model panel


def png_bytes(color=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (20, 20), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_picture_from_upload():
    data = png_bytes()
    upload = ({"name": "red.png", "type": "image/png", "size": len(data), "content": memoryview(data)},)
    assert picture_from_upload(upload).getpixel((3, 3)) == (200, 30, 30)
    assert picture_from_upload(data).size == (20, 20)
    with pytest.raises(ValueError, match="no file uploaded"):
        picture_from_upload(())
    with pytest.raises(ValueError, match="not a picture file Pillow knows") as err:
        picture_from_upload(b"not a png")
    assert "BytesIO" not in str(err.value) and " at 0x" not in str(err.value)  # no object repr for the learner
    with pytest.raises(ValueError, match="'content'"):
        picture_from_upload([{"name": "x"}])
    with pytest.raises(TypeError, match="expected uploaded bytes, got str"):
        picture_from_upload("red.png")


def picture_file_bytes(mode: str, fmt: str) -> bytes:
    """A small picture of random pixels in `mode`, saved as `fmt`."""
    rng = np.random.default_rng(7)
    if mode == "F":
        picture = Image.fromarray(rng.random((9, 11)).astype(np.float32), mode="F")
    elif mode == "I;16":
        picture = Image.fromarray(rng.integers(0, 65536, (9, 11)).astype(np.uint16))
    else:
        picture = Image.fromarray(rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)).convert(mode)
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "mode, fmt",
    [("I;16", "PNG"), ("I;16", "TIFF"), ("F", "TIFF"), ("P", "PNG"), ("LA", "PNG"), ("CMYK", "JPEG"), ("RGBA", "PNG")],
)
def test_an_upload_gives_the_pixels_of_the_same_file_read_from_its_path(tmp_path, mode, fmt):
    data = picture_file_bytes(mode, fmt)
    (tmp_path / "picture").write_bytes(data)
    from_path = np.asarray(load_image(tmp_path / "picture"))
    assert np.array_equal(np.asarray(picture_from_upload(({"name": "p", "content": memoryview(data)},))), from_path)
    assert np.array_equal(np.asarray(load_image(Image.open(io.BytesIO(data)))), from_path)


def test_a_16_bit_upload_is_scaled_to_8_bits():
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 4), 128 * 257, dtype=np.uint16)).save(buffer, format="PNG")  # mid-grey, 16 bits
    assert picture_from_upload(buffer.getvalue()).getpixel((1, 1)) == (128, 128, 128)


def test_ask_panel_result_matches_the_pipeline(tiny_model, tokenizer, image_files):
    path = str(image_files["red"])
    question = "图片里是什么？"
    result = ask_panel_result(tiny_model, tokenizer, path, question, max_new_tokens=4)
    assert isinstance(result, PanelResult)
    query = tokenizer.from_list_format([{"image": path}, {"text": question}])
    assert result.ids == make_context(tokenizer, query)[1]
    with torch.inference_mode():
        input_vit = tiny_model.transformer.visual.encode([path])  # [1, 256, H]
    assert torch.equal(result.prompt_table, input_vit[0])
    expected_fake = single_table_batch(result.ids, input_vit, tiny_model.config.vocab_size)[0][0].tolist()
    assert result.fake_ids == expected_fake
    a = result.ids.index(IMAGE_START_ID)
    assert result.fake_ids[a + 1 : a + 1 + IMG_TOKEN_SPAN] == list(range(MODEL_VOCAB_SIZE, MODEL_VOCAB_SIZE + 256))
    assert result.answer == ask(tiny_model, tokenizer, [[path]], [question], max_new_tokens=4)[0]


def test_ask_panel_result_with_a_pil_picture_and_bad_questions(tiny_model, tokenizer):
    picture = Image.new("RGB", (30, 30), (20, 20, 220))
    result = ask_panel_result(tiny_model, tokenizer, picture, "What is in the picture?", max_new_tokens=2)
    assert tokenizer.decode(result.ids).count(f"<img>{SPAN_NAME.format(k=1)}</img>") == 1
    assert result.answer == ask(tiny_model, tokenizer, [[picture]], ["What is in the picture?"], max_new_tokens=2)[0]
    with pytest.raises(ValueError, match="type a question"):
        ask_panel_result(tiny_model, tokenizer, picture, "  ")


def upload_of(name, data):
    """A FileUpload value (ipywidgets 8) holding one file."""
    return (
        {
            "name": name,
            "type": "image/png",
            "size": len(data),
            "content": memoryview(data),
            "last_modified": datetime.now(timezone.utc),
        },
    )


def test_ask_panel_button_shows_the_picture_ids_table_and_answer(tiny_model, tokenizer, image_files):
    panel = ask_panel(tiny_model, tokenizer, {"red": str(image_files["red"]), "missing": "nope.png"})
    (choice, upload), (shown, source), (text, button), answer, ids_view, table = [
        getattr(w, "children", w) for w in panel.children
    ]
    assert shown.value and source.value == "sample: red"  # the picture asked about is on screen
    assert shown.layout.display is None
    text.value = "What color is the circle?"
    button.click()
    expected = ask_panel_result(tiny_model, tokenizer, str(image_files["red"]), text.value)
    assert answer.value == f"<b>answer:</b> {html.escape(expected.answer)}"
    assert ids_view.value == TokenView.of(tokenizer, expected.fake_ids).to_html()
    assert table.value and table.layout.display is None  # the table of the picture asked about
    choice.value = "nope.png"
    assert not shown.value and "cannot show the picture" in source.value
    assert shown.layout.display == "none"  # an empty Image widget would show as a broken picture
    button.click()
    assert answer.value.startswith("<b>cannot ask:</b> image file not found: &#x27;nope.png&#x27;")
    assert ids_view.value == ""  # an error leaves nothing of the previous answer
    text.value = ""
    choice.value = str(image_files["red"])
    button.click()
    assert "type a question" in answer.value
    text.value = "What color is the circle?"
    upload.value = upload_of("blue.png", png_bytes((0, 0, 250)))
    assert choice.value == choice.label == UPLOADED and source.value == "uploaded: blue.png"
    button.click()
    uploaded = ask_panel_result(tiny_model, tokenizer, picture_from_upload(upload.value), text.value)
    assert answer.value == f"<b>answer:</b> {html.escape(uploaded.answer)}"
    assert ids_view.value == TokenView.of(tokenizer, uploaded.fake_ids).to_html()
    choice.value = str(image_files["red"])  # picking a sample, even the one shown before, drops the upload
    assert (
        upload.value == () and source.value == "sample: red" and UPLOADED not in [label for label, _ in choice.options]
    )
    upload.value = upload_of("junk.png", b"not a picture")
    button.click()
    assert "the uploaded file &#x27;junk.png&#x27; is refused" in answer.value and "BytesIO" not in answer.value
    assert "not a picture file Pillow knows" in answer.value
    with pytest.raises(ValueError, match="at least one picture"):
        ask_panel(tiny_model, tokenizer, {})


def test_an_ask_panel_result_is_cleared_the_moment_the_picture_or_the_question_changes(tiny_model, tokenizer):
    red, blue = str(IMAGES / "red_circle.png"), str(IMAGES / "blue_square.png")
    panel = ask_panel(tiny_model, tokenizer, {"red": red, "blue": blue})
    (choice, upload), (shown, _), (text, button), answer, ids_view, table = [
        getattr(w, "children", w) for w in panel.children
    ]

    def shows_a_result():
        return answer.value.startswith("<b>answer:</b>") or bool(ids_view.value) or table.layout.display != "none"

    text.value = "How many shapes are there?"
    button.click()
    assert shows_a_result()
    choice.value = blue  # another sample: the answer about the red circle must go
    assert not shows_a_result() and "the picture changed" in answer.value
    button.click()
    assert (
        answer.value
        == f"<b>answer:</b> {html.escape(ask_panel_result(tiny_model, tokenizer, blue, text.value).answer)}"
    )
    text.value = "What color is the square?"  # another question
    assert not shows_a_result() and "the question changed" in answer.value
    button.click()
    upload.value = upload_of("two.png", png_bytes((0, 200, 0)))  # an upload replaces the sample
    assert not shows_a_result() and "the picture changed" in answer.value
    assert shown.value  # the uploaded picture is on screen, with nothing of the answer before it


# The chat panel


def test_chat_turn_streams_and_boxes_are_drawn_on_the_latest_picture(toy_chat):

    runner, vision, tokenizer = toy_chat
    talk = Conversation(runner, vision, tokenizer, settings=GenerationSettings(max_new_tokens=16))
    picture = str(IMAGES / "red_circle.png")
    partial = list(chat_turn(talk, "What is in the picture?", picture))
    assert partial[-1] == "A red circle." and all(b.startswith(a) for a, b in zip(partial, partial[1:]))
    assert boxes_picture(talk.pictures, partial[-1]) is None  # no box in that answer
    drawn = boxes_picture(talk.pictures, "<ref>the red circle</ref><box>(299,299),(701,701)</box>")
    original = Image.open(picture).convert("RGB")
    assert drawn.size == original.size and drawn.getpixel((67, 112)) != original.getpixel((67, 112))  # the left edge
    assert "red_circle.png" in transcript_html(talk) and "A red circle." in transcript_html(talk)
    with pytest.raises(ValueError, match="type a question"):
        list(chat_turn(talk, " "))


def test_chat_panel_sends_streams_and_clears(toy_chat):

    runner, vision, tokenizer = toy_chat
    talk = Conversation(runner, vision, tokenizer, settings=GenerationSettings(max_new_tokens=40))
    red, boxes = str(IMAGES / "red_circle.png"), str(IMAGES / "red_circle_blue_square.png")
    panel = chat_panel(talk, {"red circle": red, "two shapes": boxes}, "What is in the picture?")
    (choice, attached), (text, send, clear), transcript, answer = [getattr(w, "children", w) for w in panel.children]
    assert attached.layout.display == "none"  # no picture attached yet: an empty Image would show as broken
    choice.value = red
    assert attached.value and attached.layout.display is None  # a thumbnail of the picture the question brings
    send.click()
    assert "A red circle." in transcript.value and answer.value == "" and choice.value == NO_PICTURE
    assert transcript.value.count("<img ") == 1 and "red_circle.png" in transcript.value  # the turn's thumbnail
    assert attached.layout.display == "none"  # the next question brings no picture
    text.value = "How many shapes are there?"
    send.click()
    assert len(talk.history) == 2 and "One." in transcript.value and not send.disabled
    clear.click()
    assert talk.history == [] and transcript.value == ""
    choice.value = boxes
    text.value = "Where is the blue square?"
    send.click()
    assert "<box>" in talk.history[-1][1]
    assert transcript.value.count("<img ") == 2  # the thumbnail, and the answer's box drawn on its picture


def test_the_ask_panel_says_when_a_question_is_not_one_the_model_was_trained_on():
    """An untrained question gets the model's words and a note, in the question's language, that it knows only its
    trained questions (before, 'What is this?' got '一个。' and nothing else); a trained one gets its answer alone."""
    assert answer_html("What color is the circle?", "Red.") == "<b>answer:</b> Red."
    assert answer_html("  what is in the PICTURE? ", "A red circle.") == "<b>answer:</b> A red circle."
    english = answer_html("What is this?", "一个。")
    assert english.startswith(
        "<b>answer:</b> 一个。<br><i>The course's model knows only the questions it was trained on"
    )
    assert "What is in the picture?" in english and "图片里" not in english.split("<i>")[1]
    chinese = answer_html("这是什么？", "Red.")
    assert "只认识训练过的问题" in chinese and "图片里是什么？" in chinese
    for lang in ("en", "zh"):
        assert all(answer_html(q, "x") == "<b>answer:</b> x" for q in trained_questions(lang))


def broken_pictures() -> dict:
    """Files that are not pictures the course can read, each refused by load_image for its own reason."""
    png = png_bytes()
    bomb = io.BytesIO()
    Image.new("L", (1, 1)).save(bomb, format="PNG")
    wide = bomb.getvalue()[:16] + (200_000).to_bytes(4, "big") + (200_000).to_bytes(4, "big") + bomb.getvalue()[24:]
    nan = io.BytesIO()
    Image.fromarray(np.full((3, 3), np.nan, dtype=np.float32), mode="F").save(nan, format="TIFF")
    return {
        "text": b"not a picture\n",
        "empty": b"",
        "a truncated PNG": png[: len(png) // 2],
        "a PNG of 200,000 x 200,000 pixels": wide,
        "a float TIFF of NaN": nan.getvalue(),
    }


@pytest.mark.parametrize("name", list(broken_pictures()))
def test_an_upload_is_refused_for_the_reason_the_same_file_from_a_path_is(name, tmp_path):
    data = broken_pictures()[name]
    (tmp_path / "upload.png").write_bytes(data)
    with pytest.raises(ValueError) as from_path:
        load_image(tmp_path / "upload.png")
    reason = str(from_path.value).replace(repr(str(tmp_path / "upload.png")), f"the {len(data)} bytes given")
    with pytest.raises(ValueError) as uploaded:
        picture_from_upload(upload_of("upload.png", data))
    assert str(uploaded.value) == f"the uploaded file 'upload.png' is refused: {reason}"
    assert "BytesIO" not in reason and " at 0x" not in reason


def test_the_chat_panel_says_why_a_picture_cannot_be_attached(toy_chat, tmp_path):
    runner, vision, tokenizer = toy_chat
    (tmp_path / "notes.png").write_text("not a picture")
    talk = Conversation(runner, vision, tokenizer, settings=GenerationSettings(max_new_tokens=8))
    panel = chat_panel(talk, {"notes": str(tmp_path / "notes.png"), "red": str(IMAGES / "red_circle.png")})
    (choice, attached), _, _, answer = [getattr(w, "children", w) for w in panel.children]
    choice.value = str(tmp_path / "notes.png")
    assert attached.layout.display == "none" and "cannot show the picture" in answer.value
    assert "not a picture file Pillow knows" in answer.value
    choice.value = str(IMAGES / "red_circle.png")
    assert attached.layout.display is None and answer.value == ""
