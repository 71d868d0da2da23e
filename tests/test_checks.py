"""The validation boundary: one table of bad inputs to the step functions (notebooks 02–04), each refused with the
exception type and the words that say what was wrong; and what the checks accept."""

import numpy as np
import pytest
import torch

from qwenvl_lab.checks.tensors import as_batch, as_id_list, dtype_name, one_int, parse_tasks, to_torch_dtype
from qwenvl_lab.checks.values import check_choice, check_int, check_number
from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.prompt_table import per_request_tables, prompt_tuning_embedding, ptuning_setup, single_table_batch
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, MODEL_VOCAB_SIZE

V = MODEL_VOCAB_SIZE


def span(length: int = 256) -> list[int]:
    return [IMAGE_START_ID, *[IMAGE_PAD_ID] * length, IMAGE_END_ID]


ONE_SPAN = torch.tensor([[*span(), 1, 2]])  # [1, 260]
FAKE = make_fake_prompt_ids(V, 1)  # [1, 256]


def nan_at(shape, index, value=float("nan")):
    t = torch.zeros(shape)
    t[index] = value
    return t


def lookup(ids=((10,),), vocab=None, table=None, tasks=(0,), tvs=4, vocab_size=10):
    vocab = torch.zeros(10, 4) if vocab is None else vocab
    table = torch.zeros(8, 4) if table is None else table
    return prompt_tuning_embedding([list(r) for r in ids], vocab, table, list(tasks), tvs, vocab_size)


