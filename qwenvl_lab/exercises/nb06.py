"""Exercises of notebook 06 (generating text): greedy decoding by hand, output_ids, beams, a batch, a box in pixels.

Answers that depend on the model are checked against the course's engine (`toy.course_engine`), run here again.
"""

from functools import lru_cache

import torch

from ..chat import ask, make_prompt
from ..engine import ModelRunner, generate_for_qwenvl, load_engine_vision_tower
from ..grounding import parse_boxes
from ..prompt_table import per_request_tables
from ..resources import images_dir
from ..tokenizing import IM_END_ID, load_tokenizer
from ..toy import course_engine, load_course_model
from ..toy.make_samples import SAMPLES
from ..toy.shapes import where_is
from . import exercise

NOT_ATTEMPTED = "not attempted yet — the function returns None (or raises NotImplementedError): write its body"
GREEDY_CASES = (("red_circle.png", "图片里是什么？", 24), ("three_shapes.png", "What is in the picture?", 5))
TWO_QUESTIONS = (("yellow_circle.png", "圆形是什么颜色？"), ("red_circle.png", "What color is the circle?"))  # 06.4
BOX_PICTURE = "red_circle_blue_square.png"  # exercise 06.5: a sample picture (224 × 224 pixels)…
BOX_ANSWER = str(where_is(SAMPLES[BOX_PICTURE], "blue", "square"))  # …and the answer that boxes its blue square


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


def as_ids(value):
    """A sequence of token ids as a list of ints, or None when it is not one."""
    if isinstance(value, (str, bytes)):
        return None
    try:
        return [int(i) for i in value]
    except (TypeError, ValueError):
        return None


def counting_logits(prompt_len: int, stop_after=None):
    """A stand-in model: its next token is the last id + 1, or <|im_end|> once `stop_after` new ids are there."""

    def next_logits(ids):
        ids = as_ids(ids)
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
                torch.tensor([as_ids(so_far)]),
                prompt_table=table[0],
                tasks=torch.zeros(1, dtype=torch.int32),
                task_vocab_size=table.shape[1],
                logits_to_keep=1,
            ).logits[0, -1]

    return next_logits, ids.tolist()


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
    first = as_ids(first)
    if first is None:
        return "return the new tokens as a list of ints"
    if first[:2] == [7, 8]:
        return "return only the new tokens, not the prompt"
    if first == [9] * 4:  # the first step's token, again and again
        return (
            "every step asked the model about the same ids: each new token must join the ids before the next "
            "step asks for logits"
        )
    if first != [9, 10, 11, 12]:
        return "on a stand-in model whose next token is always the last id + 1, your tokens are not the ones it prefers"
    stopped = as_ids(my_greedy(counting_logits(1, stop_after=2), [5], 6))
    if stopped != [6, 7, IM_END_ID]:
        return (
            f"when <|im_end|> ({IM_END_ID}) is chosen, keep it as the last new token and stop there; "
            f"a stand-in model that ends after two tokens gave {stopped}"
        )
    if as_ids(my_greedy(counting_logits(1), [5], 0)) != []:
        return "steps=0 asks for no new token: return an empty list"
    for picture, question, steps in GREEDY_CASES:
        next_logits, prompt = model_logits(picture, question)
        out = engine_output(picture, question, steps)
        expected = out["output_ids"][0, 0, out["input_len"] : int(out["sequence_lengths"][0, 0])].tolist()
        mine = as_ids(my_greedy(next_logits, prompt, steps))
        if mine != expected:
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


@exercise("06.2", "how many <|im_end|> output_ids[0, 0, input_len:] holds (red_circle.png, 图片里是什么？, 24 new ids)")
def check_end_count(count):
    """The check of exercise 06.2: None when the answer is right, else a hint."""
    if isinstance(count, bool) or not isinstance(count, int):
        return "answer with an int"
    out = engine_output("red_circle.png", "图片里是什么？", 24)
    new = out["output_ids"][0, 0, out["input_len"] :].tolist()
    if count == new.count(IM_END_ID):
        return None
    if count == 1:
        return "one <|im_end|> ends the answer, but the row goes on to max_new_tokens: what fills the rest?"
    return "decode the row after the prompt without skip_special_tokens and count '<|im_end|>' (or count the id 151645)"


@exercise("06.3", "the second beam of a 2-beam search (red_circle.png, 图片里是什么？), decoded")
def check_second_beam(text):
    """The check of exercise 06.3: None when the answer is right, else a hint."""
    if not isinstance(text, str):
        return "answer with the decoded text, a str"
    out = engine_output("red_circle.png", "图片里是什么？", 24, num_beams=2)
    tokenizer = course()[2]
    beams = [
        tokenizer.decode(
            out["output_ids"][0, k, out["input_len"] : int(out["sequence_lengths"][0, k])].tolist(),
            skip_special_tokens=True,
        )
        for k in range(2)
    ]
    if text.strip() == beams[1].strip():
        return None
    if text.strip() == beams[0].strip():
        return "that is the best beam, row 0 of the beams; the second is the next row"
    return (
        "run generate_for_qwenvl with num_beams=2 and return_dict=True, take beam row 1 from the prompt's end to "
        "its sequence length, and decode it with skip_special_tokens=True"
    )


@exercise("06.4", f"the answers to {TWO_QUESTIONS} from one generate_for_qwenvl call")
def check_two_answers(answers):
    """The check of exercise 06.4: None when the answer is right, else a hint."""
    answers = list(answers) if isinstance(answers, (list, tuple)) else None
    if answers is None or len(answers) != 2 or not all(isinstance(a, str) for a in answers):
        return "answer with a list of two strings, in the order of the questions"
    runner, vision, tokenizer, _ = course()
    alone = [
        ask(runner, vision, tokenizer, [images_dir() / picture], question)[0] for picture, question in TWO_QUESTIONS
    ]
    if [a.strip() for a in answers] == alone:
        return None
    if [a.strip() for a in answers] == alone[::-1]:
        return "the answers are swapped: keep the order of the questions"
    return "each request must read its own picture's rows (its own fake ids and table block, or one table and tasks)"


@exercise("06.5", f"the pixel corners (x1, y1, x2, y2) of the box in {BOX_ANSWER!r} about {BOX_PICTURE}")
def check_box_pixels(corners):
    """The check of exercise 06.5: None when the answer is right, else a hint."""
    corners = as_ids(corners)
    if corners is None or len(corners) != 4:
        return "answer with four ints (x1, y1, x2, y2)"
    [box] = parse_boxes(BOX_ANSWER, picture=images_dir() / BOX_PICTURE)
    if tuple(corners) == box.pixels:
        return None
    if tuple(corners) == box.grid:
        return "those are the corners on Qwen-VL's 0–1000 grid; scale them to the picture's size in pixels"
    if tuple(corners) == tuple(round(c * 112 / 1000) for c in box.grid):
        return "scale to the picture's own size (the file's), not to the model's input size"
    return "the grid runs from 0 (left / top edge) to 1000 (right / bottom edge) of the picture: scale each corner"
