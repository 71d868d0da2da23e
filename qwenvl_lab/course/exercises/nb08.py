"""Exercises of notebook 08 (troubleshooting): the executor's table row, a tensor-parallel rank's empty table, extra
ids for KV-cache reuse run for real on the engine, and two dumps of one answer — which stage diverges first, and why
(`qwenvl-lab diff`); and its self-check."""

import functools
from pathlib import Path

import torch

from ...answer_stages import record_answer, runner_probe
from ...chat import ModelAsRunner, engine_inputs
from ...dump import DumpRecorder, stage
from ...engine import ModelRunner
from ...fake_ids import fake_id_runs
from ...limits import BuildConfig
from ...modeling import QWenVLConfig
from ...resources import images_dir
from ...stage_dumps import model_probe
from ...tokenizing import IM_END_ID, IMG_TOKEN_SPAN, MODEL_VOCAB_SIZE, load_tokenizer
from ...toy import TOY_DIR, load_course_model
from ...vision import CLIP_MEAN, CLIP_STD, preprocess_images
from . import exercise, int_list
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


# 08.3: the calls the check sends through the engine, one batch each, in order: a second picture with the same ids,
# then the first one again beside a third
QUESTION = "What is in the picture?"
BLOCK = 16  # ids a block: the system turn before the picture fills one, shared by every request
CALLS = (("red_circle.png",), ("blue_square.png",), ("red_circle.png", "yellow_circle.png"))


@functools.lru_cache(maxsize=1)
def _lab():
    """(runner with block reuse keyed by ids and extra ids, tokenizer, each call's inputs, the answers without
    reuse): the shipped toy model, built once."""
    model = load_course_model(TOY_DIR)
    build = BuildConfig(max_batch_size=2, max_input_len=320, max_seq_len=352, max_prompt_embedding_table_size=512)
    runner = ModelRunner.from_model(model, build, kv_cache_reuse=True, kv_cache_key="ids", kv_block_size=BLOCK)
    vision, tokenizer = model.transformer.visual, load_tokenizer()
    inputs = [
        engine_inputs(runner, vision, tokenizer, [([images_dir() / name], QUESTION) for name in names])
        for names in CALLS
    ]
    runner.kv_cache_reuse = False
    expected = [_answers(runner, tokenizer, call) for call in inputs]
    runner.kv_cache_reuse = True
    return runner, tokenizer, inputs, expected


def _answers(runner, tokenizer, inputs, extra_ids=None) -> list[str]:
    """Each request's greedy answer (16 new tokens at most)."""
    out = runner.generate(
        **inputs._asdict(),
        max_new_tokens=16,
        end_id=IM_END_ID,
        pad_id=IM_END_ID,
        return_dict=True,
        input_token_extra_ids=extra_ids,
    )
    answers = []
    for r, ids in enumerate(inputs.batch_input_ids):
        new = out["output_ids"][r, 0, len(ids) : int(out["sequence_lengths"][r, 0])].tolist()
        answers.append(tokenizer.decode([i for i in new if i != IM_END_ID]))
    return answers


def _extra_ids_of(function, batch, pictures):
    """The learner's extra ids for requests `batch` (lists of ids) showing `pictures` (names per request), as lists
    of ints; a hint (str); or None for a stub."""
    result = _call(function, [list(r) for r in batch], V, [list(p) for p in pictures])
    if result is None:
        return None
    try:
        rows = [int_list(r) for r in result]
    except TypeError:
        rows = [None]
    if any(r is None for r in rows):
        return "return one list of ints per request"
    if len(rows) != len(batch) or any(len(r) != len(ids) for r, ids in zip(rows, batch)):
        return "give one extra id per input id, for every request"
    if any(x < 0 or x >= 2**64 for r in rows for x in r):
        return "extra ids are unsigned 64-bit ints: 0 and above"
    return rows


def _served_another_picture(name, answer, other, extra):
    """The hint for a request about `name` answered about `other`, its extra ids being `extra`."""
    whose = f", the answer about {other}" if other else ""
    why = (
        " — 0, what text ids carry: a fake id's extra id must be > 0"
        if not any(extra)
        else " — the cache keeps blocks from call to call, so a picture's extra id must tell it from every picture "
        "sent before, not only from those of the same call"
    )
    return (
        f"{name} was answered {answer!r}{whose}: the cache served it another picture's keys and values, because the "
        f"two pictures' fake ids (the same ids) carried the same extra ids{why}"
    )


