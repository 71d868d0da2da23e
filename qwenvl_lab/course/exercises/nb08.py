"""Exercises of notebook 08 (troubleshooting): the executor's table row, a tensor-parallel rank's empty table, extra
ids for KV-cache reuse; and its self-check."""

import torch

from ...limits import BuildConfig
from ...modeling import QWenVLConfig
from ...tokenizing import IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE
from . import exercise
from .nb03 import NOT_ATTEMPTED, whole_number
from .selfcheck import Question, right, wrong

V = MODEL_VOCAB_SIZE

# 08.1: (fake id, the request's position in the step's batch, the prompt_vocab_size the request was sent with,
# max_prompt_embedding_table_size, max_batch_size) — the request's own table is often smaller than its block
ROW_CASES = (
    (V, 0, 256, 2048, 8),
    (V + 255, 3, 256, 2048, 8),
    (V + 10, 1, 256, 4096, 8),  # blocks of 512 rows, tables of 256
    (V + 200, 2, 256, 4096, 4),  # blocks of 1024, tables of 256
    (V + 7, 5, 64, 2048, 8),
)
# 08.2: (one rank's hidden size, tp_size, requests, engine dtype)
EMPTY_CASES = ((2048, 2, 1, torch.float16), (1024, 4, 3, torch.bfloat16), (128, 1, 2, torch.float32))


def _call(function, *args):
    """function(*args), or None when it is a stub (returns None or raises NotImplementedError)."""
    try:
        return function(*args)
    except NotImplementedError:
        return None


@exercise("08.1", "the row of the C++ runtime's prompt table a request's fake id reads")
def executor_row(function):
    """function(fake_id, batch_index, prompt_vocab_size, max_prompt_embedding_table_size, max_batch_size) -> row."""
    if not callable(function):
        return "give a function (fake_id, batch_index, prompt_vocab_size, table_size, max_batch_size) -> a row number"
    for fake_id, batch_index, prompt_vocab_size, size, max_batch in ROW_CASES:
        result = _call(function, fake_id, batch_index, prompt_vocab_size, size, max_batch)
        if result is None:
            return NOT_ATTEMPTED
        row = whole_number(result)
        if row is None:
            return f"return the row as an int, got {type(result).__name__}"
        block, offset = size // max_batch, fake_id - V
        if row == batch_index * block + offset:
            continue
        if row == batch_index * prompt_vocab_size + offset:
            return "the C++ runtime ignores the request's prompt_vocab_size: its blocks are as large as the build makes them"
        if row == offset:
            return "that is the row in the request's own table: the runtime copies it to its block in one big table"
        if abs(row - (batch_index * block + offset)) == 1:
            return "off by one: a request's first fake id is vocab_size and reads the first row of its block"
        if row == batch_index * block + fake_id:
            return "a fake id counts from vocab_size: its offset in the request's table is fake_id - vocab_size"
        if row == (batch_index + 1) * block + offset:
            return "positions in the step's batch count from 0: the first request's block starts at row 0"
        return "a block per request of the step's batch, as large as the build allows; the fake id's offset inside it"
    return None


@exercise(
    "08.2", "the prompt table, tasks and task_vocab_size a tensor-parallel rank sends for a request without pictures"
)
def text_only_inputs(function):
    """function(rank_hidden_size, tp_size, requests, dtype) -> (prompt_table [1, hidden × tp], tasks, task_vocab_size)."""
    if not callable(function):
        return "give a function (rank_hidden_size, tp_size, requests, dtype) -> (prompt_table, tasks, task_vocab_size)"
    for rank_hidden, tp_size, requests, dtype in EMPTY_CASES:
        result = _call(function, rank_hidden, tp_size, requests, dtype)
        if result is None:
            return NOT_ATTEMPTED
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            return "return three things: (prompt_table, tasks, task_vocab_size)"
        table, tasks, vocab = result
        if not all(isinstance(t, torch.Tensor) for t in result):
            return "return three torch.Tensors"
        if tuple(table.shape) == (1, rank_hidden) and tp_size > 1:
            return "one rank's hidden size is the model's divided by tp_size: the table must have the model's width"
        if tuple(table.shape) != (1, rank_hidden * tp_size):
            return f"the empty table is one row of the model's hidden size, got shape {tuple(table.shape)}"
        if table.dtype != dtype:
            return f"the table goes to the engine in its dtype ({dtype}), got {table.dtype}"
        if tasks.dtype != torch.int32 or vocab.dtype != torch.int32:
            return "tasks and task_vocab_size are int32 tensors"
        if tuple(tasks.shape) != (requests,) or bool(tasks.any()):
            return "one task per request, all 0"
        if tuple(vocab.shape) != (1,) or int(vocab[0]) != 0:
            return "with no table, task_vocab_size is a one-element tensor holding 0"
    return None


