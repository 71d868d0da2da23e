"""Exercises of notebook 06 (generating text): greedy decoding by hand, output_ids, and the capstone: the whole
pipeline written by the learner.

Answers that depend on the model are checked against the course's engine (`toy.course_engine`), run here again.
"""

import os
from functools import lru_cache

import torch

from ...chat import ModelAsRunner, answer_text, make_prompt
from ...engine import ModelRunner, load_engine_vision_tower
from ...img_pos import locate_img_pos
from ...infer import generate_for_qwenvl
from ...prompt_table import per_request_tables, prompt_tuning_embedding, single_table_batch
from ...resources import images_dir
from ...tokenizing import ENDOFTEXT_ID, IM_END_ID, load_tokenizer
from ...toy import course_engine, load_course_model
from . import exercise, int_list, whole_number
from .selfcheck import Question, right, wrong

NOT_ATTEMPTED = "not attempted yet — the function returns None (or raises NotImplementedError): write its body"
GREEDY_CASES = (  # 06.1 on the course model: (picture, question, steps); the grounding answer holds <ref> and <box>
    ("red_circle.png", "图片里是什么？", 24),
    ("three_shapes.png", "What is in the picture?", 5),
    ("red_circle_blue_square.png", "Where is the red circle?", 40),
)
CAPSTONE_CASES = (  # exercise 06.3: one picture, two pictures in one prompt whose answer needs the second, and a
    (("red_circle.png",), "图片里是什么？"),  # grounding answer of 24 tokens before its <|im_end|>: the cap
    (
        ("pair_b_blue_square_yellow_circle.png", "pair_a_yellow_circle_red_triangle.png"),
        "Which picture has a red triangle?",
    ),
    (("red_circle_blue_square.png",), "Where is the blue square?"),
)
CAPSTONE_TOKENS = 24
ENGINE_INPUTS = "(answer, input_ids, prompt_table, tasks, task_vocab_size)"  # what the capstone returns


@lru_cache(maxsize=1)
def course():
    """The course engine's runner, its vision part, the tokenizer and the eager model (loaded once)."""
    engine_dir = course_engine()
    runner = ModelRunner.from_dir(engine_dir)
    return runner, load_engine_vision_tower(engine_dir), load_tokenizer(engine_dir), load_course_model()


def request(picture: str, question: str):
    """One sample picture's question for the engine: (ids with fake ids [L], prompt table [1, 256, H])."""
    runner, vision, tokenizer, _ = course()
    pictures = [images_dir() / picture]
    _, ids = make_prompt(tokenizer, question, pictures)
    with torch.inference_mode():
        input_vit = vision.encode(pictures)  # [1, 256, H]
    fake_ids, table, _, rows = per_request_tables(torch.tensor(ids)[None], input_vit, runner.vocab_size)
    return fake_ids[0], table.view(1, rows, -1).to(runner.dtype)


def engine_output(picture: str, question: str, max_new_tokens: int, num_beams: int = 1) -> dict:
    """The engine's greedy (or beam) output for a sample picture's question, with the prompt length."""
    runner = course()[0]
    ids, table = request(picture, question)
    out = generate_for_qwenvl(runner, [ids], max_new_tokens, table, num_beams=num_beams, return_dict=True)
    return {**out, "input_len": len(ids)}


def counting_logits(prompt_len: int, stop_after=None):
    """A stand-in model: its next token is the last id + 1, or <|im_end|> once `stop_after` new ids are there."""

    def next_logits(ids):
        ids = int_list(ids)
        best = IM_END_ID if stop_after is not None and len(ids) >= prompt_len + stop_after else ids[-1] + 1
        logits = torch.zeros(IM_END_ID + 1)
        logits[best] = 1.0
        return logits

    return next_logits


def model_logits(picture: str, question: str):
    """(next_logits, prompt) for a sample picture's question on the eager course model."""
    model = course()[3]
    ids, table = request(picture, question)

    def next_logits(so_far):
        with torch.inference_mode():
            return model(
                torch.tensor([int_list(so_far)]),
                prompt_table=table[0],
                tasks=torch.zeros(1, dtype=torch.int32),
                task_vocab_size=table.shape[1],
                logits_to_keep=1,
            ).logits[0, -1]

    return next_logits, ids.tolist()


