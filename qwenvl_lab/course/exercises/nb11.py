"""Notebook 11's exercises: the second beam of a beam search, and a grounding answer's box in pixels."""

import torch

from ...engine.sampling import filter_logits
from ...grounding import parse_boxes
from ...resources import images_dir
from ...toy.make_samples import SAMPLES
from ...toy.shapes import where_is
from . import exercise, int_list
from .nb06 import course, engine_output
from .selfcheck import Question, right, wrong

BOX_PICTURE = "red_circle_blue_square.png"  # exercise 11.2: a sample picture (224 × 224 pixels)…
BOX_ANSWER = str(where_is(SAMPLES[BOX_PICTURE], "blue", "square"))  # …and the answer that boxes its blue square


@exercise("11.1", "the second beam of a 2-beam search (red_circle.png, 图片里是什么？), decoded")
def check_second_beam(text):
    """The check of exercise 11.1: None when the answer is right, else a hint."""
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


@exercise("11.2", f"the pixel corners (x1, y1, x2, y2) of the box in {BOX_ANSWER!r} about {BOX_PICTURE}")
def check_box_pixels(corners):
    """The check of exercise 11.2: None when the answer is right, else a hint."""
    corners = int_list(corners)
    if corners is None or len(corners) != 4:
        return "answer with four ints (x1, y1, x2, y2)"
    [box] = parse_boxes(BOX_ANSWER, picture=images_dir() / BOX_PICTURE)
    truncated = tuple(int(c / 1000 * side) for c, side in zip(box.grid, box.size * 2))  # as Qwen-VL draws boxes
    if tuple(corners) in (box.pixels, truncated):
        return None
    if tuple(corners) == box.grid:
        return "those are the corners on Qwen-VL's 0–1000 grid; scale them to the picture's size in pixels"
    if tuple(corners) == tuple(round(c * 112 / 1000) for c in box.grid):
        return "scale to the picture's own size (the file's), not to the model's input size"
    return "the grid runs from 0 (left / top edge) to 1000 (right / bottom edge) of the picture: scale each corner"


def SELF_CHECK():
    """Notebook 11's self-check: its right options computed by the package where it can."""
    logits = torch.tensor([[0.41, 0.35, 0.14, 0.1]]).log()  # a first token the model gives 41 %
    kept = int((filter_logits(logits, 1.0, 0, 0.3) > -torch.inf).sum())
    return (
        Question(
            "What does run.py's `generate_for_qwenvl` draw its tokens with, for Qwen-VL-Chat?",
            (
                wrong("greedy decoding", "its SamplingConfig takes `top_k` and `top_p` from generation_config.json"),
                right(
                    "a SamplingConfig with the checkpoint's `top_k` 0 and `top_p` 0.3, temperature 1.0",
                    "built once from generation_config.json when run.py loads the model: it samples",
                ),
                wrong("beam search with 3 beams", "one beam unless `--num_beams` says otherwise"),
            ),
        ),
        Question(
            "Qwen-VL-Chat samples with `top_p` 0.3. The best first token holds 41 % of the probability, the next "
            "35 %. How many tokens can a draw pick?",
            (
                right(str(kept), "the best token alone already holds 30 %: top_p keeps only it, like greedy"),
                wrong("2", "top_p keeps the fewest best tokens whose probability reaches p; one is enough here"),
                wrong("all of them", "that is top_p 1.0 (or 0: off)"),
            ),
        ),
        Question(
            "On what grid are the corners of a grounding answer's `<box>(x1,y1),(x2,y2)</box>`?",
            (
                wrong("pixels of the picture", "the model never sees the picture's size: corners are on a fixed grid"),
                wrong("pixels of the 448×448 input", "the grid does not depend on the vision tower's input size"),
                right("0–1000 over the picture's width and height", "scale each corner by the picture's own size"),
                wrong("fractions from 0 to 1", "the corners are integers up to 1000"),
            ),
        ),
        Question(
            "A `Conversation` asks about a picture in turn 1 and follows up in turns 2 and 3. In turn 3, the engine…",
            (
                wrong("reads only the new question", "the engine keeps no state between calls"),
                right(
                    "reads the whole chat again, the picture's span included, from features encoded once",
                    "the span stays in the history; `Conversation` caches the vision tower's output, not the prefill",
                ),
                wrong("runs the vision tower again", "the picture's features are cached from turn 1"),
            ),
        ),
    )