def _extra_ids_cases():
    """(batch_input_ids, pictures) cases: requests with fake ids from V (per request) and each picture's name."""
    text = [151644, 872, 198]  # <|im_start|>user\n

    def request(n):
        ids = list(text)
        for k in range(n):
            ids += [151857, *range(V + k * IMG_TOKEN_SPAN, V + (k + 1) * IMG_TOKEN_SPAN), 151858]
        return ids + [30, 151645]

    return (
        ([request(1), request(1), request(2)], [["red.png"], ["blue.png"], ["red.png", "blue.png"]]),
        ([request(1), request(1)], [["cat.jpg"], ["cat.jpg"]]),
        ([request(2)], [["a.png", "b.png"]]),
        ([request(1), request(1)], [["ab.png"], ["ba.png"]]),  # the same letters: a sum of characters collides
    )


@exercise("08.3", "input_token_extra_ids for KV-cache reuse with prompt tables")
def extra_ids(function):
    """function(batch_input_ids, vocab_size, pictures) -> one list of extra ids per request: 0 for every text id; for a
    picture's fake ids an id > 0, the same wherever the same picture appears, different for different pictures."""
    if not callable(function):
        return "give a function (batch_input_ids, vocab_size, pictures) -> a list of extra ids per request"
    for batch, pictures in _extra_ids_cases():
        result = _call(function, [list(r) for r in batch], V, [list(p) for p in pictures])
        if result is None:
            return NOT_ATTEMPTED
        try:
            result = [[int(x) for x in r] for r in result]
        except (TypeError, ValueError):
            return "return one list of ints per request"
        if [len(r) for r in result] != [len(r) for r in batch]:
            return "give one extra id per input id, for every request"
        given = {}  # picture → the extra id its fake ids carry
        for ids, extras, names in zip(batch, result, pictures):
            for token, extra in zip(ids, extras):
                if token < V and extra != 0:
                    return "text ids keep extra id 0 (only fake ids, >= vocab_size, carry one)"
                if token >= V:
                    if extra <= 0:
                        return "a fake id's extra id must be > 0: 0 is what text ids carry"
                    name = names[(token - V) // IMG_TOKEN_SPAN]
                    given.setdefault(name, set()).add(extra)
        if any(len(extras) > 1 for extras in given.values()):
            return "the same picture must carry the same extra id everywhere, or the cache can never be reused for it"
        firsts = [next(iter(extras)) for extras in given.values()]
        if len(set(firsts)) != len(firsts):
            return "two different pictures share an extra id: the cache would give one the other's keys and values"
    return None


def SELF_CHECK():
    """Notebook 08's self-check: the right options computed from the build limits and the model's config."""
    readme = BuildConfig(max_batch_size=8, max_input_len=2048, max_seq_len=3072, max_prompt_embedding_table_size=2048)
    block, hidden = readme.rows_per_request, QWenVLConfig().hidden_size
    return (
        Question(
            "An engine was built without --max_prompt_embedding_table_size. What does TensorRT-LLM's Python "
            "ModelRunner do with the prompt table you pass?",
            (
                wrong("it raises an error that names the flag", "that is this package's check; TensorRT-LLM is silent"),
                right("it drops it without a word", "_prepare_ptuning returns {} when the table size is 0 (#1300)"),
                wrong("it grows the engine's table to fit", "the table's rows are fixed when the engine is built"),
            ),
        ),
        Question(
            "TensorRT-LLM's README build (2048 rows, max_batch_size 8), the C++ executor: the request at position 1 "
            "of the step's batch has one picture. Which row does its first fake id read?",
            (
                wrong("0", "that is the row in its own table; the runtime copies that table to the request's block"),
                right(str(block), f"position 1 × the block, 2048 / 8 = {block} rows, whatever prompt_vocab_size says"),
                wrong(str(2 * block), "that is the block of the request at position 2: positions count from 0"),
                wrong(str(V), "that is the fake id itself; rows are counted from the table's start"),
            ),
        ),
        Question(
            "A tp_size 2 engine is started with plain `python run.py`. What happens?",
            (
                right(
                    "run.py stops: the engine's world size is 2, the runtime's 1",
                    "its assert; launch one process per rank with mpirun -n 2",
                ),
                wrong("it runs on one GPU, more slowly", "each rank's engine holds only half of every layer"),
                wrong("it starts a second process by itself", "processes are started by mpirun, not by the runtime"),
            ),
        ),
        Question(
            "On 2 GPUs, how wide is the empty prompt table each rank of Qwen-VL-Chat's engine needs for a request "
            "without pictures?",
            (
                wrong(str(hidden // 2), "one rank's share of the hidden size: the bug PR #2470 fixed"),
                right(str(hidden), "the model's full hidden size: every rank takes the table whole"),
                wrong("0", "the engine input still needs one row of the right width"),
            ),
        ),
        Question(
            "KV-cache reuse with prompt tables: two requests show the same picture. What must their extra ids be?",
            (
                wrong("different, one per request", "safe, but then the cache is never reused for that picture"),
                right("the same id above 0 on its fake ids, 0 on text", "TensorRT-LLM's kv-cache-reuse guide"),
                wrong("0 everywhere", "then different pictures with the same fake ids would share cache blocks"),
            ),
        ),
    )
