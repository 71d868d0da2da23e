"""Notebook 06's exercise checks: right answers written in several ways pass, untouched stubs are 'not attempted yet',
and the plausible wrong answers get a hint that does not give the answer away. The right answers here come from the
eager model (`ModelAsRunner`); the checks use the course's engine."""

import pytest
import torch
import torch.nn.functional as F

from qwenvl_lab import make_context
from qwenvl_lab.chat import ModelAsRunner, make_prompt
from qwenvl_lab.course import exercises
from qwenvl_lab.course.exercises import check, nb06
from qwenvl_lab.prompt_table import per_request_tables
from qwenvl_lab.resources import images_dir
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, IM_END_ID, IMAGE_START_ID


@pytest.fixture(autouse=True)
def only_notebook_06(monkeypatch):
    """Load notebook 06's checks only: the other notebooks' exercise modules play no part here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb06",))


# 06.1 — greedy decoding


def greedy(next_logits, prompt, steps):
    """A right answer: a loop that appends the best token."""
    ids, new = list(prompt), []
    for _ in range(steps):
        token = int(next_logits(ids).argmax())
        ids.append(token)
        new.append(token)
        if token == IM_END_ID:
            break
    return new


def greedy_while(next_logits, prompt, steps):
    """A right answer written otherwise: a while loop over a tensor of ids."""
    ids = torch.tensor(prompt)
    while len(ids) < len(prompt) + steps and (len(ids) == len(prompt) or ids[-1] != IM_END_ID):
        ids = torch.cat([ids, next_logits(ids.tolist()).argmax()[None]])
    return ids[len(prompt) :]


def stops_at_any_special_id(next_logits, prompt, steps):
    """Stops at the first special id (151643 on), as if <ref> or <box> ended an answer like <|im_end|>."""
    ids, new = list(prompt), []
    for _ in range(steps):
        token = int(next_logits(ids).argmax())
        ids.append(token)
        new.append(token)
        if token >= ENDOFTEXT_ID:
            break
    return new


def runner_up_on_big_vocabularies(next_logits, prompt, steps):
    """Right on the stand-in model, wrong on the real one: the second best token when the vocabulary is large."""
    ids, new = list(prompt), []
    for _ in range(steps):
        logits = next_logits(ids)
        token = int(logits.topk(2).indices[1]) if len(logits) > IM_END_ID + 1 else int(logits.argmax())
        ids.append(token)
        new.append(token)
        if token == IM_END_ID:
            break
    return new


def raises(error):
    def learner(*args):
        raise error

    return learner


# 06.3 — the capstone


def pipeline(  # noqa: PLR0913 — the signature of what it stands in for
    model,
    tokenizer,
    pictures,
    question,
    max_new_tokens=24,
    start=None,
    per_picture=False,
    tags=True,
    table=True,
    append=True,
    stop=True,
    embeddings=True,
    call="model",
    skip=False,
    shortcut=False,
    returns=lambda answer, *engine_inputs: (answer, *engine_inputs),
):
    """A capstone answer, right with the defaults; each keyword turns one step into a typical mistake. `shortcut`
    skips the fake ids and the table, writing input_vit straight into the word embeddings at the spans; `returns`
    picks what the function gives back from (answer, input_ids, prompt_table, tasks, task_vocab_size)."""
    query = tokenizer.from_list_format([{"image": p} for p in pictures] + [{"text": question}])
    input_ids = torch.tensor([make_context(tokenizer, query)[1]])  # [1, L]
    bos_pos = torch.where(input_ids == IMAGE_START_ID)
    eos_pos = torch.where(input_ids == IMAGE_START_ID + 1)
    img_pos = torch.stack((bos_pos[0], bos_pos[1], eos_pos[1]), dim=1)  # [N, 3]
    input_vit = model.transformer.visual.encode(pictures)  # [N, 256, H]
    vocab_size = model.config.vocab_size
    prompt_ids = input_ids.clone()  # [1, L], the picture's path in each span
    first = vocab_size if start is None else start
    fake_prompt_id = torch.arange(first, first + input_vit.shape[0] * input_vit.shape[1]).reshape(input_vit.shape[:2])
    if per_picture:
        fake_prompt_id = fake_prompt_id[:1].expand_as(fake_prompt_id)  # every picture numbered from vocab_size
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        if tags:
            input_ids[i, a + 1 : b] = fake_prompt_id[k]
        else:  # over the opening tag
            input_ids[i, a : b - 1] = fake_prompt_id[k]
    prompt_table = input_vit.reshape(-1, input_vit.shape[-1])  # [N·256, H]
    tasks, task_vocab_size = torch.zeros(1, dtype=torch.int32), input_vit.shape[1]
    wte = model.transformer.wte.weight  # [V, H]
    if shortcut:  # no fake ids, no table: input_vit written over the spans' word embeddings
        input_ids, prompt_table, tasks, task_vocab_size = prompt_ids, None, None, None
        embeds = wte[input_ids].clone()  # [1, L, H]
        for k, (i, a, b) in enumerate(img_pos.tolist()):
            embeds[i, a + 1 : b] = input_vit[k]
        return returns(greedy_answer(model, tokenizer, embeds, wte), input_ids, prompt_table, tasks, task_vocab_size)
    if not embeddings:
        out = model(
            input_ids,
            prompt_table=prompt_table,
            tasks=torch.zeros(1, dtype=torch.int32),
            task_vocab_size=prompt_table.shape[0],
        )
        answer = tokenizer.decode([int(out.logits[0, -1].argmax())])
        return returns(answer, input_ids, prompt_table, tasks, task_vocab_size)
    fake = (input_ids >= vocab_size) & table
    rows = prompt_table[(input_ids - vocab_size).clamp(0, len(prompt_table) - 1)]
    embeds = torch.where(fake[..., None], rows, wte[input_ids.clamp(max=vocab_size - 1)])  # [1, L, H]
    new_ids, first_token = [], None
    for _ in range(max_new_tokens):
        token = int(logits_of(model, embeds, call)[0, -1].argmax())
        first_token = token if first_token is None else first_token
        if token == IM_END_ID and stop:
            break
        new_ids.append(token)
        embeds = torch.cat([embeds, wte[token if append else first_token][None, None]], dim=1)
    answer = tokenizer.decode(new_ids, skip_special_tokens=skip)
    return returns(answer, input_ids, prompt_table, tasks, task_vocab_size)


def greedy_answer(model, tokenizer, embeds, wte):
    """The greedy answer of at most 24 tokens to the prompt's embeddings [1, L, H], stopped at <|im_end|>."""
    new_ids = []
    while len(new_ids) < 24:
        token = int(model(inputs_embeds=embeds).logits[0, -1].argmax())
        if token == IM_END_ID:
            break
        new_ids.append(token)
        embeds = torch.cat([embeds, wte[token][None, None]], dim=1)
    return tokenizer.decode(new_ids)


