"""Exercises of notebook 07 (performance): a benchmark report's speed-up, the KV cache's size, the bytes one INT8
decode step reads, TensorRT-LLM's per-channel INT8 quantizer written by hand; and its self-check."""

import copy
import json

import torch

from ...checks.values import is_number
from ...engine.build import expected_weights
from ...engine.layers import weight_bytes_per_token
from ...modeling import QWenVLConfig
from ...resources import data_dir
from ...unified_checkpoint import is_quantized, quantize_per_channel, scale_name, trtllm_config
from . import exercise
from .nb03 import NOT_ATTEMPTED, whole_number
from .selfcheck import Question, right, wrong

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
    engine, eager = _speed(report, "engine", batch), _speed(report, "eager", batch)
    expected = engine / eager
    if _close(value, expected):
        return None
    if _close(value, 1 / expected):
        return "that is eager over the engine: divide the other way round"
    if _close(value, 100 * expected):
        return "that is a percentage: return the ratio itself (2.5, not 250)"
    if _close(value, engine - eager):
        return "that is the difference of the two speeds: divide one by the other"
    if value == int(expected):
        return "that is the ratio cut to a whole number: return it as it comes out of the division"
    if abs(value - expected) <= 0.05:
        return "close, but rounded too far: return the ratio unrounded, or to two decimals"
    pct = _speed(report, "engine", batch, "pct_of_limit") / _speed(report, "eager", batch, "pct_of_limit")
    if _close(value, pct):
        return "pct_of_limit is each method's share of the bandwidth limit: take decode_tokens_per_s"
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
    expected = 2 * values  # 2 bytes a float16 number
    if answer == expected:
        return None
    wrong_counts = {
        values: "that is half of it: keys and values both, at 2 bytes a float16 number",  # K or V alone, or 1 byte
        2 * expected: "that is float32's size: float16 takes 2 bytes a number",
        expected // 4: "that is one request's cache: the question asks for 4",
        expected // config.num_hidden_layers: "that is one layer's cache: every layer keeps its own keys and values",
        expected // (4 * 2048): "that is one token's keys and values: count every token of every request",
        expected * 8: "that counts bits: a byte is 8 of them",
        expected * 3072 // 2048: "the requests hold up to 2048 tokens, prompt and answer together",
    }
    if answer in wrong_counts:
        return wrong_counts[answer]
    if answer in (expected // 2**30, expected // 10**9, round(expected / 10**9)):
        return "that is in GiB or GB: give the number of bytes"
    if abs(answer - expected) <= expected // 10:
        return "near, but not exact: give the exact number of bytes, not a rounded one"
    return "count K and V, for every layer, every request and every token, hidden_size numbers each, 2 bytes each"


CHAT = QWenVLConfig()  # Qwen-VL-Chat's shapes: exercise 07.3


def step_bytes(weight_only: bool = True, scales=torch.float16, quantized=is_quantized, embedding_row=True) -> int:
    """Bytes of Qwen-VL-Chat's language-model weights one decode step reads, float16 with `quantized` matrices in int8
    and their scales in `scales` (weight_only), or all in float16; the embedding one row (or whole)."""
    pretrained = trtllm_config(CHAT, "float16", weight_only="int8" if weight_only else None)
    shapes = expected_weights(pretrained)
    dtypes = {name: torch.float16 for name in shapes}
    if weight_only:
        for name in shapes:
            if quantized(name):
                dtypes[name] = torch.int8
                dtypes[scale_name(name)] = scales
        shapes = {name: shape for name, shape in shapes.items() if name in dtypes}
    weights = {name: torch.empty(shape, dtype=dtypes[name], device="meta") for name, shape in shapes.items()}
    total = weight_bytes_per_token(weights)
    if not embedding_row:
        embedding = weights["transformer.vocab_embedding.weight"]
        total += (embedding.shape[0] - 1) * embedding.shape[1] * embedding.element_size()
    return total


@exercise(
    "07.3", "an int: the bytes one INT8 decode step of Qwen-VL-Chat's language model reads, as TensorRT-LLM builds it"
)
def int8_step_bytes(answer):
    """None for the INT8 engine's bytes a step, else what the number counts instead."""
    value = whole_number(answer)
    if value is None:
        return "give one whole number of bytes (an int)"
    expected = step_bytes()
    if value == expected:
        return None
    float16 = step_bytes(weight_only=False)
    wrong = {
        float16: "that is the float16 engine's step: the layers' five matrices are int8 in the INT8 engine",
        float16 // 2: "halving everything makes lm_head, the embedding's row, the norms and the bias int8 too: "
        "TensorRT-LLM keeps lm_head and the embedding in float16 (quantize_layers' exclude_modules)",
        step_bytes(quantized=lambda n: is_quantized(n) or n == "lm_head.weight"): "lm_head stays in float16 in "
        "TensorRT-LLM's weight-only recipe; only the layers' qkv, dense, gate, fc and proj become int8",
        step_bytes(scales=torch.float32): "the scales are stored in the checkpoint's dtype, float16: 2 bytes each",
        step_bytes(embedding_row=False): "a decode step reads one row of the embedding (its token's), not the table",
    }
    scales = sum(
        shape[0] * 2
        for name, shape in expected_weights(trtllm_config(CHAT, "float16", weight_only="int8")).items()
        if name.endswith("per_channel_scale")
    )
    wrong.setdefault(expected - scales, "add the scales: one float16 number per output channel of each int8 matrix")
    if value in wrong:
        return wrong[value]
    if abs(value - expected) < 0.02 * expected:
        return "close: count every tensor the step reads, with its own element size (int8 1 byte, float16 2)"
    return "add up, per layer, the five matrices in int8 and their per-row scales, the norms and the qkv bias in float16, then lm_head, ln_f and one embedding row in float16"


def _cases() -> list[torch.Tensor]:
    """Matrices [out, in] the quantizer is tried on: rows of very different sizes, exact half steps, a row of zeros,
    a row whose maximum is positive (clipped at 127) and one whose maximum is negative (-128, kept)."""
    generator = torch.Generator().manual_seed(44)
    rows = torch.randn(6, 32, generator=generator) * torch.logspace(-2, 1, 6)[:, None]
    halves = torch.tensor([[2.5, -2.5, 0.5, -0.5, 1.5] + [0.0] * 26 + [128.0]]) / 128  # steps of 1/128
    special = torch.zeros(3, 32)
    special[1, :4] = torch.tensor([1.0, -0.5, 0.25, 0.75])  # maximum +1.0 → 128 steps → 127
    special[2, :4] = torch.tensor([-1.0, 0.5, 0.25, 0.75])  # maximum |−1.0| → −128, in range
    return [rows, torch.cat([rows, halves, special]), halves.repeat(4, 1) * torch.tensor([[1.0], [3.0], [7.0], [0.5]])]


def _as_pair(result):
    """(q, scale) from what a learner's function returned, or a hint."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return None, "return two things: (q, scale)"
    q, scale = result
    if not isinstance(q, torch.Tensor) or not isinstance(scale, torch.Tensor):
        return None, "return torch tensors: q (int8) and scale (one per output row)"
    return (q, scale), None


def _scale_hint(scale: torch.Tensor, w: torch.Tensor, expected: torch.Tensor) -> str | None:
    """None when `scale` holds each output row's largest |w| / 128, else what it holds instead."""
    if scale.numel() == 1:
        return "one scale for the whole matrix is per-tensor quantization: TensorRT-LLM keeps one per output row"
    if scale.reshape(-1).shape == (w.shape[1],) and w.shape[0] != w.shape[1]:
        return "that is one scale per input column: take each output row's (dim 1's) largest |w|"
    if scale.reshape(-1).shape != expected.shape:
        return f"scale should hold one number per output row: [{w.shape[0]}]"
    if scale.dtype in (torch.float16, torch.bfloat16) and torch.allclose(
        scale.reshape(-1).float(), expected, rtol=2**-7
    ):
        return (
            f"return the scales in float32, not {scale.dtype}: TensorRT-LLM rounds w / scale with the float32 scale "
            "and only afterwards stores the scales in the weight's dtype"
        )
    scale = scale.reshape(-1).float()
    per_tensor = torch.full_like(scale, float(w.abs().max()) / 128)
    if torch.allclose(scale, per_tensor) and not torch.allclose(scale, expected):
        return "one scale for the whole matrix, repeated for each row, is per-tensor quantization: take each row's own"
    if torch.allclose(scale, expected * 128 / 127):
        return "TensorRT-LLM divides the largest |w| by 128 (2^7), not 127; the +128 that gives is clipped to 127"
    if torch.allclose(scale, expected * 128):
        return "the scale is a step: the largest |w| divided by 128"
    if not torch.allclose(scale, expected):
        return "each row's scale is its largest |w| divided by 128"
    return None


def _q_hint(q: torch.Tensor, w: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor) -> str | None:
    """None when `q` is TensorRT-LLM's int8 of `w` (row scales `scale`), else what went wrong."""
    if q.dtype != torch.int8:
        return f"q should be stored as int8, not {q.dtype}"
    if q.shape != w.shape:
        return f"q keeps the matrix's shape {tuple(w.shape)}"
    if torch.equal(q, expected):
        return None
    if (q == -128).logical_and(expected == 127).any():
        return "a row's positive maximum is 128 steps, one past int8: clip to [-128, 127] before the cast"
    steps = w / scale.clamp(min=1e-30)[:, None]
    halves = steps.abs().frac() == 0.5
    if torch.equal(q[~halves], expected[~halves]):
        return "values exactly half-way between two steps round away from zero in C's round(); torch.round rounds them to even"
    if torch.equal(q.float(), steps.trunc().clamp(-128, 127)):
        return "round to the nearest step: .to(torch.int8) alone truncates toward zero"
    return "q is each w divided by its row's scale, rounded (half away from zero) and clipped to [-128, 127]"


@exercise("07.4", "a function: TensorRT-LLM's weight-only INT8 of a matrix [out, in], returning (q int8, scale [out])")
def per_channel_quantizer(function):
    """None when the learner's function quantizes every test matrix as TensorRT-LLM does, else a hint."""
    if not callable(function):
        return "give a function w -> (q, scale)"
    for w in _cases():
        out = function(w.clone())
        if out is None:
            return NOT_ATTEMPTED
        pair, hint = _as_pair(out)
        if hint:
            return hint
        expected_q, expected_scale = quantize_per_channel(w)
        hint = _scale_hint(pair[1], w, expected_scale) or _q_hint(pair[0], w, expected_q, expected_scale)
        if hint:
            return hint
    return None


def SELF_CHECK():
    """Notebook 07's self-check: the right options computed from the committed H200 report."""
    report = _report(REPORTS[0])
    at_8 = _speed(report, "engine", 8) / _speed(report, "engine", 1)
    return (
        Question(
            f"On the H200 the engine decodes {at_8:.1f}× as many tokens per second at batch 8 as at batch 1. Why so "
            "close to 8×?",
            (
                right(
                    "a decode step reads every weight once for the whole batch, and reading the weights takes the time",
                    "while decoding is bound by memory bandwidth, 8 requests cost about what one costs",
                ),
                wrong(
                    "the 8 requests share one prompt table",
                    "each request brings its own rows, a few MB against 14 GB of weights read every step",
                ),
                wrong(
                    "CUDA graphs are used only from batch 8 on",
                    "the engine replays a step as a CUDA graph at every batch size in the report",
                ),
            ),
        ),
        Question(
            "What sets the bandwidth limit of a decode step?",
            (
                wrong("the number of requests in the batch", "the weights are read once for the whole batch"),
                right(
                    "the bytes of weights a step reads over the GPU's memory bandwidth",
                    f"{report['model']['weight_bytes_per_token'] / 1e9:.1f} GB at {report['bandwidth']['gb_per_s']:.0f} "
                    "GB/s in the committed run",
                ),
                wrong(
                    "the answer's length",
                    "that sets how many steps there are, not how short a step can be",
                ),
            ),
        ),
        Question(
            "The engine's first token comes no sooner than eager's. Why?",
            (
                right(
                    "its prefill is plain PyTorch; its CUDA graphs and Triton kernels cover decoding",
                    "the time to the first token is the prefill's",
                ),
                wrong(
                    "it runs the vision tower first",
                    "both methods receive the same prompt table, made before the clock starts",
                ),
                wrong(
                    "it decodes more slowly than eager",
                    "its decode tokens/s are several times eager's in the same report",
                ),
            ),
        ),
        Question(
            "Why is the engine's peak memory higher than eager's?",
            (
                wrong("it keeps a second copy of the weights", "it reads the same weights in place"),
                right(
                    "it allocates its KV cache for the build limits up front",
                    "max_batch_size × max_seq_len, whatever the requests need",
                ),
                wrong("its prompt table holds every picture it has seen", "each request's table is used and dropped"),
            ),
        ),
    )
