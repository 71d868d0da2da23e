"""Fact checks — the measurements notebooks 07 and 08 settle the articles' claims with (docs/articles.md).

Each function measures something on this machine (shapes through a vision tower, a process's memory, timings, the
course model's answers) or turns measured numbers into a verdict, so that no verdict is typed by hand.

    python -m qwenvl_lab.factcheck memory float16 data/toy-qwen-vl   # one memory measurement (JSON), a fresh process
"""

import copy
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .bench import (
    PeakMemory,
    engine_generate,
    make_requests,
    measure,
    memory_in_use,
    picture_features,
    release_memory,
    timed_runs,
)
from .chat import ModelAsRunner, answer_text, make_prompt
from .checkpoint import load_checkpoint, load_config
from .img_pos import as_batch, locate_img_pos
from .injection import masked_scatter_images, overwrite_image_spans
from .limits import dtype_name
from .prompt_table import prompt_tuning_embedding, single_table_batch
from .tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN
from .toy.shapes import answer_matches
from .vision import VisionTransformer

VERDICTS = ("confirmed", "partly confirmed", "corrected", "not reproduced", "no source")
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Verdict:
    """One claim settled: its id ("C6"), the verdict (one of VERDICTS) and the measured evidence in words."""

    claim: str
    verdict: str
    evidence: str

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


def verdict(claim: str, holds: bool, evidence: str, sourced: bool = True) -> Verdict:
    """'confirmed' when the measurement agrees with the claim; otherwise 'corrected', or 'not reproduced' for a figure
    the article gives without a source."""
    if not isinstance(holds, (bool, np.bool_)):
        raise TypeError(f"holds must be the bool a measurement gave, got {type(holds).__name__}")
    return Verdict(claim, "confirmed" if holds else "corrected" if sourced else "not reproduced", evidence)


def unmeasurable(claim: str, evidence: str) -> Verdict:
    """'no source' for a figure nothing here can measure; `evidence` says what was measured instead."""
    return Verdict(claim, "no source", evidence)


def verdict_range(claim: str, low: float, high: float, measured: dict, what: str) -> Verdict:
    """A claim 'between low and high' against values measured per setting ({setting: value}): confirmed when every
    value lies in the range, partly confirmed when some do, corrected when none does."""
    if not measured or not low <= high:
        raise ValueError(f"give measured values ({{setting: value}}) and low <= high, got {measured!r}, {low}, {high}")
    inside = [k for k, v in measured.items() if low <= v <= high]
    values = ", ".join(f"{v:.2f} at {what} {k}" for k, v in measured.items())
    label = "confirmed" if len(inside) == len(measured) else "partly confirmed" if inside else "corrected"
    where = (
        f"; in {low:g}–{high:g} only at {what} {', '.join(map(str, inside))}" if inside and label != "confirmed" else ""
    )
    return Verdict(claim, label, f"measured {values}{where}")


def verdict_speedup(claim: str, claimed: float, seconds: dict, subject: str) -> Verdict:
    """A figure 'subject is `claimed`× faster than the other methods' (no source) against measured seconds per method:
    confirmed when it is at least that much faster than every other; the evidence says which it was slower than."""
    if subject not in seconds or len(seconds) < 2 or any(not s > 0 for s in seconds.values()):
        raise ValueError(
            f"seconds must hold positive times for {subject!r} and at least one other method, got {seconds!r}"
        )
    ratios = {name: s / seconds[subject] for name, s in seconds.items() if name != subject}  # > 1: subject faster
    slower = [name for name, r in ratios.items() if r < 1]
    times = ", ".join(f"{name} {s * 1e6:.0f} µs" for name, s in seconds.items())
    plain = (
        f"; the {subject} measured slower than {' and '.join(slower)}"
        if slower
        else f"; the {subject} was {min(ratios.values()):.1f}× as fast as the fastest other"
    )
    return verdict(claim, min(ratios.values()) >= claimed, f"{times}{plain}", sourced=False)


