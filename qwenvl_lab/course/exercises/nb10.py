"""Notebook 10's exercises: the two runtimes' batching — pictures per request, the row a fake id reads, the tables of a
step, the engine's per-token `tasks`, and one call for a batch in run.py's convention.

Answers that depend on the model are checked against the course's engine (`toy.course_engine`), run here again.
"""

import torch

from ...chat import make_prompt
from ...infer import generate_for_qwenvl
from ...limits import BuildConfig
from ...prompt_table import per_request_tables, rows_read, single_table_batch
from ...resources import images_dir
from ...tokenizing import ENDOFTEXT_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE
from . import exercise, int_list, whole_number
from .nb03 import number_hint
from .nb04 import picture_row
from .nb06 import course
from .selfcheck import Question, right, wrong

README_BUILD = BuildConfig(max_batch_size=8, max_prompt_embedding_table_size=2048)  # 10.1: TensorRT-LLM's README
ENGINE_BLOCKS = BuildConfig(max_batch_size=4, max_prompt_embedding_table_size=2048)  # the course engine: 512 rows
INFLIGHT_BUILD = BuildConfig(max_batch_size=8, max_prompt_embedding_table_size=8192)  # exercise 10.3…
STEP_PICTURES = (2, 0, 3)  # …one step's batch: the pictures of each request, in batch order…
ASKED = 2  # …and the request whose block is asked for
PACKED = ((0, 287), (1, 289))  # exercise 10.4: (batch position, prompt ids) of the two packed requests
STEP_BEAMS = ((0, 3), (1, 1))  # exercise 10.5: (batch position, beams) in a generation step
TWO_QUESTIONS = (("yellow_circle.png", "圆形是什么颜色？"), ("red_circle.png", "What color is the circle?"))  # 10.6


@exercise(
    "10.1",
    "TensorRT-LLM's Qwen-VL README builds with --max_prompt_embedding_table_size 2048 --max_batch_size 8: how many "
    "pictures may one request hold under in-flight batching (the C++ executor)?",
)
def check_images_per_request(answer):
    """Each request's block is rows_per_request = 2048 / 8 rows (8: the runtime's max batch size, by default the
    engine's); a picture takes 256 of them."""
    value, expected = whole_number(answer), README_BUILD.rows_per_request // IMG_TOKEN_SPAN
    block = "a request's block, the table over the runtime's max batch size (the engine's max_batch_size by default)"
    known = {
        README_BUILD.max_prompt_embedding_table_size // IMG_TOKEN_SPAN: "that many pictures fill the whole table; the "
        "C++ executor divides it into one block for each position of a step's batch, as many as the runtime's max "
        "batch size (the engine's max_batch_size by default)",
        README_BUILD.rows_per_request: "that is a request's share of rows; how many pictures of 256 rows fit in it?",
        README_BUILD.max_prompt_embedding_table_size: "that is the table's rows; the question asks for pictures",
        ENGINE_BLOCKS.rows_per_request // IMG_TOKEN_SPAN: "that is what a block of the course engine holds (2048 rows "
        "over its max_batch_size 4); the README's engine shares the same 2048 rows among 8 positions",
        0: "then no request could send a picture: compute a request's share of the rows first",
    }
    if value is not None and value not in known and value != expected:
        if value > README_BUILD.max_prompt_embedding_table_size // IMG_TOKEN_SPAN or value < 0:
            return f"{value} pictures: more than the whole table holds (or none at all); count rows, then pictures"
        return f"{value} pictures need {value * IMG_TOKEN_SPAN} rows: does {block} hold that many?"
    return number_hint(answer, expected, known)