def logits_of(model, embeds, call):
    """The model's logits [1, L, V] for the embeddings, asked as `call` says: model(…), model.forward(…), or its
    transformer and lm_head one after the other."""
    if call == "forward":
        return model.forward(inputs_embeds=embeds).logits
    if call == "transformer":
        return model.lm_head(model.transformer(inputs_embeds=embeds)[0])
    return model(inputs_embeds=embeds).logits


def pipeline_vectorised(model, tokenizer, pictures, question):
    """A right capstone answer written otherwise: img_pos from a mask, F.embedding, a cumulative count of span ids."""
    query = tokenizer.from_list_format([{"image": p} for p in pictures] + [{"text": question}])
    ids = torch.tensor(make_context(tokenizer, query)[1])  # [L]
    V = model.config.vocab_size
    starts, ends = (ids == IMAGE_START_ID).nonzero()[:, 0], (ids == IMAGE_START_ID + 1).nonzero()[:, 0]
    inside = torch.zeros_like(ids, dtype=torch.bool)
    for a, b in zip(starts.tolist(), ends.tolist()):
        inside[a + 1 : b] = True
    ids = torch.where(inside, V + inside.long().cumsum(0) - 1, ids)  # V, V+1, … over every span in order
    input_vit = model.transformer.visual.encode(pictures)  # [N, 256, H]
    table = input_vit.flatten(0, 1)  # [N·256, H]
    wte = model.transformer.wte.weight
    embeds = torch.where(
        inside[:, None], F.embedding((ids - V).clamp(min=0), table), F.embedding(ids.clamp(max=V - 1), wte)
    )
    answer = []
    while len(answer) < 24:
        logits = model(inputs_embeds=embeds[None], logits_to_keep=1).logits
        token = int(logits[0, -1].argmax())
        if token == IM_END_ID:
            break
        answer.append(token)
        embeds = torch.cat([embeds, F.embedding(torch.tensor([token]), wte)])
    return tokenizer.decode(answer), ids.tolist(), table, [0], torch.tensor([input_vit.shape[1]])


def keep_going(model, tokenizer, pictures, question):
    """Does not stop at <|im_end|>: decodes every new id, <|im_end|> and what follows included."""
    return pipeline(model, tokenizer, pictures, question, stop=False)