def verdict_tradeoff(
    claim: str, saving: float, loss: float, claimed_saving: float, claimed_loss: float, evidence: str
) -> Verdict:
    """A figure 'saves at least claimed_saving for less than claimed_loss' (no source) against a measured saving and
    loss (fractions; a loss > 0 is worse)."""
    return verdict(
        claim,
        saving >= claimed_saving and loss < claimed_loss,
        f"{evidence}: {saving:.0%} saved, accuracy {-loss:+.1%}",
        sourced=False,
    )


def meta_tower(visual_config: dict) -> VisionTransformer:
    """A vision tower with `visual_config`'s shapes and no memory: every parameter on the meta device."""
    with torch.device("meta"):
        tower = VisionTransformer(**visual_config)
    return tower.eval()


def tower_shapes(tower: VisionTransformer, pixels: torch.Tensor) -> dict:
    """Shapes through a forward pass of `tower`, recorded by forward hooks: pixels, patches (after the patch
    convolution), the ViT's output and input_vit, each as (batch, …)."""
    seen = {}

    def patches(module, inputs, out):  # [B, W, h, w]
        seen["patches"] = (out.shape[0], out.shape[2] * out.shape[3], out.shape[1])

    def vit(module, inputs, out):  # [P, B, W]
        seen["ViT output"] = (out.shape[1], out.shape[0], out.shape[2])

    hooks = [tower.conv1.register_forward_hook(patches), tower.transformer.register_forward_hook(vit)]
    try:
        with torch.inference_mode():
            out = tower(pixels.to(tower.conv1.weight.device))
    finally:
        for hook in hooks:
            hook.remove()
    return {
        "pixels": tuple(pixels.shape),
        "patches": seen["patches"],
        "ViT output": seen["ViT output"],
        "input_vit": tuple(out.shape),
    }


def injection_times(model, input_ids, input_vit: torch.Tensor, runs: int = 5, length: int = 20) -> tuple[dict, bool]:
    """Seconds per call of three ways to put the pictures' features in (the prompt-table lookup, Qwen-VL's overwrite
    of the hidden states, masked_scatter over <imgpad> placeholders), each the fastest run's mean of `length` calls,
    and whether all three gave identical embeddings. input_ids: chat ids whose image spans hold the paths."""
    input_ids = as_batch(input_ids)  # [B, L]
    vocab_size, wte = model.config.vocab_size, model.transformer.wte
    fake_ids, table, tasks, task_vocab_size = single_table_batch(input_ids, input_vit, vocab_size)
    padded = input_ids.clone()
    for i, a, b in locate_img_pos(input_ids).tolist():
        padded[i, a + 1 : b] = IMAGE_PAD_ID
    ways = {
        "prompt-table lookup": lambda: prompt_tuning_embedding(
            fake_ids, wte.weight, table, tasks, task_vocab_size, vocab_size
        ),
        "overwrite (Qwen-VL)": lambda: overwrite_image_spans(wte(input_ids), locate_img_pos(input_ids), input_vit),
        "masked_scatter": lambda: masked_scatter_images(wte(padded), padded, input_vit),
    }
    with torch.inference_mode():
        results = [way() for way in ways.values()]
        identical = all(torch.equal(results[0], other) for other in results[1:])
        return {name: timed_runs(way, runs, length, CPU)[0] for name, way in ways.items()}, identical


def engine_throughput(runner, model, batches=(1, 4), new_tokens: int = 12, repeats: int = 2, seed: int = 0) -> dict:
    """Decode tokens/s of the engine `runner` at each batch size, on the benchmark's requests (one picture each,
    features from `model`'s vision tower): {batch: tokens/s}."""
    requests = make_requests(max(batches), model.config.vocab_size, seed)
    table = picture_features(model, max(batches), real=True).reshape(-1, model.config.hidden_size)  # [B·256, H]
    baseline = memory_in_use(runner.device)

    def generate(reqs, rows, n):
        return engine_generate(runner, reqs, rows, n)

    return {
        b: measure(generate, requests[:b], table[: b * IMG_TOKEN_SPAN], new_tokens, repeats, runner.device, baseline)[
            "decode_tokens_per_s"
        ]
        for b in batches
    }