def course_model_hint(my_greedy) -> str | None:
    """06.1 on the course model: None when my_greedy gives the engine's greedy tokens on every GREEDY_CASES, else a
    hint saying where it parts from them."""
    for picture, question, steps in GREEDY_CASES:
        next_logits, prompt = model_logits(picture, question)
        out = engine_output(picture, question, steps)
        expected = out["output_ids"][0, 0, out["input_len"] : int(out["sequence_lengths"][0, 0])].tolist()
        mine = int_list(my_greedy(next_logits, prompt, steps))
        if mine != expected:
            if mine is not None and len(mine) < len(expected) and expected[: len(mine)] == mine:
                special = [t for t in expected[: len(mine) + 1] if t >= ENDOFTEXT_ID and t != IM_END_ID]
                if special:
                    return (
                        f"on the course model ({picture}, {question!r}) your tokens stop after {len(mine)} of the "
                        f"engine's {len(expected)}: only <|im_end|> ({IM_END_ID}) ends an answer; other special ids "
                        f"such as {special[-1]} (<ref>, <box>, …) are part of it"
                    )
            differ = next((k for k, (a, b) in enumerate(zip(mine or [], expected)) if a != b), None)
            where = (
                f"from step {differ}"
                if differ is not None
                else f"in length ({len(mine or [])} against {len(expected)})"
            )
            return (
                f"on the course model ({picture}, {question!r}, {steps} steps) your tokens differ from the engine's "
                f"greedy tokens {where}; take the highest logit at every step"
            )
    return None


@exercise("06.1", "my_greedy(next_logits, prompt, steps): the first `steps` greedy tokens after `prompt`")
def check_greedy(my_greedy):
    """The check of exercise 06.1: None when the answer is right, else a hint."""
    if not callable(my_greedy):
        return "give your function itself (my_greedy), not its result"
    try:
        first = my_greedy(counting_logits(2), [7, 8], 4)
    except NotImplementedError:
        return NOT_ATTEMPTED
    if first is None:
        return NOT_ATTEMPTED
    first = int_list(first)
    if first is None:
        return "return the new tokens as a list of ints"
    if first[:2] == [7, 8]:
        return "return only the new tokens, not the prompt"
    if first == [9] * 4:  # the first step's token, again and again
        return (
            "every step asked the model about the same ids: each new token must join the ids before the next "
            "step asks for logits"
        )
    if first == [9, 10, 11, 12, 13]:
        return "one step too many: steps=4 asks for 4 new ids and your function gave 5; stop once `steps` ids are there"
    if first in ([9, 10, 11], [9, 10], [9]):
        return f"too few steps: steps=4 asks for 4 new ids and your function gave {len(first)}; count every new id"
    if first != [9, 10, 11, 12]:
        return "on a stand-in model whose next token is always the last id + 1, your tokens are not the ones it prefers"
    stopped = int_list(my_greedy(counting_logits(1, stop_after=2), [5], 6))
    if stopped != [6, 7, IM_END_ID]:
        return (
            f"when <|im_end|> ({IM_END_ID}) is chosen, keep it as the last new token and stop there; "
            f"a stand-in model that ends after two tokens gave {stopped}"
        )
    if int_list(my_greedy(counting_logits(1), [5], 0)) != []:
        return "steps=0 asks for no new token: return an empty list"
    return course_model_hint(my_greedy)


@exercise("06.2", "how many <|im_end|> output_ids[0, 0, input_len:] holds (red_circle.png, 图片里是什么？, 40 new ids)")
def check_end_count(count):
    """The check of exercise 06.2: None when the answer is right, else a hint."""
    if whole_number(count) is None:
        return "answer with an int"
    count = whole_number(count)
    out = engine_output("red_circle.png", "图片里是什么？", 40)
    new = out["output_ids"][0, 0, out["input_len"] :].tolist()
    if count == new.count(IM_END_ID):
        return None
    if count == 1:
        return "one <|im_end|> ends the answer, but the row goes on to max_new_tokens: what fills the rest?"
    return "decode the row after the prompt without skip_special_tokens and count '<|im_end|>' (or count the id 151645)"


