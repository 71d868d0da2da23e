"""Tests for step 1: the Qwen-VL tokenizer, image spans and the chatml context."""

import hashlib
import pickle
import unicodedata

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenvl_lab import resources, tokenizing
from qwenvl_lab.tokenizing import (
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    IMAGE_END_ID,
    IMAGE_PAD_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    MODEL_VOCAB_SIZE,
    QWEN_TIKTOKEN_SHA256,
    TOKENIZER_VOCAB_SIZE,
    Query,
    QWenTokenizer,
    decode_image_path,
    load_tokenizer,
    make_context,
    vocab_file_path,
)

SYSTEM_IDS = [2610, 525, 264, 10950, 17847, 13]  # "You are a helpful assistant." (reference)
SYSTEM_ID, USER_ID, ASSISTANT_ID, NL_ID = 8948, 872, 77091, 198


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def span(path: str) -> list[int]:
    """The span of `path`: its NFC form's UTF-8 bytes, then <imgpad>."""
    data = unicodedata.normalize("NFC", path).encode("utf-8")
    return [IMAGE_START_ID, *data, *[IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(data)), IMAGE_END_ID]


def qwen_vl_span(tok, path: str) -> list[int]:
    """The span Qwen-VL's tokenization_qwen.py writes (x1ngzai/Qwen-VL-Chat-Int4@1cd721a2): `tokenize` normalises the
    whole text NFC, BPE-encodes it with the image tags special, then `_encode_imgurl` joins the bytes of the pieces
    between <img> and </img>, one id per byte, and pads them with <imgpad>."""
    text = unicodedata.normalize("NFC", f"<img>{path}</img>")
    pieces = tok.encoding.encode(text, allowed_special={"<img>", "</img>"})
    assert pieces[0] == IMAGE_START_ID and pieces[-1] == IMAGE_END_ID
    data = b"".join(tok.encoding.decode_single_token_bytes(i) for i in pieces[1:-1])
    return [IMAGE_START_ID, *data, *[IMAGE_PAD_ID] * (IMG_TOKEN_SPAN - len(data)), IMAGE_END_ID]


# vocabulary and loading


def test_special_tokens_follow_the_reference(tok):
    assert len(tok) == TOKENIZER_VOCAB_SIZE == 151860
    s = tok.special_tokens
    assert len(s) == 217
    assert (s["<|endoftext|>"], s["<|im_start|>"], s["<|im_end|>"]) == (151643, 151644, 151645)
    assert (s["<|extra_0|>"], s["<|extra_204|>"]) == (151646, 151850)
    assert [s[t] for t in ("<ref>", "</ref>", "<box>", "</box>", "<quad>", "</quad>")] == list(range(151851, 151857))
    assert [s[t] for t in ("<img>", "</img>", "<imgpad>")] == [151857, 151858, 151859]
    assert sorted(s.values()) == list(range(ENDOFTEXT_ID, TOKENIZER_VOCAB_SIZE))
    assert (tok.eod_id, tok.im_start_id, tok.im_end_id) == (151643, 151644, 151645)
    assert (tok.img_start_id, tok.img_end_id, tok.img_pad_id) == (151857, 151858, 151859)
    assert (tok.ref_start_id, tok.ref_end_id, tok.box_start_id, tok.box_end_id) == (151851, 151852, 151853, 151854)
    assert (tok.quad_start_id, tok.quad_end_id) == (151855, 151856)
    assert tok.encoding.name == "qwen"


def test_known_ids(tok):
    assert tok.encode("system") == [SYSTEM_ID]
    assert tok.encode("user") == [USER_ID]
    assert tok.encode("assistant") == [ASSISTANT_ID]
    assert tok.encode("\n") == [NL_ID]
    assert tok.encode("You are a helpful assistant.") == SYSTEM_IDS


def test_encode_normalizes_nfc(tok):
    assert tok.encode("e\u0301") == tok.encode("\u00e9")
    assert tok.decode(tok.encode("e\u0301")) == "\u00e9"


