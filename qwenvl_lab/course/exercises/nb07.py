"""Exercises of notebook 07 (performance and fact check): a benchmark report's speed-up, the KV cache's size, CLIP's
logits; and its self-check."""

import copy
import json

import numpy as np
import torch

from ...checks.values import is_number
from ...clip import small_clip, what_clip_does
from ...modeling import QWenVLConfig
from ...resources import data_dir
from ..claims import CLAIMS
from . import exercise
from .nb03 import NOT_ATTEMPTED, whole_number
from .selfcheck import Question, right, wrong

CLIP_SEEDS = (1, 2)  # exercise 07.3: the random CLIPs a learner's function is checked on
REPORTS = ("h200-qwen-vl-chat-fp16.json", "cpu-toy-fp32.json")  # exercise 07.1: the committed benchmark runs


def _report(name: str) -> dict:
    """A committed benchmark report (data/benchmarks/`name`)."""
    return json.loads((data_dir() / "benchmarks" / name).read_text())


def made_up_report() -> dict:
    """The H200 report with its rows in reverse order and eager's decode speeds changed (a run that never happened):
    a function that reads the report it is given gets other ratios from it."""
    report = copy.deepcopy(_report(REPORTS[0]))
    report["results"].reverse()
    for row in report["results"]:
        if row["method"] == "eager":
            row["decode_tokens_per_s"] *= 1 + row["batch"] / 10
    return report


def _speed(report: dict, method: str, batch: int, key: str = "decode_tokens_per_s") -> float:
    """`key` of the row of `report` whose method is `method` ("eager" or "engine") and whose batch is `batch`."""
    return next(r[key] for r in report["results"] if r["method"] == method and r["batch"] == batch)


def _number(answer) -> float | None:
    """A real number (Python's or numpy's, a one-element tensor), or None for anything else."""
    if isinstance(answer, torch.Tensor) and answer.numel() == 1 and not answer.dtype.is_complex:
        answer = answer.item()
    return float(answer) if is_number(answer) else None


def _close(value: float, expected: float) -> bool:
    """`value` is `expected`, give or take rounding to two decimals."""
    return abs(value - expected) <= 0.006 + 1e-3 * abs(expected)


def _speedup_hint(value: float, report: dict, batch: int, h200: bool) -> str | None:
    """None when `value` is the engine's decode speed over eager's at `batch` in `report`; else what it is instead."""
    expected = _speed(report, "engine", batch) / _speed(report, "eager", batch)
    if _close(value, expected):
        return None
    if _close(value, 1 / expected):
        return "that is eager over the engine: divide the other way round"
    if _close(value, _speed(report, "engine", batch) / _speed(report, "engine", 1)):
        return "that compares the engine with itself at batch 1: compare it with eager, at the same batch"
    if _close(value, _speed(report, "eager", batch, "total_ms") / _speed(report, "engine", batch, "total_ms")):
        return "total_ms includes the prefill (the time to the first token): take decode_tokens_per_s"
    committed = _report(REPORTS[0])
    if not h200 and _close(value, _speed(committed, "engine", batch) / _speed(committed, "eager", batch)):
        return (
            "that is the committed H200 run's ratio, for a report whose numbers differ: read them from the report "
            "your function is given, not from a file or from the notebook's output"
        )
    batches = {r["batch"] for r in report["results"]}
    if any(_close(value, _speed(report, "engine", b) / _speed(report, "eager", b)) for b in batches - {batch}):
        return "that is the ratio at another batch: take the two rows whose batch is the one asked for"
    return "take decode_tokens_per_s of the engine's row and of eager's row whose batch is the one asked for"


@exercise("07.1", "a function: the qwenvl_lab engine's decode speed over eager's at a batch, from a benchmark report")
def engine_over_eager(function):
    """function(report, batch) -> engine's decode tokens/s over eager's at `batch`, on every batch of the committed
    reports and of a made-up one (to two decimals)."""
    if not callable(function):
        return "give a function (report, batch) -> the ratio, such as my_speedup"
    cases = [(_report(name), name == REPORTS[0]) for name in REPORTS] + [(made_up_report(), False)]
    for report, h200 in cases:
        for batch in sorted({r["batch"] for r in report["results"]}):
            try:
                result = function(copy.deepcopy(report), batch)
            except NotImplementedError:
                return NOT_ATTEMPTED
            if result is None:
                return NOT_ATTEMPTED
            value = _number(result)
            if value is None:
                return f"return a number (a ratio, such as 2.5), got {type(result).__name__}"
            hint = _speedup_hint(value, report, batch, h200)
            if hint is not None:
                return hint
    return None


@exercise("07.2", "bytes of Qwen-VL-Chat's float16 KV cache for 4 requests of up to 2048 tokens")
def kv_cache_bytes(answer):
    """2 (K and V) × layers × requests × tokens × hidden × 2 bytes."""
    answer, config = whole_number(answer), QWenVLConfig()
    if answer is None:
        return "give a whole number of bytes (an int)"
    values = 2 * config.num_hidden_layers * 4 * 2048 * config.hidden_size  # K and V of every layer, request, token
    if answer == values:  # K or V alone in float16, or both at one byte a number
        return "that is half of it: keys and values both, at 2 bytes a float16 number"
    if answer == 2 * values * 2:
        return "that is float32's size: float16 takes 2 bytes a number"
    if answer == 2 * values // 4:
        return "that is one request's cache: the question asks for 4"
    if answer != 2 * values:
        return "count K and V, for every layer, every request and every token, hidden_size numbers each, 2 bytes each"
    return None


class WholeModelCalled(Exception):
    """Exercise 07.3's learner called CLIPModel itself, which returns logits_per_image ready-made."""


def _towers_only(*args, **kwargs):
    """CLIPModel.forward while exercise 07.3's function runs: it refuses."""
    raise WholeModelCalled


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


@exercise("07.3", "CLIP's logits_per_image from its two towers, computed apart")
def clip_logits(function):
    """function(model, input_ids, pixel_values) -> [pictures, texts], equal to CLIPModel's logits_per_image."""
    if not callable(function):
        return "give a function (model, input_ids, pixel_values) -> logits [pictures, texts]"
    for seed in CLIP_SEEDS:
        clip = small_clip(seed, texts=3, images=2)
        clip.model.forward = _towers_only  # the towers' own methods work; calling the whole model does not
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
            del clip.model.forward
        if result is None:
            return NOT_ATTEMPTED
        hint = _clip_hint(result, clip.model, clip.input_ids, clip.pixel_values)
        if hint is not None:
            return hint
    return None


def SELF_CHECK():
    """Notebook 07's self-check: the right options computed from the records and the measurements where they can be."""
    seen = what_clip_does(0)
    apart = seen["text ignores the picture"] and seen["picture ignores the text"]
    return (
        Question(
            "Which of these is evidence, in this course's sense, for a claim about TensorRT-LLM?",
            (
                wrong(
                    "this package's engine refuses a 768-row table when built for 512 rows",
                    "this package refusing its own input is a demonstration of the rule, never evidence for TensorRT-LLM",
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
    )


def recorded_start() -> int:
    """Qwen-VL-Chat's visual.image_start_id, as this package's copy of its config.json holds it."""
    return QWenVLConfig().visual["image_start_id"]
