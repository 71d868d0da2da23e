"""The diagrams are drawn from the package's own layout functions: the table's blocks, the embedding's two sources and
the next-token bars say what the lookup and the distribution say."""

import matplotlib
import pytest
import torch

from qwenvl_lab.course.diagrams import plot_embedding_sources, plot_next_token, plot_table_layout
from qwenvl_lab.prompt_table import TableBlock, lookup_rows, per_request_tables, single_table_batch, table_layout
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE

matplotlib.use("Agg")
V = MODEL_VOCAB_SIZE
SPAN = [IMAGE_START_ID, *b"a.png", *[IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - 5), IMAGE_END_ID]


def requests():
    """Three requests with 1, 0 and 2 pictures, as 1-D id lists of different lengths, and input_vit [3, 256, 4]."""
    rows = [[11, *SPAN, 12], [13, 14, 15], [16, *SPAN, 17, *SPAN, 18]]
    return [torch.tensor(r) for r in rows], torch.randn(
        3, IMG_TOKEN_SPAN, 4, generator=torch.Generator().manual_seed(0)
    )


def fake(rows, vit, rows_per_request):
    """Each request's ids with fake ids, the table, tasks and task_vocab_size of in-flight batching."""
    ids, blocks, first = [], [], 0
    for r in rows:
        n = int((r == IMAGE_START_ID).sum())
        f, t, _, tvs = per_request_tables(r, vit[first : first + n], V, rows_per_request)
        ids.append(f[0])
        blocks.append(t)
        first += n
    return ids, torch.cat(blocks), torch.arange(len(rows), dtype=torch.int32), tvs


def test_table_layout_in_flight_has_a_block_per_position_and_the_unused_rows_between():
    rows, vit = requests()
    ids, table, tasks, tvs = fake(rows, vit, rows_per_request=2 * IMG_TOKEN_SPAN)
    assert table_layout(ids, tasks, tvs, V, len(table)) == [
        TableBlock(0, 256, 0, 0),
        TableBlock(256, 1024, None, None),  # the rest of request 0's block and all of request 1's (no picture)
        TableBlock(1024, 1280, 2, 0),
        TableBlock(1280, 1536, 2, 1),
    ]
    for block in table_layout(ids, tasks, tvs, V, len(table)):  # each block is what the lookup reads, no more
        read = {int(e[3]) for r, i in enumerate(ids) for e in lookup_rows(i, tasks[r : r + 1], tvs, V)}
        assert all((row in read) == (block.request is not None) for row in range(block.start, block.stop))


def test_table_layout_of_the_python_session_counts_pictures_across_the_batch():
    rows, vit = requests()
    ids = [single_table_batch(r, vit[:1], V)[0][0] if k == 0 else r for k, r in enumerate(rows)]
    two = single_table_batch(rows[2], vit[1:], V)[0][0]
    ids[2] = torch.where(two >= V, two + IMG_TOKEN_SPAN, two)  # the session's ids go on from request 0's
    layout = table_layout(ids, [0, 0, 0], IMG_TOKEN_SPAN, V, 3 * IMG_TOKEN_SPAN)
    assert [(b.start, b.stop, b.request, b.picture) for b in layout] == [
        (0, 256, 0, 0),
        (256, 512, 2, 0),
        (512, 768, 2, 1),
    ]
    with pytest.raises(ValueError, match="2 tasks for 3 requests"):
        table_layout(ids, [0, 0], IMG_TOKEN_SPAN, V, 768)
    with pytest.raises(ValueError, match="the table has 512 rows"):
        table_layout(ids, [0, 0, 0], IMG_TOKEN_SPAN, V, 512)


def test_table_layout_reads_spans_of_any_length_from_img_pos():
    """Spans of 3 and 5 ids (Qwen2-VL's way: the span follows the picture) in one table: each picture's rows are its
    span's length, read from img_pos."""
    ids = torch.tensor([[11, IMAGE_START_ID, 0, 0, 0, IMAGE_END_ID, 12, IMAGE_START_ID, *[0] * 5, IMAGE_END_ID]])
    features = [torch.randn(3, 4), torch.randn(5, 4)]
    fake_ids, table, tasks, tvs = single_table_batch(ids, features, V)
    assert table_layout(fake_ids, tasks, tvs, V, len(table)) == [TableBlock(0, 3, 0, 0), TableBlock(3, 8, 0, 1)]


def test_the_layout_diagram_draws_the_blocks_and_where_each_task_starts():
    rows, vit = requests()
    ids, table, tasks, tvs = fake(rows, vit, rows_per_request=2 * IMG_TOKEN_SPAN)
    ax = plot_table_layout(ids, tasks, tvs, V, len(table), title="in flight")
    spans = sorted((p.get_x(), p.get_x() + p.get_width(), p.get_hatch()) for p in ax.patches)
    assert spans == [(0, 256, None), (256, 1024, "//"), (1024, 1280, None), (1280, 1536, None)]
    notes = [t.get_text() for t in ax.texts]
    for task in range(3):
        assert any(
            n.startswith(f"task {task} (request {task})\nstarts at row {task * 512} = {task} × 512") for n in notes
        )
    assert "unused\nrows 256–1023" in notes and "request 2\npicture 1\nrows 1280–1535" in notes
    matplotlib.pyplot.close(ax.figure)
    session = plot_table_layout([torch.tensor([1, 2])] * 2, [0, 0], 256, V, 256)
    assert "task 0 (requests 0, 1)\nstarts at row 0 = 0 × 256" in [t.get_text() for t in session.texts]
    matplotlib.pyplot.close(session.figure)


def test_the_embedding_sources_strip_follows_the_lookup():
    rows, vit = requests()
    ids = single_table_batch(rows[2], vit[1:], V)[0]  # [1, L]: two pictures
    strip, read = plot_embedding_sources(ids, [0], IMG_TOKEN_SPAN, V)
    entries = lookup_rows(ids, [0], IMG_TOKEN_SPAN, V)
    assert strip.get_title(loc="left") == f"{ids.shape[1] - 512} ids from the word embedding, 512 from the prompt table"
    (dots,) = read.lines
    assert list(dots.get_xdata()) == entries[:, 1].tolist() and list(dots.get_ydata()) == entries[:, 3].tolist()
    assert "position 2: fake id 151936\n→ prompt_table row 0" in [t.get_text() for t in read.texts]
    matplotlib.pyplot.close(strip.figure)
    with pytest.raises(ValueError, match="one sequence"):
        plot_embedding_sources(torch.cat([ids, ids]), [0, 0], IMG_TOKEN_SPAN, V)


def test_the_next_token_bars_name_tokens_by_their_text_and_gather_the_rest(tokenizer):
    logits = torch.full((V,), -20.0)
    red, yellow, a = tokenizer.encode("Red")[0], tokenizer.encode("Yellow")[0], tokenizer.encode("一个")[0]
    logits[[red, yellow, a]] = torch.tensor([3.0, 2.5, 0.0])
    kept = torch.zeros(V, dtype=torch.bool)
    kept[red] = True
    ax = plot_next_token(tokenizer, logits, kept=kept)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:3] == ["'Red'", "'Yellow'", "'一个'"] and labels[3].startswith("the other\n151,933")
    heights = [p.get_height() for p in ax.patches]
    assert sum(heights) == pytest.approx(1.0, abs=1e-4) and all(h > 0 for h in heights)  # no empty bar
    colors = [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches]
    assert colors[0] != colors[1] == colors[2]  # only 'Red' is kept
    matplotlib.pyplot.close(ax.figure)