# answers that depend on the model, computed from the eager model when the test runs


class Eager:
    """An answer computed from the course's eager model when the test runs."""

    def __init__(self, make, label):
        self.make, self.label = make, label

    def __repr__(self):
        return self.label


def eager_request(course, picture, question):
    """(fake ids [L], table [1, 256, H]) of a sample picture's question, for the eager model."""
    runner, vision, tokenizer, _ = course
    pictures = [images_dir() / picture]
    ids = torch.tensor(make_prompt(tokenizer, question, pictures)[1])[None]
    with torch.inference_mode():
        input_vit = vision.encode(pictures)
    fake, table, _, rows = per_request_tables(ids, input_vit, runner.vocab_size)
    return fake[0], table.view(1, rows, -1)


def end_count(course, change=0):
    ids, table = eager_request(course, "red_circle.png", "图片里是什么？")
    out = ModelAsRunner(course[3]).generate([ids], prompt_table=table, max_new_tokens=40)
    return out[0, 0, len(ids) :].tolist().count(IM_END_ID) + change


CASES = [  # (exercise, answer, right?, words the hint must hold)
    ("06.1", greedy, True, ()),
    ("06.1", greedy_while, True, ()),
    (
        "06.1",
        lambda next_logits, prompt, steps: [int(next_logits(list(prompt)).argmax())] * steps,
        False,
        ["join the ids"],
    ),
    ("06.1", lambda f, prompt, steps: list(prompt) + greedy(f, prompt, steps), False, ["only the new tokens"]),
    ("06.1", lambda f, p, steps: [i for i in greedy(f, p, steps + 1) if i != IM_END_ID][:steps], False, ["<|im_end|>"]),
    ("06.1", lambda f, p, steps: greedy(lambda ids: -f(ids), p, steps), False, ["not the ones it prefers"]),
    ("06.1", lambda f, p, steps: greedy(f, p, max(steps, 1)), False, ["steps=0"]),
    ("06.1", lambda f, p, steps: greedy(f, p, steps + 1), False, ["one step too many", "gave 5"]),  # range(steps + 1)
    ("06.1", lambda f, p, steps: greedy(f, p, steps - 1), False, ["too few steps", "gave 3"]),
    ("06.1", lambda f, p, steps: "".join(map(str, greedy(f, p, steps))), False, ["list of ints"]),
    ("06.1", runner_up_on_big_vocabularies, False, ["differ from the engine's greedy tokens from step 0"]),
    ("06.1", stops_at_any_special_id, False, ["only <|im_end|>", "ends an answer", "151851"]),
    ("06.1", lambda f, p, steps: None, False, ["not attempted yet"]),
    ("06.1", raises(NotImplementedError), False, ["not attempted yet"]),
    ("06.1", raises(ValueError("oops")), False, ["your answer raised ValueError: oops"]),
    ("06.2", Eager(end_count, "the count of <|im_end|>"), True, ()),
    ("06.2", Eager(lambda c: torch.tensor(end_count(c)), "the count as a tensor"), True, ()),
    ("06.2", Eager(lambda c: end_count(c, -1), "one fewer"), False, ["not yet"]),
    ("06.2", Eager(lambda c: end_count(c, 1), "one more"), False, ["not yet"]),
    ("06.2", 1, False, ["what fills the rest"]),
    ("06.2", 0, False, ["without skip_special_tokens"]),  # counted in the text decoded with skip_special_tokens
    ("06.2", "18", False, ["answer with an int"]),
    ("06.3", pipeline, True, ()),
    ("06.3", pipeline_vectorised, True, ()),
    ("06.3", lambda *a: pipeline(*a, call="forward"), True, ()),
    ("06.3", lambda *a: pipeline(*a, call="transformer"), False, ["never called", "model.forward"]),
    ("06.3", lambda *a: pipeline(*a, max_new_tokens=20), False, ["Where is the blue square", "stops early"]),
    ("06.3", lambda *a: pipeline(*a, max_new_tokens=25), False, ["Where is the blue square", "25 times", "at most 24"]),
    ("06.3", lambda *a: pipeline(*a, start=151643), False, ["span", "where the fake ids start"]),
    ("06.3", lambda *a: pipeline(*a, per_picture=True), False, ["picture 1's span", "one picture to the next"]),
    ("06.3", lambda *a: pipeline(*a, tags=False), False, ["a tag of picture 0", "keep their word embeddings"]),
    ("06.3", lambda *a: pipeline(*a, table=False), False, ["inside picture 0's span"]),
    ("06.3", lambda *a: pipeline(*a, append=False), False, ["prompt's embeddings are right", "append"]),
    ("06.3", keep_going, False, ["prompt's embeddings are right", "stop at <|im_end|>"]),
    ("06.3", lambda *a: pipeline(*a, skip=True), False, ["Where is the blue square", "without skip_special_tokens"]),
    ("06.3", lambda *a: pipeline(*a, embeddings=False), False, ["ids, not embeddings", "the lookup is yours"]),
    ("06.3", lambda *a: pipeline(*a, shortcut=True, returns=lambda answer, *_: answer), False, ["only the answer"]),
    (
        "06.3",
        lambda *a: pipeline(*a, shortcut=True),
        False,
        ["no fake id", "input_vit straight into the word embeddings", "skips the fake ids and the prompt table"],
    ),
    (
        "06.3",
        lambda *a: pipeline(*a, returns=lambda answer, ids, table, *rest: (answer, ids, None, *rest)),
        False,
        ["the prompt table your fake ids read", "not a NoneType", "skips the table"],
    ),
    (
        "06.3",
        lambda *a: pipeline(*a, returns=lambda answer, ids, table, *rest: (answer, ids, table[None], *rest)),
        False,
        ["[1, 256, 128]", "flatten it to [N·256, H]"],
    ),
    (
        "06.3",
        lambda *a: pipeline(*a, returns=lambda answer, ids, table, *rest: (answer, ids, table.flip(0), *rest)),
        False,
        ["not input_vit flattened", "picture after picture"],
    ),
    (
        "06.3",
        lambda *a: pipeline(*a, returns=lambda answer, ids, *rest: (answer, ids[:, :-1], *rest)),
        False,
        ["your input_ids hold", "spans included"],
    ),
    (
        "06.3",
        lambda *a: pipeline(*a, returns=lambda answer, ids, table, *rest: (answer, ids, table, [1], rest[-1])),
        False,
        ["task 0"],
    ),
    (
        "06.3",
        lambda *a: pipeline(*a, returns=lambda answer, ids, table, *rest: (answer, ids, table, 0, rest[-1])),
        False,
        ["tasks is a bare number", "a tensor [B] ([1] here)"],
    ),
    (
        "06.3",
        lambda *a: pipeline(
            *a, returns=lambda answer, ids, table, tasks, size: (answer, ids, table, tasks, len(table))
        ),
        False,
        ["Which picture has a red triangle", "task_vocab_size is the rows of one picture's block"],
    ),
    (
        "06.3",
        lambda *a: pipeline(*a, returns=lambda answer, ids, *rest: (answer, ids.float(), *rest)),
        False,
        ["integers, a tensor [1, L]"],
    ),
    ("06.3", lambda *a: pipeline(*a)[:3], False, ["returned a value of type tuple"]),
    ("06.3", lambda *a: None, False, ["not attempted yet"]),
    ("06.3", raises(NotImplementedError), False, ["not attempted yet"]),
    ("06.3", lambda *a: 42, False, ["returned a value of type int"]),
    ("06.3", lambda *a: pipeline(*a, returns=lambda answer, *rest: (42, *rest)), False, ["a str"]),
    ("06.3", "一个红色的圆形。", False, ["your function itself"]),
]