def _run_on_the_engine(function):
    """The three calls through the engine with the learner's extra ids: (None when every answer is the one without
    reuse and what repeats is reused, else a hint or NOT_ATTEMPTED; each call's (ids, pictures, extra ids))."""
    runner, tokenizer, inputs, expected = _lab()
    runner.kv_pool.clear()
    by_picture = {names[r]: answers[r] for names, answers in zip(CALLS, expected) for r in range(len(names))}
    sent = []
    for call, (names, call_inputs, right_answers) in enumerate(zip(CALLS, inputs, expected)):
        batch, pictures = [ids.tolist() for ids in call_inputs.batch_input_ids], [[name] for name in names]
        extra = _extra_ids_of(function, batch, pictures)
        if extra is None:
            return NOT_ATTEMPTED, sent
        if isinstance(extra, str):
            return extra, sent
        sent.append((batch, pictures, extra))
        got = _answers(runner, tokenizer, call_inputs, extra)
        reused = runner.last_prefill.reused_ids
        for r, (name, answer) in enumerate(zip(names, got)):
            picture_start, picture_end = fake_id_runs(batch[r], V)[0]
            if answer != right_answers[r]:
                other = next((p for p, a in by_picture.items() if a == answer and p != name), None)
                return _served_another_picture(name, answer, other, extra[r][picture_start:picture_end]), sent
            if call == 1 and reused[r] < picture_start // BLOCK * BLOCK:
                return (
                    f"{name}: the text before its picture, the same in every request, was not reused from the call "
                    "before: text ids keep extra id 0, whatever picture follows"
                ), sent
            if call == 2 and name == CALLS[0][0] and reused[r] < picture_end // BLOCK * BLOCK:
                return (
                    f"{name} came back in the third call, but its picture's blocks were not reused: the same picture "
                    "must carry the same extra ids every time it comes (ids that change from call to call or from "
                    "request to request give right answers, and never reuse the picture)"
                ), sent
    return None, sent


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