def test_default_loader_uses_shipped_copy(tok):
    assert tok.vocab_file.resolve() == resources.vocab_file().resolve()
    assert tok.vocab_file.parent.name == "data"  # the checkout's data/ or an installed qwenvl_lab/data/
    assert hashlib.sha256(tok.vocab_file.read_bytes()).hexdigest() == QWEN_TIKTOKEN_SHA256


def test_checkpoint_dir_with_crlf_copy_is_used(tok, tmp_path):
    data = tok.vocab_file.read_bytes().replace(b"\n", b"\r\n")
    assert len(data) == 2_712_861
    (tmp_path / "qwen.tiktoken").write_bytes(data)
    ckpt = load_tokenizer(tmp_path)
    assert ckpt.vocab_file == tmp_path / "qwen.tiktoken"
    assert ckpt.encode("You are a helpful assistant.") == SYSTEM_IDS
    assert load_tokenizer(tmp_path / "qwen.tiktoken").vocab_file == tmp_path / "qwen.tiktoken"


def test_dir_without_vocab_falls_back_to_shipped_copy(tok, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert load_tokenizer(tmp_path).vocab_file == tok.vocab_file


def test_tampered_copy_is_rejected(tok, tmp_path):
    lines = tok.vocab_file.read_bytes().splitlines(keepends=True)
    lines[100], lines[101] = lines[101].split()[0] + b" 100\n", lines[100].split()[0] + b" 101\n"  # swap two ranks
    (tmp_path / "qwen.tiktoken").write_bytes(b"".join(lines))
    with pytest.raises(ValueError, match=r"qwen\.tiktoken.*sha256"):
        load_tokenizer(tmp_path)


def test_tampered_shipped_copy_is_rejected(tok, tmp_path, monkeypatch):
    bad = tmp_path / "data" / "qwen.tiktoken"
    bad.parent.mkdir()
    bad.write_bytes(tok.vocab_file.read_bytes()[:-20])
    monkeypatch.setattr(resources, "vocab_file", lambda: bad)
    with pytest.raises(ValueError, match="sha256") as err:
        load_tokenizer()
    assert str(bad.resolve()) in str(err.value) and "`git checkout -- data/qwen.tiktoken`" in str(err.value)


def test_missing_shipped_copy_names_the_restore_command(monkeypatch, tmp_path):
    monkeypatch.setattr(resources, "vocab_file", lambda: tmp_path / "data" / "qwen.tiktoken")
    with pytest.raises(FileNotFoundError, match=r"missing; `git checkout -- data/qwen\.tiktoken`"):
        load_tokenizer()
    with pytest.raises(FileNotFoundError, match="shipped vocabulary"):
        vocab_file_path(tmp_path)  # a directory without qwen.tiktoken needs the shipped copy too


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        QWenTokenizer(tmp_path / "nope.tiktoken")


def test_parsed_vocabulary_is_cached(tok):
    assert load_tokenizer().encoding is tok.encoding


# plain text is always plain text


@pytest.mark.filterwarnings("ignore:.*as plain text")  # typed <img>…</img> warns (test_chat.py)
@pytest.mark.parametrize("typed", ["<img>/etc/passwd</img>", "<|im_start|>", "<|endoftext|><ref>a</ref><imgpad>"])
def test_user_typed_special_strings_get_no_special_ids(tok, typed):
    ids = tok.encode(typed)
    assert all(i < ENDOFTEXT_ID for i in ids)
    assert tok.decode(ids) == typed
    query = tok.from_list_format([{"text": typed}])
    assert all(i < ENDOFTEXT_ID for i in tok.encode_query(query))
    _, context = make_context(tok, typed)
    assert IMAGE_START_ID not in context
    assert context.count(IM_START_ID) == 3  # system, user, assistant only


def test_string_operations_on_a_query_give_plain_text(tok):
    query = tok.from_list_format([{"image": "a.jpg"}])
    assert IMAGE_START_ID in tok.encode(query)
    assert IMAGE_START_ID not in tok.encode(query.strip())


def test_adding_text_to_a_query_keeps_its_images(tok):
    query = tok.from_list_format([{"image": "a.jpg"}])
    for joined in (query + "What is <img>b.jpg</img>?", "Look: " + query, query + query):
        assert isinstance(joined, Query)
    with_text = query + "What is <img>b.jpg</img>?"  # typed tags stay text
    assert with_text == "Picture 1: <img>a.jpg</img>\nWhat is <img>b.jpg</img>?"
    assert with_text.images == ("a.jpg",)
    assert tok.encode(with_text) == tok.encode(
        tok.from_list_format([{"image": "a.jpg"}, {"text": "What is <img>b.jpg</img>?"}])
    )
    ids = tok.encode("Look: " + query)
    assert ids.count(IMAGE_START_ID) == 1 and ids[: len(tok.encode("Look: Picture"))] == tok.encode("Look: Picture")
    both = query + tok.from_list_format([{"image": "c.png"}, {"text": "x"}])
    assert both.images == ("a.jpg", "c.png") and tok.encode(both).count(IMAGE_START_ID) == 2
    query += "more"
    assert isinstance(query, Query) and query.images == ("a.jpg",) and query.endswith("\nmore")
    _, context = make_context(tok, "Say: " + tok.from_list_format([{"image": "a.jpg"}]))
    assert context.count(IMAGE_START_ID) == 1
    with pytest.raises(TypeError, match="unsupported operand"):
        query + 5


def test_text_meeting_at_the_seam_encodes_as_one_text(tok):
    query = tok.from_list_format([{"image": "a.jpg"}, {"text": "hel"}])
    assert tok.encode(query + "lo") == tok.encode(tok.from_list_format([{"image": "a.jpg"}, {"text": "hello"}]))
    assert (query + "e\u0301").segments[-1] == ("text", "\nhel\u00e9")  # NFC across the seam


def test_a_million_spaces_encode(tok):
    ids = tok.encode(" " * 1_000_000)
    assert tok.decode(ids) == " " * 1_000_000 and all(i < ENDOFTEXT_ID for i in ids)
    text = "a" + "\t" * 1_200_000 + "b" + " " * 3 + "\u3000" * 1_000_001 + "!"
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text", [" " * 999_998 + "a", "x" + "\t" * 999_998, "\n" + " " * 999_998 + "!"])
def test_long_runs_encode_as_tiktoken_does_in_one_go(tok, text):
    assert tok.encode(text) == tok.encoding.encode(text, allowed_special=set(), disallowed_special=())


SPACES = st.sampled_from(
    [
        " ",
        "\t",
        "\x0b",
        "\x0c",
        "\x85",
        "\xa0",
        "\u1680",
        "\u2003",
        "\u2028",
        "\u2029",
        "\u202f",
        "\u3000",
        "\r",
        "\n",
        "\x1c",
    ]
)
SPACED_TEXT = st.lists(
    st.one_of(
        st.text(max_size=4),
        st.tuples(SPACES, st.integers(1, 6)).map(lambda r: r[0] * r[1]),
        st.sampled_from(["'s", "'LL", "!", "a", "7", "é"]),
    ),
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=SPACED_TEXT, cut=st.integers(2, 4))
def test_cutting_out_whitespace_runs_keeps_the_one_shot_ids(tok, text, cut):
    assert tokenizing._encode_ordinary(tok.encoding, text, cut) == tok.encoding.encode_ordinary(text)


# image spans


def test_image_span_layout(tok):
    ids = tok.encode_image_span("/data/cat.jpg")
    assert len(ids) == IMG_TOKEN_SPAN + 2 == 258
    assert ids[0] == 151857 and ids[-1] == 151858
    assert ids[1:14] == list(b"/data/cat.jpg")
    assert ids[14:-1] == [151859] * (256 - 13)
    assert tok.decode_image_span(ids) == decode_image_path(ids[1:-1]) == "/data/cat.jpg"


def test_path_of_exactly_256_bytes_fits(tok):
    path = "a" * 256
    ids = tok.encode_image_span(path)
    assert IMAGE_PAD_ID not in ids and len(ids) == 258
    assert decode_image_path(ids) == path
    assert tok.decode(ids) == f"<img>{path}</img>"


@pytest.mark.parametrize(
    "path",
    [
        unicodedata.normalize("NFD", "café.png"),  # e + U+0301: 10 bytes, 9 in NFC
        unicodedata.normalize("NFD", "图片/Ångström.jpg"),
        "\u212b.png",  # the angstrom sign: NFC makes it Å (U+00C5)
        "e\u0301" * 86,  # 258 bytes as given, 172 in NFC: it fits
        "../data/images/red_circle.png",
    ],
)
def test_image_paths_are_written_nfc_as_qwen_vl_writes_them(tok, path):
    nfc = unicodedata.normalize("NFC", path)
    assert tok.encode_image_span(path) == qwen_vl_span(tok, path) == span(path)
    query = tok.from_list_format([{"image": path}, {"text": "?"}])
    assert query.images == (nfc,) and str(query) == f"Picture 1: <img>{nfc}</img>\n?"
    ids = tok.encode(query)
    a = ids.index(IMAGE_START_ID)
    assert ids[a : a + IMG_TOKEN_SPAN + 2] == qwen_vl_span(tok, path)
    assert decode_image_path(tok.encode_image_span(path)) == nfc


def test_decode_image_path_accepts_tensors(tok):
    ids = tok.encode_image_span("/x.png")
    assert decode_image_path(torch.tensor(ids)[1:-1]) == "/x.png"
    assert decode_image_path(np.array(ids)) == "/x.png"


# from_list_format


def test_from_list_format_one_image(tok):
    query = tok.from_list_format([{"image": "demo.jpeg"}, {"text": "What is this?"}])
    assert isinstance(query, Query) and isinstance(query, str)
    assert query == "Picture 1: <img>demo.jpeg</img>\nWhat is this?"
    assert query.segments == (("text", "Picture 1: "), ("image", "demo.jpeg"), ("text", "\nWhat is this?"))
    assert query.images == ("demo.jpeg",)


def test_from_list_format_numbers_images(tok):
    query = tok.from_list_format([{"image": "a.jpg"}, {"image": "b.jpg"}, {"text": "compare"}, {"image": "c.jpg"}])
    assert query == ("Picture 1: <img>a.jpg</img>\nPicture 2: <img>b.jpg</img>\ncomparePicture 3: <img>c.jpg</img>\n")
    ids = tok.encode_query(query)
    starts = [k for k, i in enumerate(ids) if i == IMAGE_START_ID]
    assert [decode_image_path(ids[a : a + 258]) for a in starts] == ["a.jpg", "b.jpg", "c.jpg"]
    assert ids[: starts[0]] == tok.encode("Picture 1: ")


def test_from_list_format_box_and_ref(tok):
    query = tok.from_list_format([{"text": "Find"}, {"box": [(10, 20, 300, 400)], "ref": "the dog"}])
    assert query == "Find<ref>the dog</ref><box>(10,20),(300,400)</box>"
    ids = tok.encode_query(query)
    assert ids == [
        *tok.encode("Find"),
        tok.ref_start_id,
        *tok.encode("the dog"),
        tok.ref_end_id,
        tok.box_start_id,
        *tok.encode("(10,20),(300,400)"),
        tok.box_end_id,
    ]
    two = tok.from_list_format([{"box": [(0, 0, 1, 1), (2, 2, 1000, 1000)]}, {"ref": "x"}])
    assert two == "<box>(0,0),(1,1)</box><box>(2,2),(1000,1000)</box><ref>x</ref>"


def test_query_pickles_with_its_segments(tok):
    query = tok.from_list_format([{"image": "a.jpg"}, {"text": "hi"}])
    copy = pickle.loads(pickle.dumps(query))
    assert type(copy) is Query and copy == query and copy.segments == query.segments


# decode


def test_decode_skip_special_tokens(tok):
    query = tok.from_list_format([{"image": "a.jpg"}, {"text": "hi"}, {"ref": "dog"}])
    _, ids = make_context(tok, query)
    assert tok.decode(ids, skip_special_tokens=True) == (
        "system\nYou are a helpful assistant.\nuser\nPicture 1: a.jpg\nhidog\nassistant\n"
    )
    assert tok.decode(ids).startswith("<|im_start|>system\n")


def test_decode_ids_beyond_the_tokenizer(tok):
    hello = tok.encode("Hello")
    ids = [*hello, 151870, MODEL_VOCAB_SIZE + 3, IM_END_ID]
    assert tok.decode(ids) == "Hello<|vocab_pad_151870|><|prompt_table_row_3|><|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "Hello"


def test_decode_span_of_fake_prompt_ids_reads_id_by_id(tok):
    ids = [IMAGE_START_ID, *range(MODEL_VOCAB_SIZE, MODEL_VOCAB_SIZE + 256), IMAGE_END_ID]
    text = tok.decode(ids)
    assert text.startswith("<img><|prompt_table_row_0|><|prompt_table_row_1|>")
    assert text.endswith("<|prompt_table_row_255|></img>")


# token viewer helpers


def test_token_kinds_and_descriptions(tok):
    query = tok.from_list_format([{"image": "/a"}, {"text": "x"}])
    ids = [IM_START_ID, *tok.encode_query(query), 151900, MODEL_VOCAB_SIZE + 3]
    kinds = tok.token_kinds(ids)
    n = len(tok.encode("Picture 1: "))
    assert kinds[0] == "special"
    assert kinds[1 : n + 1] == ["text"] * n
    assert kinds[n + 1] == "image_tag" and kinds[n + 2 : n + 4] == ["image_path_byte"] * 2
    assert kinds[n + 4 : n + 258] == ["imgpad"] * 254 and kinds[n + 258] == "image_tag"
    assert kinds[-2:] == ["vocab_pad", "fake_prompt_id"]
    assert tok.token_kinds([ord("/")]) == ["text"]  # a byte id outside a span is a BPE token
    described = tok.describe_tokens(ids)
    assert described[0] == "<|im_start|> (im_start_id)"
    assert described[1] == 'text "Picture"'
    assert described[n + 1 : n + 3] == ["<img> (image_start_id)", 'path byte 0x2f "/"']
    assert described[n + 4] == "<imgpad> (image_start_id + 2)"
    assert described[n + 258] == "</img> (image_start_id + 1)"
    assert described[-1] == "fake prompt id → prompt_table row 3"
    assert "151900" in described[-2]
    assert tok.describe_token(0xE4, kind="image_path_byte") == "path byte 0xe4"
    assert tok.describe_token(151646 + 57) == "<|extra_57|> (unused)"


# make_context


def test_one_image_context(tok):
    query = tok.from_list_format([{"image": "demo.jpeg"}, {"text": "What is this?"}])
    raw_text, ids = make_context(tok, query)
    assert raw_text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"{query}<|im_end|>\n<|im_start|>assistant\n"
    )
    prefix = [151644, 8948, 198, *SYSTEM_IDS, 151645, 198, 151644, 872, 198]
    assert ids[: len(prefix)] == prefix
    rest = ids[len(prefix) :]
    picture = tok.encode("Picture 1: ")
    assert rest[: len(picture)] == picture
    assert rest[len(picture) : len(picture) + 258] == span("demo.jpeg")
    assert rest[len(picture) + 258 :] == [
        *tok.encode("\nWhat is this?"),
        IM_END_ID,
        NL_ID,
        IM_START_ID,
        ASSISTANT_ID,
        NL_ID,
    ]
    assert tok.encode_query(raw_text) == ids