def pool_2x2(input_vit: torch.Tensor) -> torch.Tensor:
    """[N, g², H] → [N, (g/2)², H]: the mean of every 2×2 block of the g×g grid the rows are laid out on."""
    n, rows, hidden = input_vit.shape
    grid = math.isqrt(rows)
    if grid * grid != rows or grid % 2:
        raise ValueError(f"the rows must form a square grid of even side (256 = 16 × 16), got {rows}")
    blocks = input_vit.reshape(n, grid // 2, 2, grid // 2, 2, hidden)
    return blocks.mean(dim=(2, 4)).reshape(n, rows // 4, hidden)


def pooled_back(input_vit: torch.Tensor) -> torch.Tensor:
    """[N, g², H] → [N, g², H]: every 2×2 block replaced by its mean (the picture blurred, the rows as many)."""
    n, rows, hidden = input_vit.shape
    half = math.isqrt(rows) // 2
    pooled = pool_2x2(input_vit).reshape(n, half, 1, half, 1, hidden)
    return pooled.expand(n, half, 2, half, 2, hidden).reshape(n, rows, hidden)


def span_prompt(tokenizer, question: str, rows: int, vocab_size: int) -> list[int]:
    """Chat ids of one picture and a question, the picture's span holding `rows` fake ids V … V + rows - 1."""
    ids = make_prompt(tokenizer, question, ["picture1.png"])[1]
    start, end = ids.index(IMAGE_START_ID), ids.index(IMAGE_END_ID)
    return ids[: start + 1] + list(range(vocab_size, vocab_size + rows)) + ids[end:]


def answers_with_rows(model, tokenizer, examples, input_vit: torch.Tensor, max_new_tokens: int = 16) -> list[str]:
    """Greedy answers of `model` to one-picture examples, example k's picture span reading the rows of input_vit[k]
    ([N, rows, H], any number of rows)."""
    if len(examples) != input_vit.shape[0] or any(len(e.images) != 1 for e in examples):
        raise ValueError(
            f"give one-picture examples, one per block of input_vit ({input_vit.shape[0]}); got "
            f"{len(examples)} examples with {[len(e.images) for e in examples]} pictures"
        )
    prompts = [span_prompt(tokenizer, e.question, input_vit.shape[1], model.config.vocab_size) for e in examples]
    out = ModelAsRunner(model).generate(
        [torch.tensor(ids) for ids in prompts],
        prompt_table=input_vit.to(model.dtype),
        max_new_tokens=max_new_tokens,
        return_dict=True,
    )
    return [
        answer_text(tokenizer, out["output_ids"][r, 0, len(ids) : int(out["sequence_lengths"][r, 0])])
        for r, ids in enumerate(prompts)
    ]


def accuracy(answers, examples) -> float:
    """Exact-match accuracy of answers against their examples (toy.shapes.answer_matches)."""
    if len(answers) != len(examples) or not examples:
        raise ValueError(f"{len(answers)} answers for {len(examples)} examples: give one answer per example")
    return sum(answer_matches(a, e) for a, e in zip(answers, examples)) / len(examples)


def prefill_seconds(model, tokenizer, question: str, input_vit: torch.Tensor, runs: int = 3) -> float:
    """Seconds of one prefill (the forward pass over the prompts) of N prompts asking `question`, prompt k's span
    reading the rows of input_vit[k] ([N, rows, H]): the fastest of `runs`."""
    n, rows, hidden = input_vit.shape
    ids = torch.tensor([span_prompt(tokenizer, question, rows, model.config.vocab_size)] * n)  # [N, L]
    table = input_vit.reshape(n * rows, hidden).to(model.dtype)
    tasks = torch.arange(n, dtype=torch.int32)
    with torch.inference_mode():
        return timed_runs(
            lambda: model(ids, prompt_table=table, tasks=tasks, task_vocab_size=rows, logits_to_keep=1), runs, 1, CPU
        )[0]


def int8_weights(model) -> tuple:
    """A copy of `model` whose language-model nn.Linear weights are rounded to int8 per output row (symmetric, as
    weight-only INT8 stores them) and back, and {"int8": bytes of the int8 weights and their scales, "float32":
    bytes of those weights as the model holds them}."""
    quantized = copy.deepcopy(model)
    sizes = {"int8": 0, "float32": 0}
    linears = [m for name, m in quantized.named_modules() if isinstance(m, nn.Linear) and ".visual." not in f".{name}."]
    with torch.no_grad():
        for linear in linears:
            weight = linear.weight  # [out, in]
            scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(weight.dtype).tiny) / 127  # [out, 1]
            q = torch.round(weight / scale).clamp(-127, 127).to(torch.int8)
            sizes["int8"] += q.numel() * q.element_size() + scale.numel() * scale.element_size()
            sizes["float32"] += weight.numel() * weight.element_size()
            weight.copy_(q.to(weight.dtype) * scale)
    return quantized, sizes


def feature_drift(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """How far `other` lies from `reference` (features of the same pictures): the largest and the mean absolute
    difference, and the cosine similarity of the flattened features, in float64."""
    if reference.shape != other.shape:
        raise ValueError(
            f"compare features of the same pictures: shapes {tuple(reference.shape)} and {tuple(other.shape)} differ"
        )
    a, b = reference.detach().double().cpu(), other.detach().double().cpu()
    diff = (a - b).abs()
    return {
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "cosine": float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)),
    }


