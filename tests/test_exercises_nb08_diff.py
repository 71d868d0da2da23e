"""Notebook 08's qwenvl-lab diff exercises (08.4, 08.5): the mystery dumps diverge where the check says, right answers
written several ways pass, plausible wrong ones get a hint that does not give the answer away."""

import pytest
import torch

from qwenvl_lab.course.exercises import REGISTRY, check
from qwenvl_lab.course.exercises import nb08 as ws
from qwenvl_lab.dump import read_dump
from qwenvl_lab.stagediff import CAUSES, compare


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    a, b = ws.mystery_dumps(tmp_path_factory.mktemp("mystery"))
    return compare(read_dump(a), read_dump(b))


def test_the_mystery_dumps_diverge_where_the_answers_say(comparison):
    assert comparison.first.name == ws.ANSWER_STAGE and comparison.cause is CAUSES["preprocessing"]
    a, b = comparison.a.tensors["pixels"].double(), comparison.b.tensors["pixels"].double()
    for channel in range(3):  # B = α·A + β exactly, channel by channel: another mean and std, not another resize
        x, y = a[:, channel].flatten(), b[:, channel].flatten()
        design = torch.stack([x, torch.ones_like(x)], dim=1)
        fit = torch.linalg.lstsq(design, y[:, None]).solution
        assert float((design @ fit - y[:, None]).abs().max()) < 1e-5
    assert "normalised" in ws.CAUSE_OPTIONS[ws.ANSWER_CAUSE] and "normalise" in CAUSES["preprocessing"].usually


def test_the_exercises_are_registered():
    check("08.4", None)
    assert {"08.4", "08.5"} <= set(REGISTRY)


@pytest.mark.parametrize("answer", ["pixels", " pixels ", "pixels\n"])
def test_the_first_stage_right(answer):
    assert check("08.4", answer)


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        ("input_vit", "does an earlier row diverge"),
        ("preprocessing", "that is a step of the pipeline"),
        ("vision", "that is a step of the pipeline"),
        ("logits", "later in the pipeline"),
        ("layers.0", "later in the pipeline"),
        ("input_embeds", "later in the pipeline"),
        ("prompt_table", "later in the pipeline"),
        ("output_ids", "the same in both dumps"),
        ("prompt_ids", "the same in both dumps"),
        ("input_ids", "the same in both dumps"),
        ("Pixels!", "give one of the dump's stage names"),
        ("the pictures", "give one of the dump's stage names"),
        (0, "give the stage's name as a string"),
        (["pixels"], "give the stage's name as a string"),
    ],
)
def test_the_first_stage_wrong(answer, hint):
    result = check("08.4", answer)
    assert not result and hint in result.message and "'pixels'" not in result.message


def test_a_stage_the_diff_marks_carried_is_not_called_diverging(comparison):
    carried = [r.name for r in comparison.results if r.status == "carried"]
    assert "input_vit" in carried
    for name in carried:
        result = check("08.4", name)
        assert not result and f"{name} diverges" not in result.message, result


@pytest.mark.parametrize("answer", ["b", "B", " (b) ", "b\n"])
def test_the_cause_right(answer):
    assert check("08.5", answer)


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        ("a", "the pixels it reads already differ"),
        ("c", "fit B = α·A + β"),
        ("d", "input_ids, which agree"),
        ("e", "long before any id is drawn"),
        ("f", "answer with one letter"),
        ("normalisation", "answer with one letter"),
        (2, "answer with one letter"),
    ],
)
def test_the_cause_wrong(answer, hint):
    result = check("08.5", answer)
    assert not result and hint in result.message