def test_context_with_history_and_window(tok):
    history = [(f"question {k}", f"answer {k}") for k in range(4)]
    raw_text, ids = make_context(tok, "last", history=history, system="Be brief.")
    assert raw_text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nquestion 0<|im_end|>")
    assert raw_text.endswith("answer 3<|im_end|>\n<|im_start|>user\nlast<|im_end|>\n<|im_start|>assistant\n")
    assert ids == tok.encode_query(raw_text)

    base = make_context(tok, "last", system="Be brief.")[1]
    system_part = base.index(IM_END_ID) + 1  # <|im_start|>system\nBe brief.<|im_end|>
    turn_len = len(make_context(tok, "last", history=history[:1], system="Be brief.")[1]) - len(base)
    assert all(
        len(make_context(tok, "last", history=history[k : k + 1], system="Be brief.")[1]) - len(base) == turn_len
        for k in range(4)
    )
    # turns are kept newest-first while system part + kept turns < max_window_size
    for window, kept in [(system_part + 2 * turn_len + 1, 2), (system_part + 2 * turn_len, 1)]:
        raw, ids = make_context(tok, "last", history=history, system="Be brief.", max_window_size=window)
        assert [f"question {k}" in raw for k in range(4)] == [False] * (4 - kept) + [True] * kept
        assert len(ids) == len(base) + kept * turn_len
    tiny, tiny_ids = make_context(tok, "last", history=history, system="Be brief.", max_window_size=1)
    assert "question" not in tiny and tiny.endswith("user\nlast<|im_end|>\n<|im_start|>assistant\n")
    assert len(tiny_ids) > 1  # the current query is always kept