REFUSED = [
    # locate_img_pos: the span rule
    (
        "unclosed",
        lambda: locate_img_pos([[1, IMAGE_START_ID, *[IMAGE_PAD_ID] * 256, 2]]),
        ValueError,
        "1 <img> .* but 0 </img>",
    ),
    (
        "unopened",
        lambda: locate_img_pos([[1, *[IMAGE_PAD_ID] * 256, IMAGE_END_ID]]),
        ValueError,
        "0 <img> .* but 1 </img>",
    ),
    ("closed twice", lambda: locate_img_pos([[*span(), IMAGE_END_ID]]), ValueError, "1 <img> .* but 2 </img>"),
    (
        "close first",
        lambda: locate_img_pos([[IMAGE_END_ID, *[2] * 256, IMAGE_START_ID]]),
        ValueError,
        "unbalanced or nested",
    ),
    (
        "nested",
        lambda: locate_img_pos([[IMAGE_START_ID, 1, IMAGE_START_ID, *[2] * 256, IMAGE_END_ID, 3, IMAGE_END_ID]]),
        ValueError,
        "unbalanced or nested",
    ),
    ("short span", lambda: locate_img_pos([span(255)]), ValueError, "holds 255 ids.*exactly 256"),
    ("second span long", lambda: locate_img_pos([[*span(), *span(257)]]), ValueError, "holds 257 ids"),
    (
        "tags split over rows",
        lambda: locate_img_pos([[1, IMAGE_START_ID, *[2] * 257], [*[2] * 257, IMAGE_END_ID, 3]]),
        ValueError,
        "row 0: 1 <img>",
    ),
    ("names the row", lambda: locate_img_pos([[*span(), 1, 1], span(258)]), ValueError, "row 1: .*holds 258 ids"),
    (
        "ids a string",
        lambda: locate_img_pos("abc"),
        TypeError,
        r"input_ids must be a torch tensor, a numpy array or a \(nested\) list of ints, got str",
    ),
    ("ids None", lambda: locate_img_pos(None), TypeError, "got NoneType"),
    (
        "ragged rows",
        lambda: locate_img_pos([[1, 2], [3]]),
        ValueError,
        "rows of input_ids have different lengths: pad them",
    ),
    (
        "past int64",
        lambda: locate_img_pos([1, 2**64]),
        ValueError,
        "input_ids hold 18446744073709551616, outside int64",
    ),
    (
        "uint64 past int64",
        lambda: locate_img_pos(np.array([2**63], dtype=np.uint64)),
        ValueError,
        "past the largest int64",
    ),
    ("ids strings", lambda: locate_img_pos(["a", "b"]), TypeError, "input_ids must hold integers, got numpy dtype <U1"),
    ("ids floats", lambda: locate_img_pos([[1.0, 2.0]]), TypeError, "must hold integers, got numpy dtype float64"),
    ("ids complex", lambda: locate_img_pos(torch.zeros(2, dtype=torch.complex64)), TypeError, "must hold integers"),
    ("ids 3-D", lambda: locate_img_pos(torch.ones(1, 2, 3, dtype=torch.long)), ValueError, r"\[L\] or \[B, L\]"),
    (
        "start id a string",
        lambda: locate_img_pos([1, 2], image_start_id="151857"),
        TypeError,
        "image_start_id must be an int, got str",
    ),
    (
        "start id at int64's end",
        lambda: locate_img_pos([1, 2], image_start_id=2**63 - 1),
        ValueError,
        "image_start_id must be an int in",
    ),
    ("span a float", lambda: locate_img_pos([1, 2], span=256.0), TypeError, "span must be an int, got float"),
    # make_fake_prompt_ids and replace_image_spans
    ("vocab_size 0", lambda: make_fake_prompt_ids(0, 1), ValueError, "vocab_size must be an int >= 1, got 0"),
    ("images -1", lambda: make_fake_prompt_ids(10, -1), ValueError, "num_images must be an int >= 0"),
    ("span 0", lambda: make_fake_prompt_ids(10, 1, 0), ValueError, "tokens_per_image must be an int >= 1"),
    (
        "vocab_size a string",
        lambda: make_fake_prompt_ids("10", 1),
        TypeError,
        "vocab_size must be an int, got str '10'",
    ),
    ("vocab_size True", lambda: make_fake_prompt_ids(True, 1), TypeError, "vocab_size must be an int, got bool"),
    ("past int64 ids", lambda: make_fake_prompt_ids(2**63 - 10, 1), ValueError, "pass the largest int64 id"),
    (
        "two rows, one span",
        lambda: replace_image_spans(ONE_SPAN, [[0, 0, 257]], make_fake_prompt_ids(V, 2)),
        ValueError,
        "1 image spans in img_pos but 2 rows",
    ),
    (
        "rows of 128",
        lambda: replace_image_spans(ONE_SPAN, [[0, 0, 257]], make_fake_prompt_ids(V, 1, 128)),
        ValueError,
        "holds 256 ids but its fake ids are 128",
    ),
    (
        "no row 1",
        lambda: replace_image_spans(ONE_SPAN, [[1, 0, 257]], FAKE),
        ValueError,
        r"img_pos \(1, 0, 257\) lies outside input_ids of shape \(1, 260\)",
    ),
    (
        "negative start",
        lambda: replace_image_spans(ONE_SPAN, [[0, -2, 255]], FAKE),
        ValueError,
        r"img_pos \(0, -2, 255\) lies outside",
    ),
    (
        "end past the row",
        lambda: replace_image_spans(ONE_SPAN, [[0, 3, 260]], FAKE),
        ValueError,
        r"img_pos \(0, 3, 260\) lies outside",
    ),
    (
        "overlapping spans",
        lambda: replace_image_spans(
            torch.zeros(1, 300, dtype=torch.long), [[0, 0, 257], [0, 2, 259]], make_fake_prompt_ids(V, 2)
        ),
        ValueError,
        r"image 1: span 2…259 in row 0 overlaps the span before it",
    ),
    (
        "img_pos of 4",
        lambda: replace_image_spans(ONE_SPAN, [[0, 0, 257, 1]], FAKE),
        ValueError,
        r"img_pos must be \[N, 3\]",
    ),
    (
        "img_pos a string",
        lambda: replace_image_spans(ONE_SPAN, "0,0,257", FAKE),
        TypeError,
        "img_pos must be a torch tensor",
    ),
    (
        "fake ids float",
        lambda: replace_image_spans(ONE_SPAN, [[0, 0, 257]], FAKE.float()),
        TypeError,
        "fake_prompt_id must hold integers, got dtype torch.float32",
    ),
    (
        "fake ids 1-D",
        lambda: replace_image_spans(ONE_SPAN, [[0, 0, 257]], FAKE[0]),
        ValueError,
        r"fake_prompt_id must be \[N, span\] \(one row per image\) or a list",
    ),
    # ptuning_setup
    (
        "hidden 8 vs 16",
        lambda: ptuning_setup(torch.zeros(1, 256, 8), "float16", 16),
        ValueError,
        "hidden size 8 != model hidden_size 16",
    ),
    (
        "table 2-D",
        lambda: ptuning_setup(torch.zeros(256, 8), "float16", 8),
        ValueError,
        r"input_vit must be \[N, rows, H\].* got shape \(256, 8\)",
    ),
    (
        "table a list",
        lambda: ptuning_setup([[[0.0] * 4] * 256], "float32", 4),
        TypeError,
        r"picture 0's features must be a torch.Tensor \[rows, H\], got list",
    ),
    (
        "integer features",
        lambda: ptuning_setup(torch.zeros(1, 256, 4, dtype=torch.long), "float32", 4),
        TypeError,
        "input_vit must hold floating-point features",
    ),
    (
        "dtype a list",
        lambda: ptuning_setup(torch.zeros(1, 256, 4), ["float32"], 4),
        TypeError,
        r"dtype must be one of .* got list",
    ),
    ("dtype fp16", lambda: ptuning_setup(torch.zeros(1, 256, 4), "fp16", 4), ValueError, "unknown dtype 'fp16'"),
    (
        "hidden a string",
        lambda: ptuning_setup(torch.zeros(1, 256, 4), "float32", "4"),
        TypeError,
        "hidden_size must be an int, got str",
    ),
    (
        "hidden True",
        lambda: ptuning_setup(torch.zeros(1, 256, 4), "float32", True),
        TypeError,
        "hidden_size must be an int, got bool",
    ),
    (
        "NaN feature",
        lambda: ptuning_setup(nan_at((3, 8, 4), (1, 5, 2)), "float32", 4),
        ValueError,
        r"input_vit image 1 \(its query 5, feature 2\) holds NaN or infinite",
    ),
    (
        "inf feature",
        lambda: ptuning_setup(nan_at((3, 8, 4), (2, 0, 1), float("-inf")), "float32", 4),
        ValueError,
        "input_vit image 2 ",
    ),
    (
        "past float16",
        lambda: ptuning_setup(nan_at((2, 8, 4), (1, 3, 0), 1e5), "float16", 4),
        ValueError,
        "input_vit image 1 holds 100000 at query 3, feature 0, which torch.float16 cannot hold",
    ),
    (
        "one task, two requests",
        lambda: ptuning_setup(None, "float32", 4, tasks="0", input_ids=torch.zeros(2, 3).long()),
        ValueError,
        "1 tasks for 2 requests",
    ),
    (
        "tasks 0;1",
        lambda: ptuning_setup(None, "float32", 4, tasks="0;1", input_ids=torch.zeros(2, 3).long()),
        ValueError,
        "comma-separated list of integers",
    ),
    (
        "tasks 0,,1",
        lambda: ptuning_setup(None, "float32", 4, tasks="0,,1", input_ids=torch.zeros(2, 3).long()),
        ValueError,
        "comma-separated list of integers",
    ),
    (
        "negative task",
        lambda: ptuning_setup(None, "float32", 4, tasks="0,-1", input_ids=torch.zeros(2, 3).long()),
        ValueError,
        r"tasks must be in \[0, 2147483647\]",
    ),
    (
        "task past int32",
        lambda: ptuning_setup(None, "float32", 4, tasks="99999999999"),
        ValueError,
        "TensorRT-LLM keeps them as int32",
    ),
    (
        "tasks floats",
        lambda: ptuning_setup(None, "float32", 4, tasks=[0.5, 1.0], input_ids=torch.zeros(2, 3).long()),
        TypeError,
        "tasks must hold integers",
    ),
    # prompt_tuning_embedding: TensorRT-LLM's lookup
    (
        "row past the table",
        lambda: lookup([[1, 10 + 256]], table=torch.zeros(512, 4), tasks=[1], tvs=256),
        ValueError,
        r"request 0: id 266 at position 1 reads prompt-table row 512, but the table has 512 rows",
    ),
    (
        "id past the table",
        lambda: lookup([[10 + 600]], table=torch.zeros(512, 4), tvs=256),
        ValueError,
        "reads prompt-table row 600, but the table has 512 rows",
    ),
    (
        "rows past int64",
        lambda: lookup([[2**63 - 1]]),
        ValueError,
        "reads prompt-table row 9223372036854775797, but the table has 8 rows",
    ),
    ("task past int32", lambda: lookup(tasks=[2**62]), ValueError, "TensorRT-LLM keeps them as int32"),
    (
        "NaN row read",
        lambda: lookup([[1, 10, 14]], table=nan_at((6, 4), (4, 1)), tvs=6),
        ValueError,
        r"request 0: prompt-table row 4 \(read by id 14 at position 2\) holds NaN or infinite",
    ),
    (
        "-inf row, task 1",
        lambda: lookup([[1, 1], [11, 1]], table=nan_at((6, 4), (4, 1), -float("inf")), tasks=[0, 1], tvs=3),
        ValueError,
        r"request 1: prompt-table row 4 \(read by id 11 at position 0\)",
    ),
    (
        "dtypes differ",
        lambda: lookup(vocab=torch.zeros(10, 4).half()),
        TypeError,
        r"prompt_table is torch.float32 but the model runs in torch.float16.*ptuning_setup",
    ),
    (
        "table 8 wide",
        lambda: lookup(table=torch.zeros(8, 8)),
        ValueError,
        r"prompt_table must be \[rows, 4\].*got \(8, 8\)",
    ),
    ("table 3-D", lambda: lookup(table=torch.zeros(1, 8, 4)), ValueError, r"prompt_table must be \[rows, 4\]"),
    ("one task, two rows", lambda: lookup([[1], [2]]), ValueError, "1 tasks for 2 requests"),
    (
        "negative id",
        lambda: lookup([[1], [-3]], tasks=[0, 0]),
        ValueError,
        r"request 1: token ids must be non-negative, got -3 at position 0",
    ),
    ("negative task", lambda: lookup(tasks=[-1]), ValueError, r"tasks must be in \[0, 2147483647\]"),
    ("vocab_size past the embedding", lambda: lookup(vocab_size=20), ValueError, "vocab_size 20 exceeds the 10 rows"),
    ("negative task_vocab_size", lambda: lookup(tvs=-1), ValueError, "task_vocab_size must be an int in"),
    (
        "task_vocab_size tensor -3",
        lambda: lookup(tvs=torch.tensor([-3], dtype=torch.int32)),
        ValueError,
        "task_vocab_size must be an int in",
    ),
    ("task_vocab_size 2.5", lambda: lookup(tvs=2.5), TypeError, "task_vocab_size must be an int, got float"),
    (
        "task_vocab_size float tensor",
        lambda: lookup(tvs=torch.tensor([4.0])),
        TypeError,
        "task_vocab_size must hold integers",
    ),
    (
        "task_vocab_size empty",
        lambda: lookup(tvs=torch.tensor([], dtype=torch.int32)),
        ValueError,
        "task_vocab_size must be one int, got 0 values",
    ),
    (
        "task_vocab_size two",
        lambda: lookup(tvs=torch.tensor([4, 8])),
        ValueError,
        "task_vocab_size must be one int, got 2 values",
    ),
    ("tasks floats", lambda: lookup(tasks=[0.5]), TypeError, "tasks must hold integers"),
    (
        "table a list",
        lambda: lookup(table=[[0.0] * 4] * 8),
        TypeError,
        "prompt_table must be a floating-point torch.Tensor .*got list",
    ),
    (
        "integer embeddings",
        lambda: lookup(vocab=torch.zeros(10, 4, dtype=torch.long)),
        TypeError,
        "vocab_embedding must be a floating-point torch.Tensor, got torch.int64",
    ),
    ("vocab_size a string", lambda: lookup(vocab_size="10"), TypeError, "vocab_size must be an int, got str"),
    # the two batching conventions
    (
        "two features, one span",
        lambda: single_table_batch(ONE_SPAN, torch.zeros(2, 256, 4), V),
        ValueError,
        "the ids hold 1 image spans but the features are for 2 pictures",
    ),
    (
        "features 2-D",
        lambda: per_request_tables(ONE_SPAN, torch.zeros(256, 4), V),
        ValueError,
        r"input_vit must be \[N, rows, H\], one block .* got shape \(256, 4\)",
    ),
    (
        "rows and spans differ",
        lambda: single_table_batch(ONE_SPAN, torch.zeros(1, 64, 4), V),
        ValueError,
        "image span 0 holds 256 ids but its picture's features have 64 rows",
    ),
    (
        "features a list",
        lambda: single_table_batch(ONE_SPAN, [[0.0]], V),
        TypeError,
        r"picture 0's features must be a torch.Tensor \[rows, H\], got list",
    ),
    (
        "two pictures, one slot",
        lambda: per_request_tables(torch.tensor([[*span(), *span()]]), torch.zeros(2, 256, 4), V, 2048 // 8),
        ValueError,
        "a request's pictures need 512 table rows, but each request may hold only .* = 256 rows",
    ),
]


@pytest.mark.parametrize("call, error, match", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_bad_input_is_refused_with_what_was_wrong(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_the_checks_take_what_run_py_and_numpy_hand_over():
    assert as_batch([1, 2, 3]).shape == (1, 3) and as_batch([]).shape == (1, 0)
    assert as_batch(np.array([[1, 2]], dtype=np.uint8)).dtype == torch.int64
    assert [t.tolist() for t in as_id_list(torch.tensor([[1, 2], [3, 4]]))] == [[1, 2], [3, 4]]  # rows of a [B, L]
    assert one_int(torch.tensor([256], dtype=torch.int32), "task_vocab_size") == 256  # run.py's tensor [1]
    assert one_int(np.int64(3), "n") == 3
    assert parse_tasks("0, 1", 2) == [0, 1] == parse_tasks(torch.tensor([0, 1], dtype=torch.int32), 2)
    assert parse_tasks(0, 1) == [0] and parse_tasks("3,1,2", None) == [3, 1, 2]
    assert to_torch_dtype("bfloat16") is torch.bfloat16 and dtype_name(torch.float16) == "float16"
    assert check_int("n", np.int32(5), 1) == 5 and check_number("p", 1, 0, 1) == 1
    assert check_choice("early_stopping", "never", (True, False, "never")) == "never"


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: check_int("n", 1.0), TypeError, "n must be an int, got float"),
        (lambda: check_int("n", 0, 1, 3), ValueError, r"n must be an int in \[1, 3\], got 0"),
        (lambda: check_number("t", True, 0), TypeError, "t must be a number, got bool"),
        (lambda: check_number("t", 0, 0, open_minimum=True), ValueError, "t must be a finite number > 0"),
        (lambda: check_number("p", float("nan")), ValueError, "p must be a finite number"),
        (lambda: check_choice("early_stopping", 1, (True, False, "never")), ValueError, "must be one of True, False"),
        (lambda: as_id_list([]), ValueError, "non-empty list of 1-D token-id tensors"),
        (lambda: as_id_list([torch.tensor([[1]])]), ValueError, "request 0: expected a non-empty 1-D tensor"),
        (lambda: as_id_list([[1], [1.5]]), TypeError, "request 1 must hold integers"),
        (lambda: dtype_name("fp16"), ValueError, "dtype must be one of"),
    ],
)
def test_the_value_checks_say_what_they_take(call, error, match):
    with pytest.raises(error, match=match):
        call()