def _rule_broken(sent) -> str | None:
    """The guide's rule over requests `sent`, (ids, pictures, extra ids) per batch, taken together: 0 for every text
    id; for a picture's fake ids (span k of a request: its k-th picture) an id > 0, the same wherever the same picture
    appears, different for different pictures. A hint, or None."""
    given = {}  # picture → the extra ids its fake ids carry
    spans = {}  # picture → the extra ids along each of its spans
    for batch, pictures, result in sent:
        for ids, extras, names in zip(batch, result, pictures):
            along = {}  # span k of the request → its extra ids in order
            for token, extra in zip(ids, extras):
                if token < V and extra != 0:
                    return "text ids keep extra id 0 (only fake ids, >= vocab_size, carry one)"
                if token >= V:
                    if extra <= 0:
                        return "a fake id's extra id must be > 0: 0 is what text ids carry"
                    given.setdefault(names[(token - V) // IMG_TOKEN_SPAN], set()).add(extra)
                    along.setdefault((token - V) // IMG_TOKEN_SPAN, []).append(extra)
            for k, run in along.items():
                spans.setdefault(names[k], set()).add(tuple(run))
    if any(len(extras) > 1 for extras in given.values()):
        if all(len(runs) == 1 for runs in spans.values()):
            return (
                "the guide's rule gives all the fake ids of a picture one extra id, the picture's (section 6, Fix 1): "
                "yours change along its span"
            )
        return (
            "the same picture must carry the same extra id everywhere (in a request of two pictures, each picture's "
            "span its own), or the cache can never be reused for it"
        )
    firsts = [next(iter(extras)) for extras in given.values()]
    if len(set(firsts)) != len(firsts):
        return "two different pictures share an extra id: the cache would give one the other's keys and values"
    return None


@exercise("08.3", "input_token_extra_ids run for real: the engine's block reuse keyed by ids and extra ids")
def extra_ids(function):
    """function(batch_input_ids, vocab_size, pictures) -> one list of extra ids per request. The check runs three
    calls through the toy engine with block reuse keyed as TensorRT-LLM keys blocks — red, then blue (the same ids),
    then red again beside yellow — and passes when every answer is the one without reuse, the text before the picture
    is reused across pictures and red's picture is reused when it comes back, and the guide's rule holds on those calls
    and, without the engine, on requests of two pictures and pictures whose names look alike."""
    if not callable(function):
        return "give a function (batch_input_ids, vocab_size, pictures) -> a list of extra ids per request"
    hint, sent = _run_on_the_engine(function)
    if hint is not None:
        return hint
    if hint := _rule_broken(sent):
        return hint
    for batch, pictures in _extra_ids_cases():
        result = _extra_ids_of(function, batch, pictures)
        if result is None:
            return NOT_ATTEMPTED
        if isinstance(result, str):
            return result
        if hint := _rule_broken([(batch, pictures, result)]):
            return hint
    return None


# 08.4, 08.5: two dumps of one answer, A from the eager model, B from the engine with one bug in it
MYSTERY_PICTURE = "red_circle_blue_square.png"
MYSTERY_QUESTION = "What is in the picture?"
ANSWER_STAGE = "pixels"
CAUSE_OPTIONS = {
    "a": "the vision tower ran in float16",
    "b": "the pictures were normalised with another mean and standard deviation",
    "c": "the pictures were resized with another interpolation",
    "d": "the fake ids start at 151643",
    "e": "run.py's sampling settings",
}
ANSWER_CAUSE = "b"
OTHER_MEAN, OTHER_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # torchvision's ImageNet statistics


def _other_normalisation(pictures, image_size: int) -> torch.Tensor:
    """Pictures resized as Qwen-VL resizes them, then normalised with other statistics than CLIP's."""
    clip = preprocess_images(pictures, image_size)  # [N, 3, S, S]
    unit = clip * torch.tensor(CLIP_STD).view(3, 1, 1) + torch.tensor(CLIP_MEAN).view(3, 1, 1)  # back to 0…1
    return (unit - torch.tensor(OTHER_MEAN).view(3, 1, 1)) / torch.tensor(OTHER_STD).view(3, 1, 1)


def mystery_dumps(folder) -> tuple[Path, Path]:
    """(A, B), two dumps of the toy model's answer to one question about one picture, written in `folder`: A from the
    package's eager model, B from its engine with one bug in it. Which stage, and why, is the exercise."""
    folder = Path(folder)
    model, tokenizer = load_course_model(TOY_DIR), load_tokenizer(TOY_DIR)
    picture = [images_dir() / MYSTERY_PICTURE]
    depths = {"vision_layers": str(model.config.visual["layers"]), "lm_layers": str(model.config.num_hidden_layers)}
    a = DumpRecorder("qwenvl-lab eager model", "float32", notes=dict(depths))
    record_answer(
        a, ModelAsRunner(model), model.transformer.visual, tokenizer, picture, MYSTERY_QUESTION, model_probe(model)
    )
    build = BuildConfig(max_batch_size=1, max_input_len=512, max_seq_len=560, max_prompt_embedding_table_size=256)
    runner = ModelRunner.from_model(model, build)
    b = DumpRecorder("qwenvl-lab engine", "float32", notes=dict(depths))
    record_answer(
        b,
        runner,
        model.transformer.visual,
        tokenizer,
        picture,
        MYSTERY_QUESTION,
        runner_probe(runner),
        preprocess=_other_normalisation,
    )
    return (
        a.save(folder / "which-stage-A.safetensors", overwrite=True),
        b.save(folder / "which-stage-B.safetensors", overwrite=True),
    )


LATER = "later in the pipeline: the first row the diff marks 'diverges' comes before it"


@exercise("08.4", "the first stage that diverges between the two dumps of mystery_dumps")
def first_stage(answer):
    """answer: a stage's name, as the dump and the diff's table name it."""
    if not isinstance(answer, str):
        return f"give the stage's name as a string, e.g. 'logits', got {type(answer).__name__}"
    name = answer.strip()
    if name == ANSWER_STAGE:
        return None
    if name.lower() in ("preprocessing", "vision", "table", "decoding", "layers", "embeddings", "prompt"):
        return "that is a step of the pipeline: give the stage's name as the dump holds it (the diff's first column)"
    try:
        spec = stage(name)
    except ValueError:
        return "give one of the dump's stage names: pixels, input_vit, prompt_ids, …, logits, output_ids"
    if name == "input_vit":
        return (
            "input_vit differs too, but the diff marks it 'carried': the tower computes it from what it is given; "
            "does an earlier row diverge?"
        )
    if spec.ids:
        return f"{name} is the same in both dumps (ids are compared exactly)"
    return LATER


@exercise("08.5", "why the first stage diverges: one of CAUSE_OPTIONS (a letter)")
def why(answer):
    """answer: the letter of the cause in CAUSE_OPTIONS."""
    if not isinstance(answer, str) or answer.strip().lower().strip("()") not in CAUSE_OPTIONS:
        return f"answer with one letter: {', '.join(CAUSE_OPTIONS)}"
    letter = answer.strip().lower().strip("()")
    return {
        "a": "a float16 tower would change input_vit, but the pixels it reads already differ",
        "b": None,
        "c": "another resize changes neighbouring pixels unevenly; fit B = α·A + β channel by channel and look at "
        "what is left over",
        "d": "fake ids are in input_ids, which agree in both dumps",
        "e": "sampling changes the generated ids; here the pixels differ, long before any id is drawn",
    }[letter]


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
