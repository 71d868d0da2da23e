"""Notebooks 03 and 04's exercise checks: right answers written in several ways pass, and the plausible wrong ones
(off by one, the wrong convention, a block size inferred from the table's rows, a guess) get a hint that does not
give the answer away."""

import itertools
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import qwenvl_lab.course.exercises as exercises
from qwenvl_lab import load_tokenizer, make_context
from qwenvl_lab.chat import ModelAsRunner, answer_text
from qwenvl_lab.course.exercises import check, nb04
from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.prompt_table import prompt_tuning_embedding
from qwenvl_lab.resources import images_dir
from qwenvl_lab.tokenizing import MODEL_VOCAB_SIZE, TOKENIZER_VOCAB_SIZE
from qwenvl_lab.toy import load_course_model
from qwenvl_lab.toy.make_samples import SAMPLES
from qwenvl_lab.toy.shapes import Scene, Shape, describe

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(autouse=True)
def only_these_notebooks(monkeypatch):
    """Load the checks of notebooks 03 and 04 alone."""
    monkeypatch.setattr(exercises, "NOTEBOOK_MODULES", ("nb03", "nb04"))


# 03.1 — replace_image_spans


def loop_replace(input_ids, img_pos, fake_prompt_id):
    """A right answer: article 2's loop on a copy."""
    out = input_ids.clone()
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        out[i, a + 1 : b] = fake_prompt_id[k]
    return out


def vectorised_replace(input_ids, img_pos, fake_prompt_id):
    """A right answer without a loop: every span's positions at once, by advanced indexing."""
    out = input_ids.clone()
    columns = img_pos[:, 1:2] + 1 + torch.arange(fake_prompt_id.shape[1])  # [N, span]
    out[img_pos[:, :1].expand_as(columns), columns] = fake_prompt_id
    return out


def spans_with(where):
    """A replace_image_spans that writes picture k's fake ids at where(out, k, i, a, b)."""

    def replace(input_ids, img_pos, fake_prompt_id):
        out = input_ids.clone()
        for k, (i, a, b) in enumerate(img_pos.tolist()):
            where(out, fake_prompt_id, k, i, a, b)
        return out

    return replace


def in_place(input_ids, img_pos, fake_prompt_id):
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        input_ids[i, a + 1 : b] = fake_prompt_id[k]
    return input_ids


def dropped_tag(input_ids, img_pos, fake_prompt_id):
    keep = torch.ones(input_ids.shape[1], dtype=torch.bool)
    keep[img_pos[0, 1]] = False
    return replace_image_spans(input_ids, img_pos, fake_prompt_id)[:, keep]


def write_span(out, fake, k, i, a, b, row=None, start=1, stop=0, picture=None):  # noqa: PLR0913 — the signature of what it stands in for
    out[i if row is None else row, a + start : b + stop] = fake[k if picture is None else picture]


# 04.1 — the lookup


def masked_lookup(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    """A right answer: the word rows, then the fake ids' rows written over them."""
    fake = input_ids >= vocab_size
    rows = input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size)
    out = vocab_embedding[input_ids.clamp(max=vocab_size - 1)]
    out[fake] = prompt_table[rows[fake]]
    return out


def f_embedding_lookup(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    """A right answer with F.embedding and torch.where, as the engine's graph does it."""
    fake = input_ids >= vocab_size
    rows = torch.where(fake, input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size), 0)
    words = F.embedding(torch.where(fake, vocab_size - 1, input_ids), vocab_embedding)
    return torch.where(fake[..., None], F.embedding(rows, prompt_table), words)


def mask_after_v(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    """The mask `id > vocab_size`: the id vocab_size itself goes to the word embedding, one row past its end."""
    fake = input_ids > vocab_size
    out = vocab_embedding[torch.where(fake, vocab_size - 1, input_ids)]
    out[fake] = prompt_table[(input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size))[fake]]
    return out


def unclamped_words(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    """Every id looked up in the word embedding first, fake ids unclamped."""
    out = vocab_embedding[input_ids]
    fake = input_ids >= vocab_size
    out[fake] = prompt_table[(input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size))[fake]]
    return out