def loaded_memory(dtype: str, checkpoint) -> dict:
    """In this process: resident bytes before and after loading `checkpoint` in `dtype` (every weight read once, as a
    forward pass reads them), and the peak above that during a prefill of 4 prompts of 300 ids."""
    release_memory(CPU)
    before = memory_in_use(CPU)
    model = load_checkpoint(checkpoint, dtype=dtype)
    with torch.inference_mode():
        for parameter in model.parameters():  # weights the loader mapped from the file stay on disk until read
            parameter.sum()
    release_memory(CPU)
    loaded = memory_in_use(CPU)
    ids = torch.randint(0, 151643, (4, 300))  # 4 prompts of 300 text ids
    with PeakMemory(CPU, loaded) as peak, torch.inference_mode():
        model(ids, use_cache=True, logits_to_keep=1)
    return {
        "dtype": dtype,
        "before": before,
        "loaded": loaded,
        "model": loaded - before,
        "prefill": peak.peak,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def memory_by_dtype(dtypes, checkpoint) -> dict:
    """Resident memory of `checkpoint` loaded in each dtype, each in a fresh process (started together):
    {dtype: {"before", "loaded", "model", "prefill", "parameters"}}, bytes."""
    checkpoint = Path(checkpoint)
    load_config(checkpoint)  # a missing or broken checkpoint is refused here, not in the children
    dtypes = [dtype_name(d) for d in dtypes]
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "qwenvl_lab.factcheck", "memory", d, str(checkpoint)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for d in dtypes
    ]
    results = {}
    for dtype, child in zip(dtypes, children):
        out, _ = child.communicate()
        if child.returncode:
            raise subprocess.CalledProcessError(child.returncode, child.args, out)
        results[dtype] = json.loads(out)
    return results


def main(argv=None) -> None:
    """`memory DTYPE CHECKPOINT`: print loaded_memory's JSON (what memory_by_dtype runs in each fresh process)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "memory":
        raise SystemExit("usage: python -m qwenvl_lab.factcheck memory DTYPE CHECKPOINT")
    torch.set_num_threads(1)
    print(json.dumps(loaded_memory(dtype_name(argv[1]), argv[2])))


if __name__ == "__main__":
    main()