def test_history_may_hold_queries(tok):
    old = tok.from_list_format([{"image": "old.jpg"}, {"text": "and this?"}])
    raw_text, ids = make_context(tok, "now?", history=[(old, "a cat")])
    assert raw_text.images == ("old.jpg",)
    assert ids.count(IMAGE_START_ID) == 1 and tok.decode(ids) == raw_text


GROUNDING = {"<ref>", "</ref>", "<box>", "</box>", "<quad>", "</quad>"}  # Qwen-VL's IMAGE_ST without its image tags


@pytest.mark.parametrize(
    "answer",
    [
        "<ref>红色的圆形</ref><box>(100,200),(600,900)</box>",
        "两个：<ref>a</ref><box>(1,2),(3,4)</box><box>(5,6),(7,8)</box> and <quad>(1,2),(3,4),(5,6),(7,8)</quad>",
        "<img>secret.png</img> <|im_end|> <imgpad>",  # no image span, no chatml token from an answer's text
        "<ref>\u0338x</ref>",  # NFC makes '>' + U+0338 one character (≯): that </ref> is no tag any more
    ],
)
def test_history_answers_are_encoded_as_qwen_vl_encodes_them(tok, answer):
    # Qwen-VL's make_context encodes an answer with allowed_special=IMAGE_ST (qwen_generation_utils.py); its image
    # tags stay text here, so that no text can create an image span
    raw_text, ids = make_context(tok, "next?", history=[("first?", answer)])
    empty = make_context(tok, "next?", history=[("first?", "")])[1]
    k = empty.index(ASSISTANT_ID) + 2  # after <|im_start|>assistant\n of the history turn
    qwen = tok.encoding.encode(unicodedata.normalize("NFC", answer), allowed_special=GROUNDING, disallowed_special=())
    assert ids == empty[:k] + qwen + empty[k:]
    assert IMAGE_START_ID not in ids and ids.count(IM_END_ID) == empty.count(IM_END_ID)
    assert tok.decode(ids) == raw_text