def token_loop_lookup(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    """A right answer, one token at a time."""
    out = torch.empty(*input_ids.shape, vocab_embedding.shape[1], dtype=vocab_embedding.dtype)
    for b, row in enumerate(input_ids.tolist()):
        for p, t in enumerate(row):
            out[b, p] = (
                vocab_embedding[t]
                if t < vocab_size
                else prompt_table[t - vocab_size + int(tasks[b]) * int(task_vocab_size)]
            )
    return out


def lookup_with(rows_of):
    """A lookup that reads fake ids from rows_of(offset, tasks, task_vocab_size, table rows), words as they are."""

    def lookup(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
        fake = input_ids >= vocab_size
        out = vocab_embedding[input_ids.clamp(max=vocab_size - 1)]
        rows = rows_of(input_ids - vocab_size, tasks.long()[:, None], int(task_vocab_size), len(prompt_table))
        out[fake] = prompt_table[rows.expand_as(input_ids)[fake].clamp(0, len(prompt_table) - 1)]
        return out

    return lookup


def block_from_rows(offset, tasks, tvs, rows):
    """The block size inferred from the table: rows // number of tasks."""
    return offset + tasks * (rows // len(tasks))


def v_minus_1_as_fake(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    fake = input_ids >= vocab_size - 1
    out = vocab_embedding[input_ids.clamp(max=vocab_size - 1)]
    rows = (input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size)).clamp(min=0)
    out[fake] = prompt_table[rows[fake]]
    return out


def mask_past_v(input_ids, vocab_embedding, prompt_table, tasks, task_vocab_size, vocab_size):
    fake = input_ids > vocab_size
    out = vocab_embedding[torch.where(fake, 0, input_ids)]
    out[fake] = prompt_table[(input_ids - vocab_size + tasks.long()[:, None] * int(task_vocab_size))[fake]]
    return out


def package_then(change):
    """The package's lookup, then `change(out, inputs)` applied to what it returns."""

    def lookup(*inputs):
        return change(prompt_tuning_embedding(*inputs), inputs)

    return lookup


def shifted_words(out, inputs):
    ids, vocab, vocab_size = inputs[0], inputs[1], inputs[5]
    out[ids < vocab_size] = vocab[(ids[ids < vocab_size] + 1) % vocab_size]
    return out


def zeroes_the_table(out, inputs):
    inputs[2].zero_()
    return out


# 04.2 — the answers the model gives, computed here as the notebook does (runner.generate, answer_text)


@lru_cache(maxsize=1)
def blend_answers():
    model, tokenizer = load_course_model(), load_tokenizer()
    ids = make_context(
        tokenizer, tokenizer.from_list_format([{"image": "red_circle.png"}, {"text": "图片里是什么？"}])
    )[1]
    ids = torch.tensor(ids)[None]
    img_pos = locate_img_pos(ids)
    fake_ids = replace_image_spans(ids, img_pos, make_fake_prompt_ids(model.config.vocab_size, 1))
    names = ["red_circle.png", "blue_square.png", "green_triangle.png"]
    with torch.inference_mode():
        red, blue, green = model.transformer.visual.encode([images_dir() / n for n in names])
    runner, answers = ModelAsRunner(model), {}
    for name, table in {"red": red, "blue": blue, "green": green, "blend": (blue + green) / 2}.items():
        out = runner.generate([fake_ids[0]], prompt_table=table, max_new_tokens=24, return_dict=True)
        answers[name] = answer_text(
            tokenizer, out["output_ids"][0, 0, ids.shape[1] : int(out["sequence_lengths"][0, 0])]
        )
    return answers


class Blend:
    """A 04.2 answer read from the model's answers when the check runs (they are not typed here)."""

    def __init__(self, name, change=str):
        self.name, self.change = name, change

    def __call__(self):
        return self.change(blend_answers()[self.name])

    def __repr__(self):
        return f"the model's answer with the {self.name} table"


CASES = [  # (exercise, answer, right?, words the hint must hold)
    ("03.1", replace_image_spans, True, ()),
    ("03.1", loop_replace, True, ()),
    ("03.1", vectorised_replace, True, ()),
    ("03.1", in_place, False, ["changed the input_ids"]),
    (
        "03.1",
        spans_with(lambda o, f, k, i, a, b: write_span(o, f, k, i, a, b, start=0, stop=-1)),
        False,
        ["tag was overwritten"],
    ),
    (
        "03.1",
        spans_with(lambda o, f, k, i, a, b: write_span(o, f, k, i, a, b, row=0)),
        False,
        ["outside the image spans", "two left-padded rows"],
    ),
    ("03.1", spans_with(lambda o, f, k, i, a, b: write_span(o, f, k, i, a, b, picture=0)), False, ["picture 1"]),
    ("03.1", spans_with(lambda o, f, k, i, a, b: write_span(o, f, k, i, a, b, picture=i)), False, ["picture 1"]),
    (
        "03.1",
        spans_with(lambda o, f, k, i, a, b: o.__setitem__((i, slice(a + 1, a + 257)), f[k])),
        False,
        ["spans of 3 ids", "from a + 1 to b", "do not assume 256"],
    ),
    (
        "03.1",
        lambda ids, img_pos, fake: loop_replace(ids, locate_img_pos(ids), fake),
        False,
        ["use the img_pos you are given", "not 256 ids long"],
    ),
    ("03.1", lambda *args: replace_image_spans(*args).squeeze(0), False, ["keep the batch dimension", "[B, L]"]),
    ("03.1", lambda *args: replace_image_spans(*args).tolist(), False, ["torch tensor"]),
    ("03.1", lambda *args: replace_image_spans(*args).float(), False, ["integer token ids"]),
    ("03.1", dropped_tag, False, ["keep their length"]),
    ("03.1", lambda *args: None, False, ["not attempted yet"]),
    ("03.1", torch.tensor([1, 2]), False, ["pass your function"]),
    ("03.2", 76, True, ()),
    ("03.2", torch.tensor(76), True, ()),
    ("03.2", 293, False, ["special tokens too"]),
    ("03.2", 217, False, ["number of special tokens"]),
    ("03.2", 77, False, ["off by one"]),
    ("03.2", 75, False, ["off by one"]),
    ("03.2", 12, False, ["recount"]),
    ("03.3", 152960, True, ()),  # 151936 + 4 · 256
    ("03.3", 151936, False, ["first picture"]),
    ("03.3", 152704, False, ["fourth picture's first id", "counted from 0"]),
    ("03.3", 152959, False, ["fourth picture's last id"]),
    ("03.3", 153215, False, ["fifth picture's last id"]),
    ("03.3", 152667, False, ["not at 151643"]),
    ("03.3", 153216, False, ["after the fifth picture"]),
    ("03.3", 152448, False, ["recount"]),  # the third picture's, which section 4's table shows
    ("04.1", prompt_tuning_embedding, True, ()),
    ("04.1", mask_after_v, False, ["indexed past a table", "vocab_size itself"]),
    ("04.1", unclamped_words, False, ["indexed past a table", "must not index the word embedding"]),
    ("04.1", masked_lookup, True, ()),
    ("04.1", f_embedding_lookup, True, ()),
    ("04.1", token_loop_lookup, True, ()),
    ("04.1", lookup_with(block_from_rows), False, ["inferred from the table's rows", "2048 rows"]),
    ("04.1", lookup_with(lambda offset, tasks, tvs, rows: offset), False, ["ignore `tasks`", "tasks 0 and 1"]),
    ("04.1", lookup_with(lambda offset, tasks, tvs, rows: offset + tasks * tvs + 1), False, ["off by one"]),
    ("04.1", lookup_with(lambda offset, tasks, tvs, rows: offset + tasks * tvs - 1), False, ["off by one"]),
    ("04.1", lookup_with(lambda offset, tasks, tvs, rows: offset + tasks), False, ["as a row count"]),
    ("04.1", lookup_with(lambda offset, tasks, tvs, rows: offset * 0 + tasks * tvs), False, ["wrong rows"]),
    ("04.1", v_minus_1_as_fake, False, ["vocab_size − 1"]),
    ("04.1", lambda ids, vocab, *rest: vocab[ids.clamp(max=rest[-1] - 1)], False, ["wrong rows"]),
    ("04.1", package_then(shifted_words), False, ["their own row of the word embedding"]),
    ("04.1", package_then(zeroes_the_table), False, ["changed one of its inputs"]),
    ("04.1", package_then(lambda out, inputs: out[0]), False, ["[B, L, H]"]),
    ("04.1", package_then(lambda out, inputs: out.double()), False, ["dtype"]),
    ("04.1", mask_past_v, False, ["indexed past a table", "vocab_size itself"]),
    ("04.1", lambda *args: None, False, ["not attempted yet"]),
    ("04.1", "prompt_tuning_embedding", False, ["pass your function"]),
    ("04.2", Blend("blend"), True, ()),
    ("04.2", Blend("blend", lambda a: f" {a}\n"), True, ()),
    ("04.2", Blend("red"), False, ["name no picture", "run answers_with"]),
    ("04.2", Blend("blue"), False, ["one of the two pictures' own answer"]),
    ("04.2", Blend("green"), False, ["one of the two pictures' own answer"]),
    ("04.2", "一个蓝色的三角形。", False, ["a guess from the two pictures", "run it"]),
    ("04.2", "一个绿色的正方形。", False, ["a guess from the two pictures", "run it"]),
    ("04.2", "一个蓝色和绿色的三角形。", False, ["give its answer exactly"]),
    ("04.2", "A blue square and a green triangle.", False, ["give its answer exactly"]),
    ("04.2", Blend("blend", lambda a: [a]), False, ["as a string"]),
]
SECRETS = {  # numbers a hint to a wrong answer must not show
    "03.1": [],
    "03.2": [76],
    "03.3": [152960],
    "04.1": [],
    "04.2": [],
}


@pytest.mark.parametrize("key, answer, ok, words", CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_the_check_accepts_right_answers_and_hints_at_wrong_ones(key, answer, ok, words, assert_verdict):
    if isinstance(answer, Blend):
        answer = answer()
    result = check(key, answer)
    assert_verdict(result, ok, words)
    if ok:
        return
    shown = result.message.replace(repr(answer), "")
    for secret in SECRETS[key]:
        assert re.search(rf"(?<![\d.]){secret}(?!\d)", shown) is None, f"the hint gives the answer away: {result}"
    if key in ("03.1", "04.1"):
        assert all(int(n) < 151936 for n in re.findall(r"\d+", shown)) and re.search(r"\d\.\d", shown) is None
    if key == "04.2":
        assert blend_answers()["blend"] not in shown


def test_04_1_has_a_table_with_more_rows_than_its_tasks_use():
    """The case that tells task_vocab_size from a block inferred from the table: an engine's whole buffer."""
    cases = nb04.lookup_cases()
    assert any(len(table) // len(tasks) != int(tvs) and int(tasks.max()) > 0 for _, _, _, table, tasks, tvs, _ in cases)


def test_04_2_cannot_be_answered_without_running_the_model():
    answers = blend_answers()
    assert len(set(answers.values())) == len(answers)  # the blend's answer is none of the pictures' own
    assert answers["blend"] == nb04.blend_answers()["blend"]  # the check computes what the notebook's cell computes


def test_04_2_answer_is_not_one_pictures_colour_with_the_others_shape():
    """No guess from the two pictures (a colour of one with the shape of the other) gives the blend's answer."""
    pictures = [SAMPLES[name].shapes for name in nb04.BLEND]
    crossed = {describe(Scene((Shape(b.kind, a.color, b.box),)), "zh") for a, b in itertools.product(*pictures)}
    crossed |= {describe(Scene((Shape(a.kind, b.color, a.box),)), "zh") for a, b in itertools.product(*pictures)}
    assert crossed <= nb04.blend_guesses()
    assert nb04.blend_answers()["blend"] not in crossed


def shown_text(cell) -> str:
    """A notebook cell's source and the text of its stored outputs."""
    texts = ["".join(cell["source"])]
    for output in cell.get("outputs", []):
        texts.append("".join(output.get("text", "")))
        texts += ["".join(v) for k, v in output.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(texts)


def cells_before(key: str, notebooks=NOTEBOOKS_DIR):
    """Every cell a learner sees before exercise `key`'s check cell: the earlier notebooks', then its own up to it."""
    for path in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if f'check("{key}"' in "".join(cell["source"]):
                return
            yield path.name, cell
    raise AssertionError(f"no notebook checks exercise {key}")


@pytest.mark.parametrize(
    "key, answer",
    [("03.2", MODEL_VOCAB_SIZE - TOKENIZER_VOCAB_SIZE), ("03.3", int(make_fake_prompt_ids(MODEL_VOCAB_SIZE, 5)[4, 0]))],
)
def test_a_number_to_find_is_not_shown_before_its_exercise(key, answer):
    """Neither the prose nor a stored output before the exercise's cell (notebook 03's table of id ranges, its
    summary, notebook 01's prose) states the answer."""
    for name, cell in cells_before(key):
        assert re.search(rf"(?<![\d.,]){answer}(?![\d.,])", shown_text(cell)) is None, (name, cell.get("id"))