class Probe:
    """The course model, as the learner's pipeline sees it: it records the inputs of the first call (through
    `model(…)` or `model.forward(…)`) and counts the calls."""

    def __init__(self, model):
        self.model, self.first_call, self.calls = model, None, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        if self.first_call is None:
            self.first_call = (args, kwargs)
        self.calls += 1
        return self.model(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)


def short_path(picture: str) -> str:
    """A sample picture's path relative to the working directory (a notebook's: ../data/images/…), else absolute."""
    try:
        return os.path.relpath(images_dir() / picture)
    except ValueError:  # another drive (Windows)
        return str(images_dir() / picture)


def capstone_reference(model, tokenizer, pictures, question):
    """The package's answer, prompt embeddings [L, H], img_pos and engine inputs (fake ids [L], table [N·256, H],
    tasks, task_vocab_size) for one capstone case (the Python-session convention)."""
    paths = [images_dir() / p for p in pictures]
    ids = torch.tensor(make_prompt(tokenizer, question, paths)[1])[None]  # [1, L]
    with torch.inference_mode():
        input_vit = model.transformer.visual.encode(paths)  # [N, 256, H]
        fake_ids, table, tasks, rows = single_table_batch(ids, input_vit, model.config.vocab_size)
        embeds = prompt_tuning_embedding(
            fake_ids, model.transformer.wte.weight, table, tasks, rows, model.config.vocab_size
        )
        out = ModelAsRunner(model).generate([fake_ids[0]], prompt_table=table, max_new_tokens=CAPSTONE_TOKENS)
    answer = answer_text(tokenizer, out[0, 0, ids.shape[1] :])
    return answer, embeds[0], locate_img_pos(ids), (fake_ids[0], table, tasks, rows)


def decoding_hint(case: str, calls: int, answer: str, expected: str) -> str | None:
    """The hint for a capstone pipeline whose prompt embeddings are right: None when its greedy loop is too."""
    if calls > CAPSTONE_TOKENS:
        return (
            f"on {case} your function asked the model {calls} times: at most {CAPSTONE_TOKENS} new tokens, one call "
            "each, so stop once that many are there"
        )
    if answer == expected:
        return None
    plain = expected
    for name in load_tokenizer().special_tokens:  # the answer as decode(…, skip_special_tokens=True) writes it
        plain = plain.replace(name, "")
    if answer == plain != expected:
        return (
            f"on {case} your answer lost its special tokens: decode the new ids without skip_special_tokens, since a "
            "grounding answer's <ref>…</ref><box>…</box> is part of the answer"
        )
    if answer and expected.startswith(answer):
        return (
            f"on {case} your answer stops early: this answer needs all {CAPSTONE_TOKENS} new tokens the exercise "
            "allows; stop at <|im_end|> or once that many are there, not before"
        )
    return (
        f"on {case} the prompt's embeddings are right, but the answer differs: at every step take the highest "
        "logit of the last position, append that token's word embedding, and stop at <|im_end|> (not kept)"
    )