# properties

TRICKY = st.sampled_from(
    ["<img>", "</img>", "<imgpad>", "<|im_start|>", "<|endoftext|>", "<ref>", "\n", "e\u0301", ">\u0338", " "]
)
TEXT = st.lists(st.one_of(st.text(max_size=12), TRICKY), max_size=6).map("".join)
PATH = st.text(min_size=1, max_size=64).filter(lambda p: len(p.encode("utf-8")) <= IMG_TOKEN_SPAN)
ELEMENT = st.one_of(
    st.builds(lambda p: {"image": p}, PATH),
    st.builds(lambda t: {"text": t}, TEXT),
    st.builds(lambda b, r: {"box": b, "ref": r}, st.lists(st.tuples(*[st.integers(0, 1000)] * 4), max_size=2), TEXT),
)


@settings(max_examples=100, deadline=None)
@given(text=TEXT)
def test_text_round_trip_and_no_special_ids(tok, text):
    ids = tok.encode(text)
    assert all(i < ENDOFTEXT_ID for i in ids)
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)


@settings(max_examples=100, deadline=None)
@given(path=PATH)
def test_image_span_round_trip(tok, path):
    ids = tok.encode_image_span(path)
    path = unicodedata.normalize("NFC", path)  # what the span holds
    assert ids == span(path)
    assert decode_image_path(ids) == path
    assert tok.decode(ids) == f"<img>{path}</img>"
    assert tok.decode(ids, skip_special_tokens=True) == path


