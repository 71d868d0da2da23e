"""Fact checks — the articles' claims (`CLAIMS`, docs/articles.md's table) and the measurements and demonstrations
notebooks 07, 08 and 13 run.

Each claim records the one kind of evidence that settles it: a measurement on code or hardware this project did not
write (PyTorch, transformers, the CPU or GPU), the upstream source lines docs/articles.md quotes, or "not checkable
here". A verdict that rests on a measurement is recomputed in notebook 13 and must agree with the recorded one
(`settle`).

    python -m qwenvl_lab.course.factcheck table                             # docs/articles.md's claims table (Markdown)
    python -m qwenvl_lab.course.factcheck memory float16 data/toy-qwen-vl   # one memory measurement (JSON), a fresh process
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
import torch.nn.functional as F
from torch import nn

from ..bench import (
    PeakMemory,
    engine_generate,
    make_requests,
    measure,
    memory_in_use,
    picture_features,
    release_memory,
    timed_runs,
)
from ..chat import ModelAsRunner, answer_inputs, make_prompt, prompt_inputs
from ..checkpoint import load_checkpoint, load_config
from ..checks.tensors import as_batch, dtype_name
from ..img_pos import locate_img_pos
from ..prompt_table import prompt_tuning_embedding, rows_read, single_table_batch
from ..tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, IMG_TOKEN_SPAN
from ..toy.shapes import answer_matches
from ..vision import VisionTransformer
from .claims import Claim, check_verdict, claims_table, recorded

CPU = torch.device("cpu")


@dataclass(frozen=True)
class Verdict:
    """A verdict computed from a measurement: the claim's id ("C5"), the verdict (one of VERDICTS), what was measured."""

    claim: str
    verdict: str
    evidence: str

    def __post_init__(self):
        check_verdict(self.verdict)


def verdict(claim: str, holds: bool, evidence: str, sourced: bool = True) -> Verdict:
    """'confirmed' when the measurement agrees with the claim; otherwise 'corrected', or 'not reproduced' for a figure
    the article gives without a source."""
    if not isinstance(holds, (bool, np.bool_)):
        raise TypeError(f"holds must be the bool a measurement gave, got {type(holds).__name__}")
    return Verdict(claim, "confirmed" if holds else "corrected" if sourced else "not reproduced", evidence)


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


def verdict_parts(claim: str, parts: dict, evidence: str) -> Verdict:
    """A claim of several parts against what was measured of each ({part: True, False, or None where it is not
    checkable here}): confirmed when every part was measured and holds, corrected when every measured part fails,
    partly confirmed otherwise (some hold, or some could not be measured)."""
    if not parts or not all(v is None or isinstance(v, (bool, np.bool_)) for v in parts.values()):
        raise ValueError(f"give each part True, False or None (not checkable here), got {parts!r}")
    measured = [bool(v) for v in parts.values() if v is not None]
    if not measured:
        raise ValueError(f"{claim}: no part was measured: its evidence is 'not checkable here', not a verdict")
    if len(measured) == len(parts) and all(measured):
        label = "confirmed"
    else:
        label = "partly confirmed" if any(measured) else "corrected"
    said = {True: "holds", False: "does not hold", None: "not checkable here"}
    said = "; ".join(f"{part}: {said[None if v is None else bool(v)]}" for part, v in parts.items())
    return Verdict(claim, label, f"{evidence} ({said})")


def settle(result: Verdict) -> Claim:
    """The recorded claim a measurement settles, once the measured verdict is the recorded one (else ValueError: the
    measurement no longer supports what docs/articles.md states)."""
    claim = recorded(result.claim)
    if claim.kind != "measured":
        raise ValueError(f"{claim.id} rests on {claim.kind} evidence, not on a measurement: show its source instead")
    if result.verdict != claim.verdict:
        raise ValueError(
            f"{claim.id}: the measurement gives '{result.verdict}' ({result.evidence}) but docs/articles.md records "
            f"'{claim.verdict}': look at the measurement, then correct factcheck.CLAIMS and the docs together"
        )
    return claim


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


