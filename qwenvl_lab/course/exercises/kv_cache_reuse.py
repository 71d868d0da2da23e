"""Exercise of the KV-cache reuse section (notebook 08): input_token_extra_ids, run for real on the engine with block
reuse keyed by ids and extra ids, as TensorRT-LLM keys them."""

import functools

from ...chat import engine_inputs
from ...engine import BuildConfig, ModelRunner
from ...fake_ids import fake_id_runs
from ...resources import images_dir
from ...tokenizing import IM_END_ID, load_tokenizer
from ...toy import TOY_DIR, load_course_model
from . import exercise, int_list
from .nb03 import NOT_ATTEMPTED

QUESTION = "What is in the picture?"
BLOCK = 16  # ids a block: the system turn before the picture fills one, shared by every request
# the calls the check makes, one batch each, in order: a second picture with the same ids, then the first one again
CALLS = (("red_circle.png",), ("blue_square.png",), ("red_circle.png", "yellow_circle.png"))


@functools.lru_cache(maxsize=1)
def _lab():
    """(runner with block reuse keyed by ids and extra ids, vision tower, tokenizer, each call's inputs and the
    answers without reuse): the shipped toy model, built once."""
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


def _extra_ids_of(function, inputs, names, vocab_size):
    """The learner's extra ids for one call, as lists of ints, or a hint (str), or None for a stub."""
    batch = [ids.tolist() for ids in inputs.batch_input_ids]
    result = function([list(r) for r in batch], vocab_size, [[name] for name in names])
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


@exercise("08.9", "input_token_extra_ids run for real: the engine's block reuse keyed by ids and extra ids")
def extra_ids_for_real(function):
    """function(batch_input_ids, vocab_size, pictures) -> one list of extra ids per request; the check runs three
    calls through the toy engine with block reuse keyed as TensorRT-LLM keys blocks: red, then blue (the same ids),
    then red again beside yellow. Right: every answer is the one without reuse, the text before the picture is
    reused across pictures, and red's picture is reused when it comes back."""
    if not callable(function):
        return "give a function (batch_input_ids, vocab_size, pictures) -> a list of extra ids per request"
    runner, tokenizer, inputs, expected = _lab()
    runner.kv_pool.clear()
    by_picture = {names[r]: answers[r] for names, answers in zip(CALLS, expected) for r in range(len(names))}
    for call, (names, call_inputs, right) in enumerate(zip(CALLS, inputs, expected)):
        extra = _extra_ids_of(function, call_inputs, names, runner.vocab_size)
        if extra is None:
            return NOT_ATTEMPTED
        if isinstance(extra, str):
            return extra
        got = _answers(runner, tokenizer, call_inputs, extra)
        reused = runner.last_prefill.reused_ids
        for r, (name, answer) in enumerate(zip(names, got)):
            if answer != right[r]:
                other = next((p for p, a in by_picture.items() if a == answer and p != name), None)
                whose = f", the answer about {other}" if other else ""
                return (
                    f"{name} was answered {answer!r}{whose}: the cache served it another picture's keys and values, "
                    "because the two pictures' fake ids (the same ids) carried the same extra ids"
                )
            picture_start, picture_end = fake_id_runs(call_inputs.batch_input_ids[r], runner.vocab_size)[0]
            text_blocks = picture_start // BLOCK * BLOCK
            if call == 1 and reused[r] < text_blocks:
                return (
                    f"{name}: the text before its picture, the same in every request, was not reused from the call "
                    "before: text ids keep extra id 0, whatever picture follows"
                )
            if call == 2 and name == CALLS[0][0] and reused[r] < picture_end // BLOCK * BLOCK:
                return (
                    f"{name} came back in the third call, but its picture's blocks were not reused: the same picture "
                    "must carry the same extra ids every time it comes (ids that change from call to call or from "
                    "request to request give right answers, and never reuse the picture)"
                )
    return None