def embeddings_hint(case: str, probe: Probe, expected_embeds, img_pos) -> str | None:
    """Where the learner's pipeline first parts from the package's, read from the model's first call (the prompt's
    embeddings must be the package's, bit for bit), or None when they agree."""
    if probe.first_call is None:
        return (
            f"on {case} your function never called the model it was given: call model(inputs_embeds=…) (or "
            "model.forward); model.transformer and lm_head called alone bypass the check"
        )
    args, kwargs = probe.first_call
    embeds = kwargs.get("inputs_embeds")
    if embeds is None or kwargs.get("prompt_table") is not None or args:
        return (
            f"on {case} the model was given ids, not embeddings: the lookup is yours to write; hand its result "
            "to the model as model(inputs_embeds=…)"
        )
    embeds = embeds.detach().reshape(-1, embeds.shape[-1])  # [L, H]
    if embeds.shape != expected_embeds.shape:
        return (
            f"on {case} the first call embeds {embeds.shape[0]} positions, but the prompt has "
            f"{expected_embeds.shape[0]}: the spans keep their length, and the first call reads the whole prompt"
        )
    differ = (embeds != expected_embeds.to(embeds.dtype)).any(dim=-1).nonzero()
    if not len(differ):
        return None
    p = int(differ[0])
    for k, (_, a, b) in enumerate(img_pos.tolist()):
        if p in (a, b):
            return f"on {case} position {p} is a tag of picture {k}: <img> and </img> keep their word embeddings"
        if a < p < b:
            return (
                f"on {case} position {p}, inside picture {k}'s span, does not hold that picture's row {p - a - 1}: "
                "check where the fake ids start, how they go on from one picture to the next, and the row each reads"
            )
    return f"on {case} position {p} holds a text id: ids below vocab_size read their own row of the word embedding"


def as_ids(value) -> list[int] | None:
    """One prompt's ids ([L] or [1, L]: a tensor, an array or nested lists) as a list of ints, else None."""
    try:
        value = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    if value.dim() not in (1, 2) or not value.numel() or value.dtype.is_floating_point or value.dtype == torch.bool:
        return None
    return value.reshape(-1).tolist()


def fake_ids_hint(case: str, ids, expected: torch.Tensor, vocab_size: int) -> str | None:
    """None when the learner's returned ids are the package's ids with fake ids, else a hint; ids without a fake id
    are the shortcut that writes input_vit straight into the word embeddings."""
    mine = as_ids(ids)
    if mine is None:
        return f"on {case} return the prompt's ids, fake ids included, as input_ids: integers, a tensor [1, L]"
    if max(mine) < vocab_size:
        return (
            f"on {case} your input_ids hold no fake id (none is ≥ vocab_size): writing input_vit straight into the "
            "word embeddings at the spans skips the fake ids and the prompt table, and an engine takes ids and a "
            "table, never embeddings: put fake ids in the spans (03) and let your lookup read the table (04)"
        )
    if len(mine) != len(expected):
        return (
            f"on {case} your input_ids hold {len(mine)} ids, the prompt {len(expected)}: return the prompt's ids as "
            "the model first read them, spans included, without the answer's tokens"
        )
    differ = next((p for p, (a, b) in enumerate(zip(mine, expected.tolist())) if a != b), None)
    if differ is not None:
        return (
            f"on {case} your input_ids differ from the package's at position {differ}: return the ids your lookup "
            "read, fake ids numbered on from vocab_size over every picture, between the tags"
        )
    return None


def table_hint(case: str, table, tasks, task_vocab_size, expected) -> str | None:
    """None when the learner's prompt table, tasks and task_vocab_size are ptuning_setup's, else a hint."""
    want_table, want_tasks, want_size = expected
    if not isinstance(table, torch.Tensor):
        return (
            f"on {case} return the prompt table your fake ids read, a tensor [N·256, H], not a "
            f"{type(table).__name__}: writing input_vit straight into the embeddings skips the table an engine reads"
        )
    if table.dim() == 3 and table.shape[0] * table.shape[1] == want_table.shape[0]:
        return f"on {case} your prompt_table is {list(table.shape)}: flatten it to [N·256, H], as ptuning_setup does"
    if table.shape != want_table.shape or not torch.equal(table.detach().to(want_table.dtype), want_table):
        return (
            f"on {case} your prompt_table is not input_vit flattened to [N·256, H], picture after picture: the "
            "table your fake ids read"
        )
    if as_ids(tasks) is None and whole_number(tasks) is not None:
        return (
            f"on {case} tasks is a bare number: give one task a request, a tensor [B] ({list(want_tasks.shape)} "
            "here), as ptuning_setup gives it (04)"
        )
    if as_ids(tasks) != want_tasks.tolist():
        return f"on {case} tasks: one request reads its task's block, task 0, as ptuning_setup gives it (04)"
    if whole_number(task_vocab_size) != int(want_size):
        return f"on {case} task_vocab_size is the rows of one picture's block, as ptuning_setup gives it (04)"
    return None


