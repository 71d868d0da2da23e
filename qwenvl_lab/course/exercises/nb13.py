"""Exercises of notebook 13 (the articles' claims): CLIP's logits from its two towers, the kinds of evidence; and its
self-check."""

import numpy as np
import torch

from ...clip import small_clip, what_clip_does
from ...modeling import QWenVLConfig
from ..claims import CLAIMS, EVIDENCE_KINDS
from . import exercise
from .nb03 import NOT_ATTEMPTED
from .selfcheck import Question, right, wrong

CLIP_SEEDS = (1, 2)  # exercise 13.1: the random CLIPs a learner's function is checked on
KINDS = (*EVIDENCE_KINDS, "demonstration")  # exercise 13.2's answers: the three kinds of evidence, or none
# exercise 13.2: the kind of each line of support the notebook lists, (a) to (f)
SUPPORT = {
    "a": "demonstration",  # this package's trtllm_build_command refuses a build without a prompt table
    "b": "source",  # promptTuningBuffers.cpp's lines dividing the table by max_batch_size, quoted at a commit
    "c": "measured",  # transformers' CLIPModel: the text embeddings are bit-identical whatever the picture
    "d": "not checkable here",  # the article's 352 ms against 187 ms, no hardware or precision named
    "e": "demonstration",  # this package's prompt_tuning_embedding returns input_vit's rows at the span
    "f": "measured",  # tiktoken counts 151,643 pieces in qwen.tiktoken
}
SUPPORT_HINTS = {  # (line, the kind given instead of the right one) → what is mistaken
    ("a", "measured"): "(a) is this package refusing its own input: a demonstration of the rule, never evidence",
    ("a", "source"): "(a) quotes no upstream lines: it is this package's own check",
    ("e", "measured"): "(e) is this package agreeing with itself: a demonstration, never evidence",
    ("e", "source"): "(e) quotes no upstream lines: it is this package's own lookup",
    ("b", "measured"): "(b) runs nothing: lines read upstream, at a named commit, are source evidence",
    ("b", "demonstration"): "(b) is not this package's code: it is upstream's, quoted at a commit",
    ("c", "demonstration"): "(c) runs transformers, code this project did not write: running it is a measurement",
    ("c", "source"): "(c) is a run of transformers' model, not lines read from its source",
    ("f", "source"): "(f) counts the file's pieces with tiktoken: running code we did not write is a measurement",
    ("f", "demonstration"): "(f) runs tiktoken on the vocabulary file, neither of them this project's code",
    ("d", "measured"): "(d) names no hardware, precision or source: nothing can measure what it did",
}


def _clip_hint(result, model, input_ids, pixel_values) -> str | None:
    """None when `result` is CLIPModel's logits_per_image for these inputs, else what it looks like instead."""
    if isinstance(result, np.ndarray) and np.issubdtype(result.dtype, np.floating):
        result = torch.from_numpy(result)
    if not isinstance(result, torch.Tensor):
        return f"return a torch.Tensor [pictures, texts], got {type(result).__name__}"
    with torch.inference_mode():
        out = model(input_ids=input_ids, pixel_values=pixel_values)
        images = model.get_image_features(pixel_values=pixel_values).pooler_output  # [N, P]
        texts = model.get_text_features(input_ids=input_ids).pooler_output  # [T, P]
        expected, log_scale = out.logits_per_image, model.logit_scale.detach().clone()  # [N, T]
        cosine = out.image_embeds @ out.text_embeds.T  # the embeds come normalised
        unnormalised = log_scale.exp() * images @ texts.T
    result = result.detach().float()
    if result.shape == expected.T.shape and result.shape != expected.shape:
        return "rows are pictures and columns texts: this has them the other way round"
    if result.shape != expected.shape:
        return f"expected one logit per picture and text, a [{expected.shape[0]}, {expected.shape[1]}] tensor"
    if torch.allclose(result, cosine, atol=1e-4):
        return "that is the cosine alone: CLIP multiplies it by its learned temperature, logit_scale"
    if torch.allclose(result, log_scale * cosine, atol=1e-4):
        return "logit_scale is stored as a logarithm: multiply by its exp()"
    if torch.allclose(result, unnormalised, atol=1e-3):
        return "normalise each projection to length 1 before the dot product"
    if not torch.allclose(result, expected, atol=1e-4):
        return "each logit is scale × the cosine of one picture's and one text's projection, from the two towers apart"
    return None


class WholeModelCalled(Exception):
    """Exercise 13.1's learner called CLIPModel itself, which returns logits_per_image ready-made."""


def _towers_only(*args, **kwargs):
    """CLIPModel.forward while exercise 13.1's function runs: it refuses."""
    raise WholeModelCalled


@exercise("13.1", "CLIP's logits_per_image from its two towers, computed apart")
def clip_logits(function):
    """function(model, input_ids, pixel_values) -> [pictures, texts], equal to CLIPModel's logits_per_image."""
    if not callable(function):
        return "give a function (model, input_ids, pixel_values) -> logits [pictures, texts]"
    for seed in CLIP_SEEDS:
        clip = small_clip(seed, texts=3, images=2)
        whole = type(clip.model)  # CLIPModel: its forward refuses while the function runs, called however it is
        whole.forward, forward = _towers_only, whole.forward
        try:
            result = function(clip.model, clip.input_ids.clone(), clip.pixel_values.clone())
        except NotImplementedError:
            return NOT_ATTEMPTED
        except WholeModelCalled:
            return (
                "calling the model itself hands you logits_per_image ready-made: compute them from "
                "get_image_features and get_text_features, called apart"
            )
        finally:
            whole.forward = forward
        if result is None:
            return NOT_ATTEMPTED
        hint = _clip_hint(result, clip.model, clip.input_ids, clip.pixel_values)
        if hint is not None:
            return hint
    return None


