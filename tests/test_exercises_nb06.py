"""Notebook 06's exercise checks: right answers pass, untouched stubs are 'not attempted yet', wrong answers get a hint
that does not give the answer away. The right answers here come from the eager model, the checks use the engine."""

import re

import pytest
import torch

from qwenvl_lab import exercises
from qwenvl_lab.chat import ModelAsRunner, ask, make_prompt
from qwenvl_lab.exercises import check, nb06
from qwenvl_lab.prompt_table import per_request_tables
from qwenvl_lab.resources import images_dir
from qwenvl_lab.tokenizing import IM_END_ID


@pytest.fixture(autouse=True)
def only_notebook_06(monkeypatch):
    """Load notebook 06's checks only: the other notebooks' exercise modules play no part here."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb06",))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The course's engine, built into a temporary output folder, with its vision part, tokenizer and eager model."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QWENVL_LAB_OUTPUT", str(tmp_path_factory.mktemp("course-output")))
        nb06.course.cache_clear()
        yield nb06.course()
    nb06.course.cache_clear()


def greedy(next_logits, prompt, steps):
    """A right answer to 06.1."""
    ids, new = list(prompt), []
    for _ in range(steps):
        token = int(next_logits(ids).argmax())
        ids.append(token)
        new.append(token)
        if token == IM_END_ID:
            break
    return new


def eager_request(course, picture, question):
    """(fake ids [L], table [1, 256, H]) of a sample picture's question, for the eager model."""
    runner, vision, tokenizer, _ = course
    pictures = [images_dir() / picture]
    ids = torch.tensor(make_prompt(tokenizer, question, pictures)[1])[None]
    with torch.inference_mode():
        input_vit = vision.encode(pictures)
    fake, table, _, rows = per_request_tables(ids, input_vit, runner.vocab_size)
    return fake[0], table.view(1, rows, -1)


def test_untouched_stubs_are_not_attempted():
    def stub(next_logits, prompt, steps): ...  # your code

    def unwritten(next_logits, prompt, steps):
        raise NotImplementedError

    for learner in (stub, unwritten):
        result = check("06.1", learner)
        assert not result and "not attempted yet" in str(result)
    for key in ("06.2", "06.3", "06.4", "06.5"):
        assert str(check(key, None)) == f"exercise {key}: not attempted yet — replace None with your answer"


def test_a_greedy_loop_passes(course):
    assert check("06.1", greedy)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda next_logits, prompt, steps: [int(next_logits(list(prompt)).argmax())] * steps, "join the ids"),
        (lambda next_logits, prompt, steps: list(prompt) + greedy(next_logits, prompt, steps), "only the new tokens"),
        (
            lambda next_logits, prompt, steps: [i for i in greedy(next_logits, prompt, steps + 1) if i != IM_END_ID][
                :steps
            ],
            "<|im_end|>",
        ),
        (
            lambda next_logits, prompt, steps: greedy(lambda ids: -next_logits(ids), prompt, steps),
            "not the ones it prefers",
        ),
        (lambda next_logits, prompt, steps: greedy(next_logits, prompt, max(steps, 1)), "steps=0"),
        (lambda next_logits, prompt, steps: "".join(map(str, greedy(next_logits, prompt, steps))), "list of ints"),
    ],
)
def test_greedy_mistakes_get_hints_without_the_loop(wrong, hint):
    result = check("06.1", wrong)
    assert not result and hint in str(result)
    assert "argmax" not in str(result) and "append" not in str(result)


def test_a_loop_that_fails_only_on_the_real_model_is_caught(course):
    def runner_up_on_big_vocabularies(next_logits, prompt, steps):
        ids, new = list(prompt), []
        for _ in range(steps):
            logits = next_logits(ids)
            token = int(logits.topk(2).indices[1]) if len(logits) > IM_END_ID + 1 else int(logits.argmax())
            ids.append(token)
            new.append(token)
            if token == IM_END_ID:
                break
        return new

    result = check("06.1", runner_up_on_big_vocabularies)
    assert not result and "differ from the engine's greedy tokens from step 0" in str(result)


def test_a_learner_error_is_a_hint():
    def broken(next_logits, prompt, steps):
        raise ValueError("oops")

    assert str(check("06.1", broken)) == "exercise 06.1: not yet — your answer raised ValueError: oops"


def test_end_count(course):
    model = course[3]
    ids, table = eager_request(course, "red_circle.png", "图片里是什么？")
    out = ModelAsRunner(model).generate([ids], prompt_table=table, max_new_tokens=24)
    count = out[0, 0, len(ids) :].tolist().count(IM_END_ID)
    assert 1 < count < 24
    assert check("06.2", count)
    for wrong in (count - 1, count + 1):
        result = check("06.2", wrong)
        assert not result and str(count) not in str(result).removeprefix("exercise 06.2")
    assert "what fills the rest" in str(check("06.2", 1))
    assert "answer with an int" in str(check("06.2", str(count)))


def test_second_beam(course):
    model, tokenizer = course[3], course[2]
    ids, table = eager_request(course, "red_circle.png", "图片里是什么？")
    out = ModelAsRunner(model).generate([ids], prompt_table=table, max_new_tokens=24, num_beams=2, return_dict=True)
    beams = [
        tokenizer.decode(
            out["output_ids"][0, k, len(ids) : int(out["sequence_lengths"][0, k])].tolist(), skip_special_tokens=True
        )
        for k in range(2)
    ]
    assert beams[0] != beams[1]
    assert check("06.3", beams[1])
    assert "best beam" in str(check("06.3", beams[0]))
    hint = str(check("06.3", "a blue square"))
    assert "not yet" in hint and beams[1] not in hint
    assert "a str" in str(check("06.3", 3))


def test_two_answers(course):
    model, vision, tokenizer = course[3], course[1], course[2]
    reference = ModelAsRunner(model)
    answers = [
        ask(reference, vision, tokenizer, [images_dir() / picture], question)[0]
        for picture, question in nb06.TWO_QUESTIONS
    ]
    assert check("06.4", answers)
    assert check("06.4", [f"{a}\n" for a in answers])  # surrounding whitespace does not matter
    assert "swapped" in str(check("06.4", answers[::-1]))
    hint = str(check("06.4", [answers[0], answers[0]]))
    assert "own picture" in hint and answers[1] not in hint
    assert "two strings" in str(check("06.4", answers[0]))


def test_box_pixels():
    corners = [int(v) for v in re.findall(r"[0-9]+", nb06.BOX_ANSWER.split("<box>")[1])]
    assert len(corners) == 4
    right = tuple((2 * c * 224 + 1000) // 2000 for c in corners)  # half up, a 224-pixel picture
    assert check("06.5", right) and check("06.5", list(right))
    at_input_size = tuple(round(c * 112 / 1000) for c in corners)
    for wrong, hint in (
        (tuple(corners), "0–1000 grid"),
        (at_input_size, "input size"),
        (tuple(v + 1 for v in right), "scale each corner"),
        ("(1, 2, 3, 4)", "four ints"),
    ):
        result = check("06.5", wrong)
        assert not result and hint in str(result)
        assert not any(str(v) in str(result) for v in right if v > 9)