@exercise(
    "06.3",
    f"the capstone: my_pipeline(model, tokenizer, pictures, question) -> {ENGINE_INPUTS}, the whole pipeline by hand",
)
def check_pipeline(my_pipeline):
    """The learner's pipeline against the package's on one picture and on two pictures in one prompt: its answer,
    the embeddings of its first call, and the fake ids, table and tasks it returns."""
    if not callable(my_pipeline):
        return "give your function itself (my_pipeline), not its result"
    model, tokenizer = course()[3], course()[2]
    for k, (pictures, question) in enumerate(CAPSTONE_CASES):
        case = f"{' + '.join(pictures)} with {question!r}"
        probe = Probe(model)
        try:
            with torch.inference_mode():
                result = my_pipeline(probe, tokenizer, [short_path(p) for p in pictures], question)
        except NotImplementedError:
            return NOT_ATTEMPTED
        if result is None:
            return NOT_ATTEMPTED if k == 0 else f"on {case} your function returned None"
        if not isinstance(result, (tuple, list)) or len(result) != 5:
            got = "only the answer" if isinstance(result, str) else f"a value of type {type(result).__name__}"
            return (
                f"return {ENGINE_INPUTS}, the answer's text with the fake ids, the table, tasks and task_vocab_size "
                f"you built, the inputs an engine takes; your function returned {got}"
            )
        answer, ids, table, tasks, task_vocab_size = result
        if not isinstance(answer, str):
            return f"return the answer's text (a str) first, got {type(answer).__name__}"
        expected, embeds, img_pos, (want_ids, *want_table) = capstone_reference(model, tokenizer, pictures, question)
        hint = (
            embeddings_hint(case, probe, embeds, img_pos)
            or fake_ids_hint(case, ids, want_ids, model.config.vocab_size)
            or table_hint(case, table, tasks, task_vocab_size, want_table)
            or decoding_hint(case, probe.calls, answer, expected)
        )
        if hint is not None:
            return hint
    return None


def SELF_CHECK():
    """Notebook 06's self-check."""
    return (
        Question(
            "`output_ids` is `[batch, beams, input + new]`. Which slice holds request `i`'s answer on beam 0?",
            (
                wrong("`output_ids[0, len(input_ids):]`", "article 2's slice: it indexes beams with the batch size"),
                wrong("`output_ids[i, len(ids_i):]`", "the second index picks the beam, not a position"),
                right("`output_ids[i, 0, len(ids_i):]`", "request i, beam 0, after its own prompt"),
                wrong("`output_ids[i, 0, :]`", "that row starts with the prompt, fake ids included"),
            ),
        ),
        Question(
            "The engine's `max_seq_len` is 704 and a prompt has 287 ids. What does "
            "`generate_for_qwenvl(…, max_new_tokens=1000)` do?",
            (
                wrong("raise an error", "that is what the runner does; `generate_for_qwenvl` is the friendly layer"),
                wrong("generate 1000 new tokens", "prompt and answer together must fit in `max_seq_len`"),
                right(
                    f"generate at most {704 - 287} new tokens, and warn that it clamped `max_new_tokens`",
                    "`max_seq_len` minus the prompt, as run.py clamps to 2048 minus the prompt",
                ),
            ),
        ),
        Question(
            "Four requests go through one `generate_for_qwenvl` call, greedy. Compared with asking one at a time, "
            "their answers are…",
            (
                right(
                    "the same", "each request reads its own rows and its own cache; batching shares the weights' reads"
                ),
                wrong("better: the requests see each other", "no request attends to another's tokens"),
                wrong("different, because short prompts are padded", "the engine keeps each prompt as it is"),
            ),
        ),
    )