@settings(max_examples=60, deadline=None)
@given(elements=st.lists(ELEMENT, max_size=4))
def test_query_round_trip(tok, elements):
    query = tok.from_list_format(elements)
    ids = tok.encode_query(query)
    assert tok.decode(ids) == query
    n_images = sum("image" in e for e in elements)
    assert ids.count(IMAGE_START_ID) == ids.count(IMAGE_END_ID) == n_images
    kinds = tok.token_kinds(ids)
    assert kinds.count("image_tag") == 2 * n_images
    assert kinds.count("image_path_byte") == sum(
        len(unicodedata.normalize("NFC", e["image"]).encode("utf-8")) for e in elements if "image" in e
    )
    raw_text, context = make_context(tok, query)
    assert tok.decode(context) == raw_text


# what the tokenizer refuses, and why

SPAN = [IMAGE_PAD_ID] * 256
REFUSED = [
    ("encode bytes", lambda tok: tok.encode(b"bytes"), TypeError, "str or a Query"),
    ("lone surrogate", lambda tok: tok.encode("lone \ud800 surrogate"), ValueError, "UTF-8"),
    ("encode_query text", lambda tok: tok.encode_query("plain"), TypeError, "encode plain text with encode"),
    ("path of 257 bytes", lambda tok: tok.encode_image_span("a" * 257), ValueError, r"257 UTF-8 bytes.*256 bytes.*shorter path.*symlink"),
    ("path of 257 bytes in NFC", lambda tok: tok.encode_image_span("a" + "e\u0301" * 128), ValueError, r"is 257 UTF-8 bytes.*256 bytes"),
    ("path of 300 bytes", lambda tok: tok.from_list_format([{"image": "图" * 100}]), ValueError, "300 UTF-8 bytes"),
    ("empty path", lambda tok: tok.encode_image_span(""), ValueError, "empty"),
    ("path as bytes", lambda tok: tok.encode_image_span(b"/a.jpg"), TypeError, "str or os.PathLike"),
    ("span without </img>", lambda tok: decode_image_path([IMAGE_START_ID, 97, IMAGE_PAD_ID]), ValueError, "must end with </img>"),
    ("span without <img>", lambda tok: decode_image_path([97, IMAGE_END_ID]), ValueError, "must start with <img>"),
    ("span of 10", lambda tok: decode_image_path([97] * 10), ValueError, "exactly 256 ids.*got 10"),
    ("span of padding", lambda tok: decode_image_path(SPAN), ValueError, "empty image path"),
    ("id 300 in a path", lambda tok: decode_image_path([97, 300, *SPAN[2:]]), ValueError, "id 300 at span position 1 is not a path byte"),
    ("byte after padding", lambda tok: decode_image_path([97, IMAGE_PAD_ID, 98, *SPAN[3:]]), ValueError, "follows <imgpad>"),
    ("not UTF-8", lambda tok: decode_image_path([0xFF, *SPAN[1:]]), ValueError, "not valid UTF-8"),
    ("a string as elements", lambda tok: tok.from_list_format("text"), TypeError, "list of dicts"),
    ("a list element", lambda tok: tok.from_list_format([["image", "a.jpg"]]), TypeError, "element 0 must be a dict"),
    ("unknown key", lambda tok: tok.from_list_format([{"text": "a"}, {"url": "x"}]), ValueError, r"element 1 has keys \['url'\]"),
    ("two keys", lambda tok: tok.from_list_format([{"image": "a.jpg", "text": "b"}]), ValueError, "element 0 has keys"),
    ("keys of mixed types", lambda tok: tok.from_list_format([{"text": "a", 1: "b"}]), ValueError, r"element 0 has keys \['text', 1\]"),
    ("text a number", lambda tok: tok.from_list_format([{"text": 3}]), TypeError, "'text' must be a str"),
    ("ref None", lambda tok: tok.from_list_format([{"ref": None}]), TypeError, "'ref' must be a str"),
    ("one box, no list", lambda tok: tok.from_list_format([{"box": (1, 2, 3, 4)}]), TypeError, "a single box still goes in a list"),
    ("box of 3", lambda tok: tok.from_list_format([{"box": [(1, 2, 3)]}]), TypeError, r"box 0 must be \(x1, y1, x2, y2\)"),
    ("box past 1000", lambda tok: tok.from_list_format([{"box": [(1, 2, 3, 1001)]}]), ValueError, "0–1000 scale, got 1001"),
    ("box of floats", lambda tok: tok.from_list_format([{"box": [(1, 2.5, 3, 4)]}]), TypeError, "must be an int"),
    ("image a number", lambda tok: tok.from_list_format([{"image": 42}]), TypeError, "str or os.PathLike"),
    ("Query of text", lambda tok: Query("Picture 1: <img>a</img>"), TypeError, "not a str"),
    ("Query kind", lambda tok: Query([("html", "x")]), ValueError, "kinds are"),
    ("Query of <img>", lambda tok: Query([("special", "<img>")]), ValueError, "not a special token"),
    ("Query of strings", lambda tok: Query(["text"]), TypeError, r"\(kind, value\) tuple"),
    ("decode -1", lambda tok: tok.decode([5, -1]), ValueError, "must be >= 0, got -1 at position 1"),
    ("decode floats", lambda tok: tok.decode([5.0]), TypeError, "1-D sequence of ints, got float"),
    ("decode 2-D", lambda tok: tok.decode(torch.zeros(2, 2, dtype=torch.long)), TypeError, "1-D sequence of ints, got list"),
    ("decode text", lambda tok: tok.decode("hello"), TypeError, "got str"),
    ("path byte 300", lambda tok: tok.describe_token(300, kind="image_path_byte"), ValueError, "cannot be of kind 'image_path_byte'"),
    ("unknown kind", lambda tok: tok.describe_token(5, kind="word"), ValueError, "kinds are"),
    ("describe two ids", lambda tok: tok.describe_token([1, 2]), TypeError, "takes one id"),
    ("history of one", lambda tok: make_context(tok, "hi", history=[("q",)]), ValueError, r"history\[0\] must be a \(query, response\) pair"),
    ("history of strings", lambda tok: make_context(tok, "hi", history=["qa"]), ValueError, r"history\[0\]"),
    ("history a string", lambda tok: make_context(tok, "hi", history="q"), TypeError, "list of"),
    ("answer a number", lambda tok: make_context(tok, "hi", history=[("q", 3)]), ValueError, r"history\[0\]"),
    ("system None", lambda tok: make_context(tok, "hi", system=None), TypeError, "system must be a str"),
    ("window 0", lambda tok: make_context(tok, "hi", max_window_size=0), ValueError, "positive int"),
    ("no tokenizer", lambda tok: make_context("tok", "hi"), TypeError, "QWenTokenizer"),
    ("query a list", lambda tok: make_context(tok, [{"text": "hi"}]), TypeError, "query must be a str"),
]  # fmt: skip


@pytest.mark.parametrize("call, error, match", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_bad_input_is_refused_with_what_was_wrong(tok, call, error, match):
    with pytest.raises(error, match=match):
        call(tok)