def gather_seconds(table_rows, ids: int = IMG_TOKEN_SPAN, hidden: int = 128, runs: int = 5, length: int = 50) -> dict:
    """Seconds per call of PyTorch's embedding gather of `ids` consecutive rows (the table's last block, where a
    request's rows would sit) from a random table of each size in `table_rows`: {rows: the fastest run's mean}."""
    seconds = {}
    with torch.inference_mode():
        for rows in table_rows:
            if rows < ids:
                raise ValueError(f"a table of {rows} rows cannot hold a block of {ids} ids")
            table = torch.randn(rows, hidden)  # [rows, H]
            block = torch.arange(rows - ids, rows)  # [ids]
            seconds[rows] = timed_runs(lambda b=block, t=table: F.embedding(b, t), runs, length, CPU)[0]
    return seconds


def bare_injections(model, input_ids, input_vit: torch.Tensor) -> dict:
    """Three ways to put the pictures' features into the embeddings, each as the bare PyTorch operations its runtime
    runs on every forward (no checks), from the ids that runtime receives: {name: call returning [B, L, H]}.

    - TensorRT-LLM's PromptTuningEmbedding formula, from fake ids: a mask of ids >= vocab_size, two gathers, a where;
    - Qwen-VL's forward: embed the ids, find <img>/</img>, overwrite the rows between them;
    - transformers (vLLM assigns the same rows through a boolean mask): embed <imgpad> placeholders, masked_scatter
      the features into them.
    """
    input_ids = as_batch(input_ids)  # [B, L] chat ids whose image spans hold the paths
    vocab_size, wte = model.config.vocab_size, model.transformer.wte.weight  # wte: [V, H]
    fake_ids, table, tasks, task_vocab_size = single_table_batch(input_ids, input_vit, vocab_size)
    padded = input_ids.clone()
    for i, a, b in locate_img_pos(input_ids).tolist():
        padded[i, a + 1 : b] = IMAGE_PAD_ID
    features = input_vit.reshape(-1, input_vit.shape[-1])  # [N·256, H]

    def lookup():
        prompt = fake_ids > vocab_size - 1  # [B, L]
        normal = F.embedding(torch.where(prompt, vocab_size - 1, fake_ids), wte)
        rows = F.embedding(torch.where(prompt, rows_read(fake_ids, tasks, task_vocab_size, vocab_size), 0), table)
        return torch.where(prompt[..., None], rows, normal)

    def overwrite():
        hidden = F.embedding(input_ids, wte)
        starts, ends = torch.where(input_ids == IMAGE_START_ID), torch.where(input_ids == IMAGE_START_ID + 1)
        for k, (i, a, b) in enumerate(zip(starts[0].tolist(), starts[1].tolist(), ends[1].tolist())):
            hidden[i, a + 1 : b] = input_vit[k]
        return hidden

    def scatter():
        hidden = F.embedding(padded, wte)
        return hidden.masked_scatter((padded == IMAGE_PAD_ID)[..., None].expand_as(hidden), features)

    return {"prompt-table lookup": lookup, "overwrite (Qwen-VL)": overwrite, "masked_scatter (transformers)": scatter}


def injection_times(model, input_ids, input_vit: torch.Tensor, runs: int = 5, length: int = 20) -> tuple[dict, bool]:
    """Seconds per call of the three bare injections (`bare_injections`), of the vocabulary gather alone they all
    start with, and of this package's `prompt_tuning_embedding` with its checks (bounds, NaN and inf, dtypes): each
    the fastest run's mean of `length` calls; and whether all give identical embeddings."""
    ways = bare_injections(model, input_ids, input_vit)
    vocab_size, wte = model.config.vocab_size, model.transformer.wte.weight
    fake_ids, table, tasks, task_vocab_size = single_table_batch(as_batch(input_ids), input_vit, vocab_size)
    checked = {
        "vocabulary gather alone": lambda: F.embedding(as_batch(input_ids), wte),
        "prompt_tuning_embedding (with checks)": lambda: prompt_tuning_embedding(
            fake_ids, wte, table, tasks, task_vocab_size, vocab_size
        ),
    }
    with torch.inference_mode():
        results = [way() for way in [*ways.values(), checked["prompt_tuning_embedding (with checks)"]]]
        identical = all(torch.equal(results[0], other) for other in results[1:])
        seconds = {name: timed_runs(way, runs, length, CPU)[0] for name, way in {**ways, **checked}.items()}
    return seconds, identical


