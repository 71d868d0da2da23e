"""Exercises of notebook 08's section "Which stage made the answers differ" (`qwenvl-lab diff`): two dumps of one
answer of the toy model, the reference and a run with a bug in it — which stage diverges first (08.11), and why
(08.12)."""

from pathlib import Path

import torch

from ...answer_stages import record_answer, runner_probe
from ...chat import ModelAsRunner
from ...dump import DumpRecorder, stage
from ...engine import BuildConfig, ModelRunner
from ...resources import data_dir
from ...stage_dumps import model_probe
from ...tokenizing import load_tokenizer
from ...toy import TOY_DIR, load_course_model
from ...vision import CLIP_MEAN, CLIP_STD, preprocess_images
from . import exercise

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
    picture = [data_dir() / "images" / MYSTERY_PICTURE]
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


@exercise("08.11", "the first stage that diverges between the two dumps of mystery_dumps")
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
        return "input_vit diverges, but the tower computes it from what it is given: does an earlier row diverge?"
    if spec.ids:
        return f"{name} is the same in both dumps (ids are compared exactly)"
    return LATER


@exercise("08.12", "why the first stage diverges: one of CAUSE_OPTIONS (a letter)")
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