@exercise(
    "10.2",
    "In-flight batching, tasks [0, 1], task_vocab_size 512: which table row does the fake id 151940 of request 1 read?",
)
def check_row_of_request_1(answer):
    """Row (id − V) + task · task_vocab_size for id 151940, task 1, task_vocab_size 512."""
    fake_id, task, task_vocab_size = 151940, 1, ENGINE_BLOCKS.rows_per_request
    offset = fake_id - MODEL_VOCAB_SIZE
    row = int(rows_read(torch.tensor([[fake_id]]), torch.tensor([task]), task_vocab_size, MODEL_VOCAB_SIZE))
    return number_hint(
        answer,
        row,
        {
            offset: "that is the row the id reads in request 0's block; request 1's task is 1",
            row + 1: "off by one: the id vocab_size itself reads the first row of the block",
            row - 1: "off by one: the id vocab_size itself reads the first row of the block",
            offset + IMG_TOKEN_SPAN: "task_vocab_size is 512 here (a request's share of rows), not 256",
            fake_id: "a fake id is not a row number itself: subtract vocab_size first",
            fake_id - 151643: "vocab_size is the model's 151936, not 151643",
        },
    )


@exercise(
    "10.3",
    "An engine built with --max_batch_size 8 --max_prompt_embedding_table_size 8192; one step's batch holds 3 "
    "requests with 2, 0 and 3 pictures, in that order. Answer (rows of run.py's Python-session table, the first "
    "row of request 2's block under in-flight batching)",
)
def check_table_rows(answer):
    """The session table holds the batch's pictures; the executor's block is the table size over the max batch size,
    placed by position."""
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return "give two whole numbers as a pair: (rows of the python-session table, first row of request 2's block)"
    session_given, first_given = answer
    if whole_number(session_given) is None or whole_number(first_given) is None:
        return f"give two whole numbers, got {answer!r}"
    length = max(STEP_PICTURES) * (IMG_TOKEN_SPAN + 3) + 6
    batch = torch.tensor([picture_row(n, 5, length) for n in STEP_PICTURES])  # [3, L]
    input_vit = torch.zeros(sum(STEP_PICTURES), IMG_TOKEN_SPAN, 1)  # [N, 256, H]
    session = len(single_table_batch(batch, input_vit, MODEL_VOCAB_SIZE)[1])
    block = INFLIGHT_BUILD.rows_per_request
    _, _, tasks, task_vocab_size = per_request_tables(batch, input_vit, MODEL_VOCAB_SIZE, rows_per_request=block)
    first = int(rows_read(torch.tensor([[MODEL_VOCAB_SIZE]]), tasks[ASKED:], task_vocab_size, MODEL_VOCAB_SIZE))
    table = INFLIGHT_BUILD.max_prompt_embedding_table_size
    fullest = max(STEP_PICTURES) * IMG_TOKEN_SPAN  # rows of the request with the most pictures
    with_pictures = [r for r, n in enumerate(STEP_PICTURES) if n]  # the requests that bring pictures
    among = with_pictures.index(ASKED)  # request 2's place among them
    hint = number_hint(
        session_given,
        session,
        {
            table: "that is the engine's whole buffer; run.py's table holds the batch's pictures and nothing else",
            fullest: "run.py's table holds every picture of the batch, one block of 256 rows each",
            len(STEP_PICTURES) * fullest: "the python session gives no request a block: one table, the batch's "
            "pictures one after another",
        },
    )
    if hint is not None:
        return f"the python-session table: {hint}"
    keeps_position = "the request without pictures keeps its position in the batch"
    hint = number_hint(
        first_given,
        first,
        {
            ASKED * fullest: "the block is not sized by this batch's fullest request: it is "
            "max_prompt_embedding_table_size / max_batch_size, whatever the batch holds",
            among * block: f"{keeps_position}: the executor counts every request of the step",
            among * (table // len(with_pictures)): "the table is shared by max_batch_size positions, not by "
            f"the requests that bring pictures (and {keeps_position})",
            among
            * fullest: f"the block is the table over max_batch_size, not sized by the fullest request, and {keeps_position}",
            IMG_TOKEN_SPAN * sum(STEP_PICTURES[:ASKED]): "that is where request 2's pictures start in run.py's "
            "one table; the executor places tables by the request's position in the step's batch",
            (ASKED + 1) * block: "positions in the batch count from 0",
            ASKED * (table // len(STEP_PICTURES)): "the table is shared by max_batch_size positions, not by the "
            "requests of this step",
            0: "request 2 is not the first of the batch: its block starts further down",
        },
    )
    return None if hint is None else f"the in-flight block: {hint}"


@exercise("10.4", "the engine's tasks input for a packed context step of 287 and 289 prompt ids")
def check_packed_tasks(tasks):
    """The check of exercise 10.4: None when the answer is right, else a hint."""
    tasks = int_list(tasks)
    if tasks is None:
        return "answer with a list of ints"
    expected = [position for position, tokens in PACKED for _ in range(tokens)]
    if tasks == expected:
        return None
    if tasks == [position for position, _ in PACKED]:
        return (
            "that is one task per request, what generate takes; the engine's input has one per token of the "
            "packed batch"
        )
    if len(tasks) != len(expected):
        return f"{len(tasks)} values: the packed batch has {len(expected)} tokens, and tasks one value for each"
    return "each token carries the batch position of the request it belongs to, in the packed order"


@exercise("10.5", "the engine's tasks input for a generation step: position 0 with 3 beams, position 1 greedy")
def check_step_tasks(tasks):
    """The check of exercise 10.5: None when the answer is right, else a hint."""
    tasks = int_list(tasks)
    if tasks is None:
        return "answer with a list of ints"
    expected = [position for position, beams in STEP_BEAMS for _ in range(beams)]
    if tasks == expected:
        return None
    if tasks == [position for position, _ in STEP_BEAMS]:
        return "in a generation step every beam feeds a token of its own"
    return "a generation step feeds one token per beam of each request, in batch order"


def session_call():
    """(output_ids, prompt lengths) of TWO_QUESTIONS asked in one generate_for_qwenvl call the way run.py's Python
    session lays out a batch: one table for both pictures, fake ids counting on from request 0's to request 1's,
    every task 0."""
    runner, vision, tokenizer, _ = course()
    pictures = [[images_dir() / picture] for picture, _ in TWO_QUESTIONS]
    contexts = [torch.tensor(make_prompt(tokenizer, q, p)[1]) for p, (_, q) in zip(pictures, TWO_QUESTIONS)]
    with torch.inference_mode():
        input_vit = vision.encode([p[0] for p in pictures]).to(runner.dtype)  # [2, 256, H]
    batch = torch.nn.utils.rnn.pad_sequence(contexts, batch_first=True, padding_value=ENDOFTEXT_ID)  # [2, L]
    fake_ids, table, _, rows = single_table_batch(batch, input_vit, runner.vocab_size)
    requests = [fake_ids[k, : len(c)] for k, c in enumerate(contexts)]
    return generate_for_qwenvl(runner, requests, 24, table, "0,0", rows), [len(c) for c in contexts]


@exercise(
    "10.6",
    f"output_ids of one generate_for_qwenvl call that asks {TWO_QUESTIONS} (max_new_tokens 24) the way run.py's "
    "Python session lays out a batch",
)
def check_one_call(output_ids):
    """One call in run.py's convention: its output_ids hold request 1's prompt with fake ids counting on from request
    0's, which neither two calls nor one table per request write."""
    if isinstance(output_ids, dict):
        output_ids = output_ids.get("output_ids")
    if isinstance(output_ids, (list, tuple)) and all(isinstance(o, torch.Tensor) for o in output_ids):
        return "that is one result per call; one call returns one output_ids tensor for both requests"
    if not isinstance(output_ids, torch.Tensor):
        return f"give the output_ids tensor that generate_for_qwenvl returns, not a {type(output_ids).__name__}"
    expected, lengths = session_call()
    output_ids = output_ids.cpu()
    if output_ids.shape == expected.shape and torch.equal(output_ids, expected.cpu()):
        return None
    if output_ids.dim() != 3 or output_ids.shape[:2] != expected.shape[:2]:
        return (
            f"output_ids has shape {tuple(output_ids.shape)}; one call for both requests gives [requests, beams, "
            "longest prompt + max_new_tokens]"
        )
    if output_ids.shape[2] != expected.shape[2]:
        return "one call pads every row to the longest prompt + max_new_tokens (24 here): is it one call of both?"
    if all(torch.equal(output_ids[r, 0, lengths[1 - r] :], expected[1 - r, 0, lengths[1 - r] :].cpu()) for r in (0, 1)):
        return "the requests are swapped: keep the order of the questions"
    second = output_ids[1, 0, : lengths[1]]
    fake = second[second >= MODEL_VOCAB_SIZE]  # request 1's fake ids, as its prompt in output_ids holds them
    if len(fake) and int(fake.min()) == MODEL_VOCAB_SIZE:
        return (
            "request 1's prompt in your output_ids numbers its fake ids from vocab_size again: each request was "
            "numbered on its own, as two calls (or one table per request) do. In run.py's Python session one call "
            "numbers them across the batch, request 1's after request 0's, and every task is 0"
        )
    return "each request must read its own picture's rows: one table holding both pictures, fake ids across the batch"


def SELF_CHECK():
    """Notebook 10's self-check: its right options computed by the package."""
    three = (MODEL_VOCAB_SIZE, MODEL_VOCAB_SIZE + IMG_TOKEN_SPAN)
    return (
        Question(
            "Under in-flight batching (the C++ executor), what decides which block of rows a request's fake ids read?",
            (
                wrong(
                    "the number of pictures of the batch's fullest request",
                    "the block size does not depend on the pictures: max_prompt_embedding_table_size (fixed at build) "
                    "/ the runtime's max batch size (the engine's max_batch_size unless ModelRunnerCpp.from_dir("
                    "max_batch_size=…) lowers it)",
                ),
                right(
                    "its position b in this step's batch: its table is copied to row b × the block, and its task is b",
                    "promptTuningBuffers.cpp copies each step's tables again; the position can change from step to step",
                ),
                wrong(
                    "a slot the request keeps for its whole life",
                    "tasks are positions in the step's batch, renumbered every step",
                ),
                wrong(
                    "its fake ids, which start past the previous request's",
                    "every request's fake ids start at `vocab_size`",
                ),
            ),
        ),
        Question(
            "Two requests, one picture each. Which fake id opens request 1's span in each runtime (Python session; "
            "C++ executor)?",
            (
                right(f"{three[1]}; {three[0]}", "one numbering across the batch; every request from `vocab_size`"),
                wrong(f"{three[0]}; {three[0]}", "the Python session numbers the ids across the batch"),
                wrong(
                    f"{three[1]}; {three[1]}", "the executor gives every request its own table: ids from `vocab_size`"
                ),
                wrong("200000; 200000", "article 1's round number fits neither runtime"),
            ),
        ),
        Question(
            "With `remove_input_padding`, what does the engine's `tasks` input hold in a context step?",
            (
                wrong("one task per request", "that is what `generate` takes; the engine's input is packed"),
                right(
                    "one value per token of the packed batch: its request's position in the batch",
                    "the batch manager repeats each request's position over its tokens",
                ),
                wrong("the fake ids of each picture", "the fake ids are in `input_ids`; `tasks` picks their block"),
            ),
        ),
        Question(
            "Two requests ask 图片里是什么？ about two different pictures under in-flight batching. Their `input_ids`…",
            (
                right(
                    "are equal: both number their fake ids from `vocab_size`",
                    "so KV-cache reuse must tell them apart with `input_token_extra_ids`",
                ),
                wrong("differ in their fake ids", "under in-flight batching every request's ids start at `vocab_size`"),
                wrong("differ in their span's path bytes", "the path bytes were replaced by fake ids"),
            ),
        ),
    )