CAPSTONE = [n for n, c in enumerate(CASES) if c[0] == "06.3"]  # each runs a whole pipeline on the course model


@pytest.mark.parametrize(
    "key, answer, ok, words",
    [pytest.param(*c, marks=pytest.mark.slow) if n in CAPSTONE[1:] else c for n, c in enumerate(CASES)],
    ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)],
)
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(course, key, answer, ok, words, assert_verdict):
    if isinstance(answer, Eager):
        answer = answer.make(course)
    result = check(key, answer)
    assert_verdict(result, ok, words)
    if ok:
        return
    secrets = {
        "06.1": ["argmax", "append"],
        "06.2": [f" {end_count(course)} "],
        "06.3": ["argmax", "torch.where", nb06.capstone_reference(course[3], course[2], *nb06.CAPSTONE_CASES[0])[0]],
    }[key]
    for secret in secrets:
        assert secret not in result.message.removeprefix(f"exercise {key}"), f"the hint gives the answer away: {result}"


def test_the_capstone_needs_the_second_picture(course):
    """On the two-picture case, a pipeline whose second picture reads the first's rows answers otherwise."""
    case = nb06.CAPSTONE_CASES[1]
    model, tokenizer = course[3], course[2]
    paths = [nb06.short_path(p) for p in case[0]]
    with torch.inference_mode():
        assert pipeline(model, tokenizer, paths, case[1]) != pipeline(
            model, tokenizer, paths, case[1], per_picture=True
        )