def _letter(key) -> str | None:
    """A line's letter from "a", "A" or "(a)", else None."""
    if not isinstance(key, str):
        return None
    letter = key.strip().strip("()").strip().lower()
    return letter if letter in SUPPORT else None


@exercise("13.2", "the kind of each line of support (a) to (f): measured, source, not checkable here or demonstration")
def support_kinds(answer):
    """{letter: kind} for the six lines of support notebook 13 lists."""
    if not isinstance(answer, dict):
        return 'give a dict {letter: kind}, such as {"a": "source", …}, one entry for each of (a) to (f)'
    given = {}
    for key, kind in answer.items():
        letter = _letter(key)
        if letter is None:
            return f"the keys are the letters a to f, got {key!r}"
        if not isinstance(kind, str) or kind.strip().lower() not in KINDS:
            return f"({letter}): each kind is one of {', '.join(repr(k) for k in KINDS)}, got {kind!r}"
        given[letter] = kind.strip().lower()
    missing = [letter for letter in SUPPORT if letter not in given]
    if missing:
        return f"give a kind for each line: {', '.join(f'({m})' for m in missing)} still missing"
    for letter, kind in SUPPORT.items():
        if given[letter] != kind:
            return SUPPORT_HINTS.get(
                (letter, given[letter]),
                f"({letter}) is not {given[letter]!r}: ask whose code or lines it rests on, and whether it ran",
            )
    return None


def SELF_CHECK():
    """Notebook 13's self-check: the right options computed from the records and the measurements where they can be."""
    seen = what_clip_does(0)
    apart = seen["text ignores the picture"] and seen["picture ignores the text"]
    return (
        Question(
            "Which of these is evidence, in this course's sense, for a claim about TensorRT-LLM?",
            (
                wrong(
                    "this package's engine refuses a 768-row table when built for 512 rows",
                    "this package refusing its own input is a demonstration of the rule, never evidence",
                ),
                right(
                    "run.py's lines, quoted with repository, path and commit",
                    f"upstream source, like the {sum(c.kind == 'source' for c in CLAIMS)} claims settled that way",
                ),
                wrong(
                    "a second article that gives the same figure",
                    "an article repeating a figure is not its source: 1.8× and 92% stay not checkable",
                ),
                wrong(
                    "the notebook printing 'confirmed'",
                    "a printed verdict is only as good as the measurement or the lines it was settled by",
                ),
            ),
        ),
        Question(
            "What does transformers' CLIPModel compute from texts and pictures?",
            (
                wrong(
                    "one sequence of text tokens and patches through one transformer",
                    "that is 'concatenate, then process'; measured, each tower ignores the other's input",
                ),
                right(
                    "two pooled projections, computed apart, and the scaled cosine between them",
                    f"measured: the towers apart ({apart}) and logits = scale × cosine "
                    f"({seen['logits = scale × cosine']})",
                ),
                wrong(
                    "text embeddings in which the picture's patch features replace some tokens",
                    "that is the prompt table's way (Qwen-VL), not CLIP's",
                ),
                wrong(
                    "the text tower reads the patches through cross-attention",
                    "no layer of CLIP sees both inputs: the text embeddings are identical whatever the picture",
                ),
            ),
        ),
        Question(
            "What is run.py's infer_time, the second value generate_for_qwenvl returns?",
            (
                wrong("the time of one decode step", "it times whole generations, setup included"),
                wrong("the time to the first token", "it stops the clock after the last decode step"),
                right("the mean of 10 whole generations of the same answer", "run_time = 10, divided out at the end"),
                wrong("the vision engine's time", "vit_process times the vision engine apart, also over 10 runs"),
            ),
        ),
        Question(
            "Which key of Qwen-VL-Chat's config.json gives the id of </img>?",
            (
                wrong("visual.image_end_id", "config.json has no such key: C12 is only partly confirmed"),
                right(
                    f"none: </img> is visual.image_start_id + 1 = {recorded_start() + 1}",
                    "modeling_qwen.py and run.py both compute it as image_start_id + 1",
                ),
                wrong("image_end_id, beside vocab_size", "the only image id in config.json is visual.image_start_id"),
            ),
        ),
        Question(
            "Article 2 says FP16 saves 40% of GPU memory. What does this course conclude?",
            (
                wrong(
                    "corrected: float16 halves the memory, so the saving is 50%",
                    "weights halve, but a whole-GPU figure holds fixed costs the article does not give",
                ),
                right(
                    "not checkable here: no model, workload or GPU is named, and no GPU memory is measured here",
                    "the CPU measurement in section 4 shows the principle, not the article's figure",
                ),
                wrong(
                    "confirmed: the CPU process shrinks by about 40%",
                    "a CPU process's resident memory is not GPU memory, and the toy model is not the article's",
                ),
            ),
        ),
    )


def recorded_start() -> int:
    """Qwen-VL-Chat's visual.image_start_id, as this package's copy of its config.json holds it."""
    return QWenVLConfig().visual["image_start_id"]