def engine_throughput(runner, model, batches=(1, 4), new_tokens: int = 12, repeats: int = 2) -> dict:
    """Decode tokens/s of the engine `runner` at each batch size, on the benchmark's requests (one picture each,
    features from `model`'s vision tower): {batch: tokens/s}."""
    input_vit = picture_features(model, max(batches), real=True)  # [B, 256, H]
    requests, table = make_requests(input_vit, model.config.vocab_size)  # table [B·256, H]
    baseline = memory_in_use(runner.device)

    def generate(reqs, rows, n):
        return engine_generate(runner, reqs, rows, n)

    return {
        b: measure(
            generate, requests[:b], table[: b * input_vit.shape[1]], new_tokens, repeats, runner.device, baseline
        )["decode_tokens_per_s"]
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


def span_prompt(tokenizer, question: str, rows: int) -> list[int]:
    """Chat ids of one picture and a question, the picture's span holding `rows` ids (<imgpad>) instead of 256."""
    ids = make_prompt(tokenizer, question, ["picture1.png"])[1]
    start, end = ids.index(IMAGE_START_ID), ids.index(IMAGE_END_ID)
    return ids[: start + 1] + [IMAGE_PAD_ID] * rows + ids[end:]


def answers_with_rows(model, tokenizer, examples, input_vit: torch.Tensor, max_new_tokens: int = 16) -> list[str]:
    """Greedy answers of `model` to one-picture examples, example k's picture span reading the rows of input_vit[k]
    ([N, rows, H], any number of rows)."""
    if len(examples) != input_vit.shape[0] or any(len(e.images) != 1 for e in examples):
        raise ValueError(
            f"give one-picture examples, one per block of input_vit ({input_vit.shape[0]}); got "
            f"{len(examples)} examples with {[len(e.images) for e in examples]} pictures"
        )
    runner = ModelAsRunner(model)
    prompts = [span_prompt(tokenizer, e.question, input_vit.shape[1]) for e in examples]
    return answer_inputs(runner, tokenizer, prompt_inputs(runner, prompts, input_vit), max_new_tokens)


def accuracy(answers, examples) -> float:
    """Exact-match accuracy of answers against their examples (toy.shapes.answer_matches)."""
    if len(answers) != len(examples) or not examples:
        raise ValueError(f"{len(answers)} answers for {len(examples)} examples: give one answer per example")
    return sum(answer_matches(a, e) for a, e in zip(answers, examples)) / len(examples)


def prefill_seconds(model, tokenizer, question: str, input_vit: torch.Tensor, runs: int = 3) -> float:
    """Seconds of one prefill (the forward pass over the prompts) of N prompts asking `question`, prompt k's span
    reading the rows of input_vit[k] ([N, rows, H]): the fastest of `runs`."""
    n, rows, hidden = input_vit.shape
    prompts = [span_prompt(tokenizer, question, rows)] * n
    ids, table, tasks, task_vocab_size = prompt_inputs(ModelAsRunner(model), prompts, input_vit)
    ids = torch.stack(ids)  # [N, L]: the prompts are equally long
    with torch.inference_mode():
        return timed_runs(
            lambda: model(ids, prompt_table=table, tasks=tasks, task_vocab_size=task_vocab_size, logits_to_keep=1),
            runs,
            1,
            CPU,
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
            [sys.executable, "-m", "qwenvl_lab.course.factcheck", "memory", d, str(checkpoint)],
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
    """`table`: print docs/articles.md's claims table; `memory DTYPE CHECKPOINT`: print loaded_memory's JSON (what
    memory_by_dtype runs in each fresh process)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["table"]:
        print(claims_table())
        return
    if len(argv) != 3 or argv[0] != "memory":
        raise SystemExit("usage: python -m qwenvl_lab.course.factcheck table | memory DTYPE CHECKPOINT")
    torch.set_num_threads(1)
    print(json.dumps(loaded_memory(dtype_name(argv[1]), argv[2])))


if __name__ == "__main__":
    main()
