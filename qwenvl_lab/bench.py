"""Notebook 07 — the benchmark: eager `generate` against the engine — TTFT, decode speed, bandwidth limit, memory.

    python -m qwenvl_lab.bench --model toy --device cpu --batch 1 2 4 8 --new-tokens 32 --json toy-cpu.json
    python -m qwenvl_lab.bench --model qwen-vl-chat --device cuda --dtype float16 --json data/benchmarks/h200.json
    python -m qwenvl_lab.bench --model toy --kv-cache-reuse --json data/benchmarks/kv_cache_reuse/cpu-toy-fp32.json

Both sides get the same prompts (chat layout, one picture each as fake ids + a prompt table) and generate greedily
without stopping. The vision tower is not timed: the pictures' features are computed once (random at Qwen-VL-Chat
size, whose tower is a one-layer stub here). The limit is weight bytes read per decode step ÷ the bandwidth a
matrix-vector product over the largest weight matrix reaches (in its faster memory layout), measured in the same run:
the best of three probes, before the eager runs and before and after the engine's. A probe is timed the way decode
speed is: runs of as many products in a row as a run has decode steps, the fastest run's mean kept (`--repeats` runs;
the fastest single product, a peak that a run of steps does not sustain on a shared CPU, is reported beside it).
CPU peak memory is the resident set above what the process held before that side's weights were loaded; CUDA peak
memory is allocated memory. The engine's decode step is also timed with its matrix products alone (batch 1, as the
engine runs them, nothing between them, timed the same way): how close to the limit its design could get without
its other work. `--weight-only int8` also builds the same model's weight-only INT8 engine (int8 layer matrices with
one scale per output channel, as TensorRT-LLM's `--use_weight_only --weight_only_precision int8`) and measures it in
the same run beside the float engine: speed, the limit of its own bytes, peak memory, time to first token, and how
far its residual stream after each layer and its logits drift from the float engine's on the same prompts.
`--kv-cache-reuse` measures instead what KV-cache block reuse gains where it is right (`reuse_gain`).
"""

import argparse
import copy
import ctypes
import gc
import importlib.util
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from tqdm.auto import tqdm

from . import files, options
from .chat import Conversation, GenerationSettings, make_prompt
from .checkpoint import load_checkpoint, make_tiny_checkpoint
from .checks.tensors import WEIGHT_ONLY, to_torch_dtype
from .engine import BuildConfig, ModelRunner, build_engine, verify_engine
from .engine.cuda_graphs import KV_BUCKET, kv_bucket
from .engine.decode import BACKENDS, FAST_PATH
from .engine.layers import matrix
from .layout import to_trtllm_names
from .modeling import QWEN_VL_CHAT_VISUAL, QWenLMHeadModel, QWenVLConfig
from .options import Parser
from .prompt_table import prompt_tuning_embedding, single_table_batch
from .resources import images_dir, machine
from .tokenizing import (
    ENDOFTEXT_ID,
    IMG_TOKEN_SPAN,
    load_tokenizer,
)
from .toy import TOY_DIR
from .unified_checkpoint import trtllm_config, weight_only_quantize

MODELS = ("toy", "tiny", "qwen-vl-chat")
MAX_TURNS = 32  # --turns: a chat of more re-sends a history longer than Qwen-VL's positions
IMAGES_DIR = images_dir()
JSON_WRITER = files.writer("bench --json", "the benchmark's results")
MAX_THREADS = 1024  # --threads: more than any machine the benchmark runs on has cores


def parser() -> Parser:
    """`qwenvl-lab bench`'s options."""

    parser = Parser(prog="qwenvl-lab bench", description=__doc__.split("\n")[0], check=check_options)
    parser.add_argument(
        "--model",
        choices=MODELS,
        default="toy",
        help="toy: data/toy-qwen-vl; tiny: a random tiny "
        "checkpoint; qwen-vl-chat: Qwen-VL-Chat's size with random weights, built on the device",
    )
    parser.add_argument(
        "--checkpoint",
        type=options.folder_with("config.json", "a Qwen-VL checkpoint directory"),
        help="use this checkpoint directory instead of --model's",
    )
    parser.add_argument("--device", type=options.device, default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="engine and eager dtype (default float32 on cpu, float16 on cuda)",
    )
    parser.add_argument(
        "--batch", type=options.whole(1), nargs="+", default=[1, 2, 4, 8], help="batch sizes (default 1 2 4 8)"
    )
    parser.add_argument(
        "--new-tokens", type=options.whole(2), default=32, help="tokens generated per request (default 32)"
    )
    parser.add_argument(
        "--repeats", type=options.whole(1), default=3, help="timed runs per measurement, best kept (default 3)"
    )
    parser.add_argument("--threads", type=options.whole(1, MAX_THREADS), help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-eager", action="store_true", help="measure the engine only")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        help="the engine's decode back end (default: the device's fast path, "
        + ", ".join(f"{name} on {device}" for device, name in FAST_PATH.items())
        + ")",
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="replay the engine's decode steps as CUDA graphs (default: on with --device cuda)",
    )
    parser.add_argument(
        "--weight-only",
        choices=sorted(WEIGHT_ONLY),
        help="also measure the weight-only engine of this precision beside the float one, in the same run (its "
        "layer matrices in int8, one scale per output channel; activations and KV cache in --dtype), and its drift "
        "from the float engine",
    )
    parser.add_argument(
        "--drift-steps",
        type=options.whole(1),
        help="with --weight-only: decode steps over which the logits' drift is measured (default 32, at most "
        "--new-tokens - 1)",
    )
    parser.add_argument("--seed", type=options.whole(0, options.SEED_MAX), default=0)
    parser.add_argument(
        "--first-answer",
        action="store_true",
        help="also time a fresh process's first answer: cold, then with the kernel choices the cold one "
        "tuned and saved (ModelRunner.warm_up), each from loading the engine to the answer",
    )
    # the fresh process of --first-answer; its tuning file
    parser.add_argument("--first-answer-child", type=options.output_file, help=argparse.SUPPRESS)
    parser.add_argument(
        "--integrity",
        action="store_true",
        help="instead: time loading --model's engine directory with verify='none', 'quick' and 'full', the checksum "
        "throughput, and what that makes for a full-size Qwen-VL-Chat engine",
    )
    parser.add_argument(
        "--kv-cache-reuse",
        action="store_true",
        help="instead: time to first token and prefill ids computed without and with KV-cache block reuse, in a "
        "chat about one picture (--turns, answers of --new-tokens) and for batches of questions about one picture "
        "(--batch)",
    )
    parser.add_argument(
        "--turns",
        type=options.whole(2, MAX_TURNS),
        help="turns of the --kv-cache-reuse chat, each re-sending the history (default 4)",
    )
    parser.add_argument(
        "--chat-turns",
        type=options.whole(1, 100_000),
        nargs="+",
        help="instead: seconds of one more turn of a piped chat (cat questions.txt | qwenvl-lab chat) after each of "
        "these numbers of turns, on --model's engine built for 640 ids (the best of --repeats turns there)",
    )
    parser.add_argument(
        "--json",
        type=options.output_file,
        help="write the results as JSON here (a new file in a folder that exists, or --overwrite)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the --json file if it exists")
    return parser


def check_options(parser, args) -> None:
    """The checks that span several of bench's options, each refused with parser.error; fills in --drift-steps' and
    --turns' defaults."""
    if args.model == "qwen-vl-chat" and args.checkpoint is None and torch.device(args.device).type != "cuda":
        parser.error("--model qwen-vl-chat makes a 7.7-billion-parameter language model: run it with --device cuda")
    if args.json is not None:
        try:  # checked before the benchmark runs, not after
            files.check_destination(args.json, JSON_WRITER, folder=False, overwrite=args.overwrite, need_bytes=2**20)
        except (OSError, ValueError) as err:
            parser.error(f"--json {str(args.json)!r}: {err}")
    args.drift_steps = min(32, args.new_tokens - 1) if args.drift_steps is None else args.drift_steps
    if args.drift_steps >= args.new_tokens:
        parser.error(f"--drift-steps must be below --new-tokens ({args.new_tokens}), got {args.drift_steps}")
    if args.weight_only is not None and args.backend == "numba":
        parser.error(f"--backend numba reads float32 weights only: leave it out with --weight-only {args.weight_only}")
    if args.weight_only is not None and args.first_answer:
        parser.error("--first-answer times the float engine alone: run it without --weight-only")
    check_reuse_options(parser, args)


def check_reuse_options(parser, args) -> None:
    """--kv-cache-reuse and --chat-turns are measurements of their own; --turns goes with --kv-cache-reuse."""
    if args.kv_cache_reuse and (args.integrity or args.first_answer or args.chat_turns):
        parser.error(
            "--kv-cache-reuse is a measurement of its own: leave out --integrity, --first-answer, --chat-turns"
        )
    if args.turns is not None and not args.kv_cache_reuse:
        parser.error("--turns sets the chat of --kv-cache-reuse: give both, or leave --turns out")
    args.turns = 4 if args.turns is None else args.turns
    positions = QWenVLConfig().max_position_embeddings
    if args.kv_cache_reuse and chat_length(args.turns, args.new_tokens) > positions:
        parser.error(
            f"--turns {args.turns} with --new-tokens {args.new_tokens} make a chat of "
            f"{chat_length(args.turns, args.new_tokens)} ids, past Qwen-VL's {positions} positions: ask for fewer"
        )


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options, checked, with the defaults that follow from the device filled in."""
    args = parser().parse_args(argv)
    device = torch.device(args.device)
    args.dtype = args.dtype or ("float16" if device.type == "cuda" else "float32")
    fast = FAST_PATH.get(device.type, "torch")
    if args.weight_only is not None and fast == "numba":
        fast = "torch"  # both engines on one back end: the CPU's fast path reads no int8
    args.backend = args.backend or fast  # the benchmark measures the fast path
    args.cuda_graphs = device.type == "cuda" if args.cuda_graphs is None else args.cuda_graphs
    return args


def synchronize(device: torch.device) -> None:
    """Wait for the device (CUDA work is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rss_bytes() -> int:
    """Resident memory of this process now (Linux /proc; else the lifetime peak)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakMemory:
    """Peak memory in use during a block, above `baseline`: CUDA allocator stats, or peak RSS (reset via clear_refs)."""

    def __init__(self, device: torch.device, baseline: int):
        self.device, self.baseline, self.peak = device, baseline, 0

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")  # Linux: peak RSS := current RSS
            except OSError:
                pass
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            synchronize(self.device)
            self.peak = max(0, torch.cuda.max_memory_allocated(self.device) - self.baseline)
        else:
            status = Path("/proc/self/status").read_text() if Path("/proc/self/status").exists() else ""
            hwm = [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM")]
            peak = hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.peak = max(0, peak - self.baseline)  # 0: nothing held above the baseline (memory was given back)


def release_memory(device: torch.device) -> None:
    """Give freed memory back (CUDA cache; glibc's heap via malloc_trim) so the next peak starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def memory_in_use(device: torch.device) -> int:
    """What the peak is measured above: allocated CUDA memory, or this process's RSS."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else rss_bytes()


def timed_runs(call, runs: int, length: int, device: torch.device) -> tuple[float, float]:
    """Seconds of `call()` made `length` times in a row, `runs` times: (the fastest run's mean, the fastest single
    call). A run's mean is how the engine's decode speed is timed (its steps one after another); on a GPU from CUDA
    events between the calls, so no launch or sync overhead outside them."""
    best_run = best_single = float("inf")
    for _ in range(runs):
        synchronize(device)
        if device.type == "cuda":
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(length + 1)]
            marks[0].record()
            for mark in marks[1:]:
                call()
                mark.record()
            marks[-1].synchronize()
            times = [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
        else:
            marks = [time.perf_counter()]
            for _ in range(length):
                call()
                marks.append(time.perf_counter())
            times = [b - a for a, b in zip(marks, marks[1:])]
        best_run, best_single = min(best_run, sum(times) / length), min(best_single, min(times))
    return best_run, best_single


def bandwidth_probe(weight: torch.Tensor, runs: int, length: int) -> dict:
    """Bandwidth of the fastest matrix-vector product over `weight` [out, in] (the library's in either memory layout,
    and on a GPU with Triton also the engine's own kernel), timed like the engine's decode: the fastest of `runs`
    runs of `length` products in a row (gb_per_s); peak_gb_per_s is the fastest single product's."""
    x = torch.randn(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    layouts = {
        "[out, in]": (weight.contiguous(), lambda w: F.linear(x, w)),
        "[in, out]": (weight.t().contiguous(), lambda w: x @ w),
    }
    if weight.device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        from .engine.decode.triton_linear import fused_linear  # noqa: PLC0415 — triton is optional

        layouts["[out, in], Triton"] = (layouts["[out, in]"][0], lambda w: fused_linear(x, w))
    timings = {}
    with torch.inference_mode():
        for layout, (matrix, product) in layouts.items():
            for _ in range(3):
                product(matrix)
            timings[layout] = timed_runs(lambda p=product, m=matrix: p(m), runs, length, weight.device)
    layout = min(timings, key=lambda name: timings[name][0])
    size = weight.numel() * weight.element_size()
    return {
        "matrix": f"lm_head.weight {list(weight.shape)} {str(weight.dtype).removeprefix('torch.')}",
        "layout": layout,
        "bytes": size,
        "products_per_run": length,
        "seconds": timings[layout][0],
        "gb_per_s": size / timings[layout][0] / 1e9,
        "peak_gb_per_s": size / min(single for _, single in timings.values()) / 1e9,
        "gb_per_s_by_layout": {name: size / run / 1e9 for name, (run, _) in timings.items()},
    }


def products_alone(runner, runs: int, length: int) -> float:
    """Seconds of one decode step's matrix products alone at batch 1 (every layer's four and `lm_head`, nothing
    between them), timed like the engine's steps (the fastest run's mean): the ceiling of the engine's design. With
    the "triton" back end its kernels, else PyTorch's products (numba's kernel runs the layers' products as loops of
    its own, not timed apart); on CUDA in one graph."""
    engine = runner.engine
    layer0, device = engine.layers[0], engine.device

    def rows(width):
        return torch.randn(1, width, dtype=engine.dtype, device=device)

    x, attn, mlp = rows(layer0.qkv_t.shape[0]), rows(layer0.dense_t.shape[0]), rows(layer0.proj_t.shape[0])
    if runner.backend == "triton":
        from .engine.decode.triton_linear import fused_linear as linear  # noqa: PLC0415 — triton is optional

        residual = torch.zeros(1, x.shape[1], device=device)

        def step():
            for layer in engine.layers:
                linear(x, layer.qkv_t.t(), layer.qkv_b, scale=layer.qkv_s)
                linear(attn, layer.dense_t.t(), out=residual, scale=layer.dense_s)
                linear(x, layer.gate_fc_t.t(), swiglu=True, scale=layer.gate_fc_s)
                linear(mlp, layer.proj_t.t(), out=residual, scale=layer.proj_s)
            linear(x, engine.lm_head_t.t(), dtype=torch.float32)
    else:

        def step():
            for layer in engine.layers:
                torch.addmm(layer.qkv_b, x, matrix(layer.qkv_t, layer.qkv_s, x.dtype))
                torch.addmm(x, attn, matrix(layer.dense_t, layer.dense_s, x.dtype))
                x @ matrix(layer.gate_fc_t, layer.gate_fc_s, x.dtype)
                torch.addmm(x, mlp, matrix(layer.proj_t, layer.proj_s, x.dtype))
            x @ engine.lm_head_t

    with torch.inference_mode():
        run = step
        if device.type == "cuda":
            side = torch.cuda.Stream(device=device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                step()  # warm-up (and the autotuner) outside the capture
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            run = graph.replay
        for _ in range(2):
            run()
        return timed_runs(run, runs, length, device)[0]


def qwen_vl_chat_model(device: torch.device, dtype: torch.dtype) -> QWenLMHeadModel:
    """Qwen-VL-Chat's language model at full size with random weights, made on the device (vision: a 1-layer stub)."""
    config = QWenVLConfig(visual=dict(QWEN_VL_CHAT_VISUAL, layers=1))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = QWenLMHeadModel(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


QUESTION, MORE = "What is in the picture?", " Say more about it."  # request i: QUESTION, then MORE (5 ids) i times


def make_requests(input_vit: torch.Tensor, vocab_size: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(requests, prompt_table): one chat turn per picture of input_vit [B, rows, H], laid out by `make_prompt` (the
    system turn, the picture, a question longer by a few ids each request, so that the requests differ in length),
    its span's fake ids and the one table from `single_table_batch` (run.py's convention: request i reads rows
    rows·i…, so the first b requests read the table's first b·rows rows)."""
    tokenizer = load_tokenizer()
    names = [p.name for p in sorted(IMAGES_DIR.glob("*.png"))]  # what each span holds: its picture's file name
    prompts = [
        make_prompt(tokenizer, QUESTION + MORE * i, [names[i % len(names)]])[1] for i in range(input_vit.shape[0])
    ]
    batch = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(ids) for ids in prompts], batch_first=True, padding_value=ENDOFTEXT_ID
    )  # [B, L]
    ids, table, _, _ = single_table_batch(batch, input_vit, vocab_size)  # table [B·rows, H]
    return [ids[r, : len(p)] for r, p in enumerate(prompts)], table


def picture_features(model: QWenLMHeadModel, count: int, real: bool) -> torch.Tensor:
    """input_vit [count, 256, H]: the model's vision tower on data/images, or random features of the embeddings' scale."""
    visual, wte = model.transformer.visual, model.transformer.wte.weight
    if real:
        pictures = sorted(IMAGES_DIR.glob("*.png"))
        with torch.inference_mode():
            return visual.encode([pictures[i % len(pictures)] for i in range(count)]).to(wte.dtype)
    scale = wte[:4096].float().std()  # a sample of rows is enough
    return (torch.randn(count, IMG_TOKEN_SPAN, wte.shape[1], device=wte.device) * scale).to(wte.dtype)


def eager_generate(model, requests, table, new_tokens: int) -> torch.Tensor:
    """transformers `generate` on the left-padded batch with the prompt table: new tokens [B, new_tokens]."""
    width = max(len(ids) for ids in requests)
    input_ids = torch.full((len(requests), width), ENDOFTEXT_ID, dtype=torch.long)
    mask = torch.zeros(len(requests), width, dtype=torch.long)
    for i, ids in enumerate(requests):
        input_ids[i, width - len(ids) :], mask[i, width - len(ids) :] = ids, 1
    device = table.device
    out = model.generate(
        input_ids.to(device),
        attention_mask=mask.to(device),
        prompt_table=table,
        tasks=torch.zeros(len(requests), dtype=torch.int32, device=device),
        task_vocab_size=IMG_TOKEN_SPAN,
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=ENDOFTEXT_ID,
    )
    return out[:, width:]


def session_arguments(table, count: int, new_tokens: int) -> dict:
    """Runner.generate's arguments for `count` requests in the python-session convention (tasks 0, one table),
    greedy with no stopping (end_id -1) for `new_tokens` tokens."""
    return {
        "prompt_table": table,
        "prompt_tasks": ",".join("0" * count),
        "task_vocab_size": IMG_TOKEN_SPAN,
        "max_new_tokens": new_tokens,
        "end_id": -1,
        "pad_id": ENDOFTEXT_ID,
    }


def engine_generate(runner, requests, table, new_tokens: int) -> torch.Tensor:
    """The engine on the same requests and table (python-session convention, tasks 0): new tokens [B, new_tokens]."""
    out = runner.generate(requests, **session_arguments(table, len(requests), new_tokens))
    return torch.stack([out[i, 0, len(ids) : len(ids) + new_tokens] for i, ids in enumerate(requests)]).long()


class MachineTooBusy(RuntimeError):
    """The timings came out inconsistent because other work ran on the machine: rerun, differently."""


def measure(
    generate, requests, table, new_tokens: int, repeats: int, device, baseline: int, label: str | None = None
) -> dict:
    """TTFT (a 1-token run), decode speed ((N-1) tokens ÷ (N-token run - TTFT)), peak memory, tokens; with a
    `label`, a progress bar over its runs (two warm-ups, `repeats` 1-token and `repeats` N-token runs)."""
    bar = tqdm(total=2 + 2 * repeats, desc=label, unit="run", leave=False, disable=label is None)

    def timed(n):
        synchronize(device)
        start = time.perf_counter()
        out = generate(requests, table, n)
        synchronize(device)
        bar.update()
        return time.perf_counter() - start, out

    with bar:
        timed(new_tokens)  # warm-up: allocator, kernels, CUDA graphs
        timed(1)  # and the 1-token run's own first-call costs (a prefill-only step), so TTFT is not the first call
        ttft = min(timed(1)[0] for _ in range(repeats))
        with PeakMemory(device, baseline) as peak:
            total, tokens = timed(new_tokens)
        total = min([total] + [timed(new_tokens)[0] for _ in range(repeats - 1)])
    if total <= ttft:
        raise MachineTooBusy(
            f"the {new_tokens}-token run ({total * 1e3:.1f} ms) was not slower than the 1-token run ({ttft * 1e3:.1f} ms): "
            "the machine is too busy to measure; rerun with more --repeats or --new-tokens "
            "(and --threads 1 on a shared CPU)"
        )
    steps_per_s = (new_tokens - 1) / (total - ttft)
    return {
        "batch": len(requests),
        "ttft_ms": ttft * 1e3,
        "total_ms": total * 1e3,
        "decode_tokens_per_s": steps_per_s * len(requests),
        "decode_steps_per_s": steps_per_s,
        "peak_mem_mb": peak.peak / 2**20,
        "tokens": tokens.cpu(),
    }


def hardware(device: torch.device) -> dict:
    """What ran the benchmark."""
    info = {
        **machine(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> dict:
    """Load the model, measure eager then engine at every batch size (and the first answers); the report as a dict."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device, dtype = torch.device(args.device), to_torch_dtype(args.dtype)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    baseline = memory_in_use(device)
    with tempfile.TemporaryDirectory(prefix="qwenvl-bench-") as workdir:
        report = measure_all(args, device, dtype, baseline, Path(workdir))
        if args.first_answer:
            report["first_answer_s"] = first_answers(argv, Path(workdir))
        return report


FULL_SIZE_ENGINE_BYTES = (7.72e9 + 1.94e9) * 2  # Qwen-VL-Chat's language model and vision tower in float16


def integrity_cost(args: argparse.Namespace) -> dict:
    """Load times of the model's engine directory at each verify level (best of --repeats), the checksum throughput
    (every byte hashed by verify_engine), and the full check's time for a full-size engine at that throughput."""
    with tempfile.TemporaryDirectory(prefix="qwenvl-bench-") as workdir:
        model, checkpoint = load_model(args, torch.device("cpu"), to_torch_dtype(args.dtype), Path(workdir))
        if checkpoint is None:
            raise ValueError("--integrity needs a checkpoint on disk: use --model toy or tiny, or --checkpoint DIR")
        del model
        engine = build_engine(checkpoint, Path(workdir) / "engine", BuildConfig(dtype=args.dtype))
        size = sum(p.stat().st_size for p in engine.rglob("*") if p.is_file())

        def best(call) -> float:
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            return min(times)

        load_s = {v: best(lambda v=v: ModelRunner.from_dir(engine, verify=v)) for v in ("none", "quick", "full")}
        hashing_s = best(lambda: verify_engine(engine))
    throughput = size / hashing_s
    return {
        "engine_bytes": size,
        "load_s": load_s,
        "full_check_s": hashing_s,
        "checksum_bytes_per_s": throughput,
        "cpu_count": os.cpu_count(),
        "full_size_engine_bytes": FULL_SIZE_ENGINE_BYTES,
        "full_size_full_check_s": FULL_SIZE_ENGINE_BYTES / throughput,
    }


CHAT_BUILD = BuildConfig(max_batch_size=1, max_input_len=640, max_seq_len=704, max_prompt_embedding_table_size=512)


def chat_turn_cost(args: argparse.Namespace) -> dict:
    """Seconds of one more turn of a text-only chat (questions piped in, each answered greedily in at most
    --new-tokens tokens) after each of --chat-turns turns of history, on --model's engine with 640 ids a request (the
    best of --repeats), each timed alternately with a turn after the fewest turns asked for, so that the ratio of the
    two holds on a machine whose load changes."""
    from .engine import load_engine_vision_tower  # noqa: PLC0415

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="qwenvl-bench-") as workdir:
        model, checkpoint = load_model(args, torch.device("cpu"), to_torch_dtype(args.dtype), Path(workdir))
        if checkpoint is None:
            raise ValueError("--chat-turns needs a checkpoint on disk: use --model toy or tiny, or --checkpoint DIR")
        del model
        engine = build_engine(checkpoint, Path(workdir) / "engine", replace(CHAT_BUILD, dtype=args.dtype))
        runner = ModelRunner.from_dir(engine, device=device, backend=args.backend, cuda_graphs=args.cuda_graphs)
        vision, tokenizer = load_engine_vision_tower(engine, device), load_tokenizer(engine)
        talk = Conversation(runner, vision, tokenizer, settings=GenerationSettings(max_new_tokens=args.new_tokens))
        shared = {id(runner): runner, id(vision): vision, id(tokenizer): tokenizer}  # what a copy of a chat shares

        def turn(chat) -> float:
            start = time.perf_counter()
            chat.ask(f"Question {len(chat.history) + 1}: what is in the picture?")
            synchronize(device)
            return time.perf_counter() - start

        first, turn_s, beside_s, left_out = None, {}, {}, {}
        for mark in sorted(set(args.chat_turns)):
            while len(talk.history) < mark:
                turn(talk)
            first = copy.deepcopy(talk, dict(shared)) if first is None else first
            times = [(turn(talk), turn(copy.deepcopy(first, dict(shared)))) for _ in range(args.repeats)]
            turn_s[mark], beside_s[mark] = min(t for t, _ in times), min(b for _, b in times)
            left_out[mark] = talk.left_out
    return {
        "max_input_len": CHAT_BUILD.max_input_len,
        "turn_s": turn_s,
        "first_mark_turn_s": beside_s,  # a turn after the fewest turns, timed alternately with each mark's
        "ratio_to_first_mark": {mark: turn_s[mark] / beside_s[mark] for mark in turn_s},
        "left_out": left_out,
    }


def first_answer(args: argparse.Namespace) -> dict:
    """In this (fresh) process: seconds from making the engine (ModelRunner.from_model, then warm_up, as from_dir does
    on CUDA) to it being ready (load_s), and from then to the answer to one request (first_answer_s)."""
    device, dtype = torch.device(args.device), to_torch_dtype(args.dtype)
    with tempfile.TemporaryDirectory(prefix="qwenvl-bench-") as workdir:
        model, checkpoint = load_model(args, device, dtype, Path(workdir))
        requests, table = make_requests(
            picture_features(model, 1, real=checkpoint is not None), model.config.vocab_size
        )
        synchronize(device)
        start = time.perf_counter()
        runner = ModelRunner.from_model(
            model,
            engine_limits(requests, table, args),
            device,
            args.backend,
            args.cuda_graphs,
            tuning_file=args.first_answer_child,
        )
        runner.warm_up(progress=False)
        synchronize(device)
        ready = time.perf_counter()
        engine_generate(runner, requests, table, args.new_tokens)
        synchronize(device)
        return {"load_s": ready - start, "first_answer_s": time.perf_counter() - ready}


def first_answers(argv: list[str], workdir: Path) -> dict:
    """first_answer in two fresh processes: cold (no tuned choices, an empty Triton cache), then with the choices the
    first one saved and the kernels it compiled."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(workdir / "triton-cache"), "PYTHONUNBUFFERED": "1"}
    tuning = workdir / "tuning.json"
    times = {}
    for label in ("cold", "saved_choices"):
        child = [sys.executable, "-m", "qwenvl_lab.bench", *argv, "--first-answer-child", str(tuning)]
        done = subprocess.run(child, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the {label} first-answer process failed:\n{done.stderr[-2000:]}")
        times[label] = json.loads(done.stdout.strip().splitlines()[-1])
    return times


def load_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, workdir: Path):
    """(model, its checkpoint directory or None for Qwen-VL-Chat's random weights made on the device)."""
    checkpoint = args.checkpoint or {"toy": TOY_DIR, "tiny": None, "qwen-vl-chat": None}[args.model]
    if args.model == "tiny" and checkpoint is None:
        checkpoint = make_tiny_checkpoint(workdir / "tiny", seed=args.seed, with_vocab=False)
    if checkpoint is None:
        return qwen_vl_chat_model(device, dtype), None
    if not (Path(checkpoint) / "config.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {checkpoint} (train the toy model, or pass --checkpoint DIR)")
    return load_checkpoint(checkpoint, dtype=dtype, device=device).requires_grad_(False), checkpoint


def engine_limits(requests, table, args: argparse.Namespace) -> BuildConfig:
    """Limits that hold the requests, their new tokens (rounded up to whole KV buckets) and their table [rows, H]."""
    longest = max(len(ids) for ids in requests)
    return BuildConfig(
        max_batch_size=len(requests),
        max_input_len=-(-longest // KV_BUCKET) * KV_BUCKET,
        max_seq_len=-(-(longest + args.new_tokens) // KV_BUCKET) * KV_BUCKET,
        max_prompt_embedding_table_size=len(table),
        dtype=args.dtype,
    )


DRIFT_REQUESTS = 4  # --weight-only: the drift is measured on the first requests of the benchmark, at most this many


@torch.inference_mode()
def trace(runner, requests, table, steps: int, tokens=None) -> dict:
    """The engine on `requests` (one picture each, python-session convention), driven step by step: the residual
    stream at each request's last prompt id after every layer (float32 [layers, B, H]), the logits of the prefill and
    of `steps` decode steps (float32 [steps + 1, B, V]), and the tokens fed ([steps, B]: `tokens` when given, else
    the greedy ones), all on the CPU."""
    engine, device = runner.engine, runner.device
    ids = [r.to(device) for r in requests]
    tasks = torch.zeros(1, dtype=torch.int32, device=device)
    embeds = [
        prompt_tuning_embedding(i[None], engine.vocab_embedding, table, tasks, IMG_TOKEN_SPAN, runner.vocab_size)[0]
        for i in ids
    ]
    lengths = [len(i) for i in ids]
    runner.turn.begin()  # the KV cache is this trace's until it ends
    try:
        states = []
        last = torch.tensor(lengths).cumsum(0).to(engine.device) - 1  # [B]: each request's last id in the packed rows
        logits = engine.prefill(
            torch.cat(embeds),
            lengths,
            [range(r, r + 1) for r in range(len(ids))],
            observe=lambda i, x: states.append(x[last]),  # the residual stream after each layer, at the last ids
        )
        pos = torch.tensor(lengths, device=device)
        seen, fed = [logits.float().cpu()], []
        for t in range(steps):
            step_tokens = logits.argmax(dim=-1) if tokens is None else tokens[t].to(device)
            fed.append(step_tokens.cpu())
            logits = runner.decoder(step_tokens, pos, kv_bucket(max(lengths) + t + 1, runner.max_seq_len))
            seen.append(logits.float().cpu())
            pos += 1
    finally:
        runner.turn.end()
    return {
        "states": torch.stack([s.float().cpu() for s in states]),
        "logits": torch.stack(seen),
        "tokens": torch.stack(fed),
    }


def drift(reference: dict, other: dict) -> dict:
    """How far `other`'s trace lies from `reference`'s (the same prompts and fed tokens): per layer, the residual
    stream's relative L2 distance (‖other − reference‖ / ‖reference‖, the mean over the requests); per step, the
    logits' relative L2 distance, their largest absolute difference, and the share of requests whose top token is the
    reference's; those at the last step, and the share over all steps."""

    def relative(a, b):  # [..., D] → [...]
        return ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp(min=1e-30)).double()

    layers = relative(other["states"], reference["states"]).mean(dim=1)  # [layers]
    steps = relative(other["logits"], reference["logits"]).mean(dim=1)  # [steps + 1]
    max_abs = (other["logits"] - reference["logits"]).abs().amax(dim=(1, 2))  # [steps + 1]
    same_top = (other["logits"].argmax(-1) == reference["logits"].argmax(-1)).double()  # [steps + 1, B]
    return {
        "requests": reference["states"].shape[1],
        "decode_steps": reference["logits"].shape[0] - 1,
        "layers_rel_l2": layers.tolist(),
        "logits_rel_l2_by_step": steps.tolist(),
        "prefill_logits": {
            "rel_l2": float(steps[0]),
            "max_abs": float(max_abs[0]),
            "same_top": float(same_top[0].mean()),
        },
        "last_step_logits": {
            "rel_l2": float(steps[-1]),
            "max_abs": float(max_abs[-1]),
            "same_top": float(same_top[-1].mean()),
            "reference_abs_max": float(reference["logits"][-1].abs().max()),
        },
        "same_top_all_steps": float(same_top.mean()),
    }


def measure_engine(method: str, runner, requests, tables, args, device, baseline, results) -> None:
    """The engine's rows of the results (method "engine" or "engine-int8"), one per batch size (tables' keys)."""
    for b in sorted(tables):
        result = measure(
            lambda *a: engine_generate(runner, *a),
            requests[:b],
            tables[b],
            args.new_tokens,
            args.repeats,
            device,
            baseline,
            label=f"{method}, batch {b}",
        )
        eager = next((r for r in results if r["method"] == "eager" and r["batch"] == b), None)
        if eager is not None:
            result["same_tokens_as_eager"] = int((result["tokens"] == eager["tokens"]).all(dim=1).sum())
        results.append({"method": method, **result})


def weight_only_runner(args, model_config, weights, build_config, checkpoint, workdir, device) -> ModelRunner:
    """The weight-only engine: built into `workdir` from the checkpoint when there is one (as the float engine is),
    else from the model's quantized weights (`weights`, on the CPU: copied to the device one at a time)."""
    options = dict(device=device, backend=args.backend, cuda_graphs=args.cuda_graphs)
    if checkpoint is not None:
        return ModelRunner.from_dir(build_engine(checkpoint, workdir / "engine-int8", build_config), **options)
    pretrained = trtllm_config(model_config, build_config.dtype, weight_only=build_config.weight_only)
    runner = ModelRunner(build_config, pretrained, weights, **options)
    weights.clear()  # the engine holds its own copy
    if args.backend != "torch" or args.cuda_graphs:
        runner.warm_up(progress=False)
    return runner


def measure_all(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, baseline: int, workdir: Path
) -> dict:
    """The benchmark proper (engine files and the tiny checkpoint go in `workdir`)."""
    model, checkpoint = load_model(args, device, dtype, workdir)
    batches = sorted(set(args.batch))
    input_vit = picture_features(model, max(batches), real=checkpoint is not None)  # [B, 256, H]
    requests, table = make_requests(input_vit, model.config.vocab_size)  # table [B·256, H]
    build_config = engine_limits(requests, table, args)
    steps = args.new_tokens - 1  # decode steps in a timed run: the probe times as many products in a row
    probes = [bandwidth_probe(model.lm_head.weight, args.repeats, steps)]  # probed again later: the best one counts
    tables = {b: table[: b * input_vit.shape[1]] for b in batches}  # [b·256, H]: the first b requests' rows

    results = []
    if not args.no_eager:
        with torch.inference_mode():
            for b in batches:
                results.append(
                    {
                        "method": "eager",
                        **measure(
                            lambda *a: eager_generate(model, *a),
                            requests[:b],
                            tables[b],
                            args.new_tokens,
                            args.repeats,
                            device,
                            baseline,
                            label=f"eager, batch {b}",
                        ),
                    }
                )
    model_config, quantized = model.config, None
    if args.weight_only is not None and checkpoint is None:  # the random weights exist only in this model: keep theirs
        with torch.inference_mode():
            state = {name: w.to(dtype) for name, w in to_trtllm_names(model.state_dict()).items()}
            quantized = {name: w.cpu() for name, w in weight_only_quantize(state, args.dtype).items()}
            del state
    runner_options = dict(device=device, backend=args.backend, cuda_graphs=args.cuda_graphs)
    if checkpoint is not None:
        engine_dir = build_engine(checkpoint, workdir / "engine", build_config)
        del model
        release_memory(device)
        baseline = memory_in_use(device)  # the engine's peak counts from here: its weights, cache and activations
        runner = ModelRunner.from_dir(engine_dir, **runner_options)
    else:
        runner = ModelRunner.from_model(model, build_config, **runner_options)
        del model  # the engine keeps the weights it shares with the model; its peak counts from the start
        release_memory(device)
    probes.append(bandwidth_probe(runner.engine.lm_head_t.t(), args.repeats, steps))
    measure_engine("engine", runner, requests, tables, args, device, baseline, results)
    products = {"engine": products_alone(runner, args.repeats, steps)}
    probes.append(bandwidth_probe(runner.engine.lm_head_t.t(), args.repeats, steps))
    weight_bytes = {"engine": runner.engine.weight_bytes_per_token}  # the same tensors eager reads, in the same dtype
    held = {"engine": runner.engine.stacked_bytes}
    weight_only = None
    if args.weight_only is not None:
        drift_requests = requests[: min(DRIFT_REQUESTS, max(batches))]
        drift_table = tables[max(batches)]
        reference = trace(runner, drift_requests, drift_table, args.drift_steps)
        del runner
        release_memory(device)
        baseline = memory_in_use(device)  # the weight-only engine's peak counts from here, its weights included
        int8_config = replace(build_config, weight_only=args.weight_only)
        runner = weight_only_runner(args, model_config, quantized, int8_config, checkpoint, workdir, device)
        measure_engine("engine-int8", runner, requests, tables, args, device, baseline, results)
        products["engine-int8"] = products_alone(runner, args.repeats, steps)
        probes.append(bandwidth_probe(runner.engine.lm_head_t.t(), args.repeats, steps))
        weight_bytes["engine-int8"] = runner.engine.weight_bytes_per_token
        held["engine-int8"] = runner.engine.stacked_bytes
        other = trace(runner, drift_requests, drift_table, args.drift_steps, tokens=reference["tokens"])
        weight_only = {"precision": args.weight_only, "drift": drift(reference, other)}
    probe = max(probes, key=lambda p: p["gb_per_s"])
    limits = {method: probe["gb_per_s"] * 1e9 / b for method, b in weight_bytes.items()}  # decode steps/s allowed
    peak = max(p["peak_gb_per_s"] for p in probes)  # the fastest single product: reported, not the judge
    first = {
        m: next((r for r in results if r["method"] == m and r["batch"] == 1), None) for m in ("engine", "engine-int8")
    }
    for r in results:
        r.pop("tokens")
        bytes_read = weight_bytes.get(r["method"], weight_bytes["engine"])  # eager reads the float weights
        r["pct_of_limit"] = 100 * r["decode_steps_per_s"] * bytes_read / (probe["gb_per_s"] * 1e9)
        r["pct_of_peak_limit"] = 100 * r["decode_steps_per_s"] * bytes_read / (peak * 1e9)
        one = first.get(r["method"])
        if one is not None:
            r["throughput_vs_batch1"] = r["decode_tokens_per_s"] / one["decode_tokens_per_s"]
        if r["method"] == "engine-int8":
            same = next(f for f in results if f["method"] == "engine" and f["batch"] == r["batch"])
            r["vs_float_engine"] = r["decode_tokens_per_s"] / same["decode_tokens_per_s"]
            r["ttft_vs_float_engine"] = r["ttft_ms"] / same["ttft_ms"]
            r["peak_mem_vs_float_engine"] = r["peak_mem_mb"] / max(same["peak_mem_mb"], 1e-9)
    if weight_only is not None:
        weight_only.update(
            weight_bytes_per_token=weight_bytes["engine-int8"],
            weight_bytes_vs_float=weight_bytes["engine-int8"] / weight_bytes["engine"],
            limit_decode_steps_per_s=limits["engine-int8"],
            limit_vs_float=limits["engine-int8"] / limits["engine"],
            weights_held_bytes=held,
            products_alone={
                "ms": products["engine-int8"] * 1e3,
                "pct_of_limit": 100 / (products["engine-int8"] * limits["engine-int8"]),
                "vs_float_engine": products["engine"] / products["engine-int8"],
            },
        )
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hardware": hardware(device),
        "model": {
            "name": args.model if args.checkpoint is None else str(args.checkpoint),
            "hidden_size": runner.hidden_size,
            "layers": runner.pretrained_config["num_hidden_layers"],
            "vocab_size": runner.vocab_size,
            "dtype": args.dtype,
            "weight_bytes_per_token": weight_bytes["engine"],
        },
        "bandwidth": {
            **probe,
            "limit_decode_steps_per_s": limits["engine"],
            "peak_gb_per_s": peak,
            "probes_gb_per_s": [p["gb_per_s"] for p in probes],
        },  # before eager, before and after the engine (and after the weight-only engine)
        "products_alone": {
            "ms": products["engine"] * 1e3,
            "pct_of_limit": 100 / (products["engine"] * limits["engine"]),
        },
        "settings": {
            "device": str(device),
            "prompt_lengths": [len(ids) for ids in requests],
            "pictures_per_request": 1,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "build_config": asdict(build_config),
            "backend": runner.backend,
            "cuda_graphs": runner.cuda_graphs,
            "vision_timed": False,
        },
        "results": results,
    }
    if weight_only is not None:
        report["weight_only"] = weight_only
    return report


CHAT_QUESTION = "Question {k}: what is in the picture?"  # --kv-cache-reuse's k-th question (from 1)
PICTURE_NAME = "picture.png"  # what the one picture's span holds before its fake ids replace it


def with_fake_ids(ids, table: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A prompt [L] about one picture, its image span holding the fake ids from vocab_size that read the picture's
    table [rows, H] (`single_table_batch`)."""
    return single_table_batch(torch.as_tensor(ids)[None], table[None], vocab_size)[0][0]  # [L]


def chat_prompts(tokenizer, turns: int, new_tokens: int) -> list[torch.Tensor]:
    """The prompts [L_k] of a --kv-cache-reuse chat of `turns` questions, the first with the picture, each laid out by
    `make_prompt` after the earlier turns; each earlier answer a slot of `new_tokens` ids (0) where the runner's
    answer goes (so that the ids are the engine's own, not its text encoded again); the picture's span holds its
    name (`with_fake_ids` puts in the fake ids)."""
    history, prompts = [], []
    for k in range(turns):
        query, ids = make_prompt(tokenizer, CHAT_QUESTION.format(k=k + 1), [PICTURE_NAME] if k == 0 else [], history)
        ids = torch.tensor(ids)  # [L]: the earlier answers empty
        for before in prompts:  # turn j's answer starts where its prompt (with its own earlier slots) ends
            ids = torch.cat([ids[: len(before)], torch.zeros(new_tokens, dtype=ids.dtype), ids[len(before) :]])
        history.append((query, ""))
        prompts.append(ids)
    return prompts


def chat_length(turns: int, new_tokens: int) -> int:
    """Ids of the last prompt of a --kv-cache-reuse chat, and its answer."""
    return len(chat_prompts(load_tokenizer(), turns, new_tokens)[-1]) + new_tokens


def first_token(runner, prompts, table, new_tokens: int, device: torch.device) -> tuple[float, list]:
    """(seconds to the first token of a streaming generation, each request's answer): the prompts share one picture,
    table [256, H], named "picture" in multimodal_hashes (as a client names it); the answer is generated untimed."""
    synchronize(device)
    start = time.perf_counter()
    stream = runner.generate(
        prompts,
        **session_arguments(table, len(prompts), new_tokens),
        multimodal_hashes=[["picture"]] * len(prompts),
        streaming=True,
        return_dict=True,
    )
    outputs = next(stream)
    synchronize(device)
    seconds = time.perf_counter() - start
    for outputs in stream:  # noqa: B007 — the last outputs hold the answers
        pass
    return seconds, [outputs["output_ids"][r, 0, len(ids) :].tolist() for r, ids in enumerate(prompts)]


def reuse_chat(runner, table, args, device: torch.device) -> dict:
    """A chat of --turns questions about one picture, every turn re-sending the history (system, the earlier
    questions and answers): each turn's time to first token and prefill ids without block reuse and with it, the
    whole chat replayed --repeats times, the two ways one after the other (the best time of each kept), the pool
    emptied before each replay with reuse."""
    prompts = [
        with_fake_ids(ids, table, runner.vocab_size)
        for ids in chat_prompts(load_tokenizer(), args.turns, args.new_tokens)
    ]
    answers = []  # the answers given without reuse, put in the later prompts' slots below
    times = {False: [[] for _ in prompts], True: [[] for _ in prompts]}  # seconds of each replay, per turn
    computed, reused, same = {}, [0] * args.turns, True
    for _ in range(args.repeats):
        for reuse in (False, True):
            runner.kv_cache_reuse = reuse
            runner.kv_pool.clear()
            for k in range(args.turns):
                seconds, [answer] = first_token(runner, [prompts[k]], table, args.new_tokens, device)
                times[reuse][k].append(seconds)
                computed[reuse, k] = runner.last_prefill.computed_ids[0]
                if not reuse and len(answers) == k:  # the chat's answer sets the next turns' history
                    answers.append(answer)
                    for later in range(k + 1, args.turns):
                        at = len(prompts[k])
                        prompts[later] = torch.cat([prompts[later][:at], torch.tensor(answer), prompts[later][at + len(answer) :]])  # fmt: skip
                elif reuse:
                    same, reused[k] = same and answer == answers[k], runner.last_prefill.reused_ids[0]
    best = {reuse: [min(t) for t in times[reuse]] for reuse in times}
    turns = [
        {
            "turn": k + 1,
            "prompt_ids": len(prompts[k]),
            "computed_ids_without": computed[False, k],
            "reused_ids": reused[k],
            "computed_ids_with": computed[True, k],
            "ttft_ms_without": best[False][k] * 1e3,
            "ttft_ms_with": best[True][k] * 1e3,
            "ttft_ratio": best[False][k] / best[True][k],
            "ttft_ratio_median_of_pairs": statistics.median(a / b for a, b in zip(times[False][k], times[True][k])),
        }
        for k in range(args.turns)
    ]
    later = turns[1:]
    pairs = [sum(t[i] for t in times[False][1:]) / sum(t[i] for t in times[True][1:]) for i in range(args.repeats)]
    return {
        "turns": turns,
        "ttft_ratio_turns_2_plus": sum(t["ttft_ms_without"] for t in later) / sum(t["ttft_ms_with"] for t in later),
        "ttft_ratio_turns_2_plus_median_of_pairs": statistics.median(pairs),  # each replay without ÷ the one with
        "computed_ids_turns_2_plus": {
            "without": sum(t["computed_ids_without"] for t in later),
            "with": sum(t["computed_ids_with"] for t in later),
        },
        "same_answers_with_and_without": same,
    }


def reuse_batch(runner, table, batch: int, args, device: torch.device) -> dict:
    """A batch of `batch` different questions about one picture, after one question about it was answered: time to
    first token of the batch and prefill ids, without block reuse and with it, one after the other --repeats times
    (the best time of each kept; with reuse the first question answered again from an empty pool each time)."""
    tokenizer = load_tokenizer()
    first, *prompts = [
        with_fake_ids(
            make_prompt(tokenizer, CHAT_QUESTION.format(k=k + 1), [PICTURE_NAME])[1], table, runner.vocab_size
        )
        for k in range(batch + 1)
    ]
    times, stats = {False: [], True: []}, {}
    for _ in range(args.repeats):
        for reuse in (False, True):
            runner.kv_cache_reuse = reuse
            runner.kv_pool.clear()
            if reuse:
                first_token(runner, [first], table, args.new_tokens, device)
            times[reuse].append(first_token(runner, prompts, table, 1, device)[0])
            stats[reuse] = runner.last_prefill
    best = {reuse: min(t) for reuse, t in times.items()}
    return {
        "batch": batch,
        "prompt_ids": list(stats[True].input_ids),
        "ttft_ms_without": best[False] * 1e3,
        "ttft_ms_with": best[True] * 1e3,
        "ttft_ratio": best[False] / best[True],
        "ttft_ratio_median_of_pairs": statistics.median(a / b for a, b in zip(times[False], times[True])),
        "computed_ids_without": sum(stats[False].computed_ids),
        "reused_ids": sum(stats[True].reused_ids),
        "computed_ids_with": sum(stats[True].computed_ids),
    }


def reuse_gain(args: argparse.Namespace) -> dict:
    """What KV-cache block reuse gains where it is right: a chat about one picture and batches of questions about one
    picture, each without reuse and with it (mm_hash keys), on one runner (its pool switched off and on)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device, dtype = torch.device(args.device), to_torch_dtype(args.dtype)
    with tempfile.TemporaryDirectory(prefix="qwenvl-bench-") as workdir:
        model, checkpoint = load_model(args, device, dtype, Path(workdir))
    table = picture_features(model, 1, real=checkpoint is not None)[0]  # [256, H]
    longest = chat_length(args.turns, args.new_tokens)
    build_config = BuildConfig(
        max_batch_size=max(args.batch),
        max_input_len=-(-(longest - args.new_tokens) // KV_BUCKET) * KV_BUCKET,
        max_seq_len=-(-longest // KV_BUCKET) * KV_BUCKET,
        max_prompt_embedding_table_size=IMG_TOKEN_SPAN * max(args.batch),
        dtype=args.dtype,
    )
    runner = ModelRunner.from_model(
        model, build_config, device, args.backend, args.cuda_graphs, kv_cache_reuse=True, kv_cache_key="mm_hash"
    )
    del model
    release_memory(device)
    runner.warm_up(progress=False)
    load = os.getloadavg()
    chat = reuse_chat(runner, table, args, device)
    batches = [reuse_batch(runner, table, b, args, device) for b in sorted(set(args.batch))]
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hardware": hardware(device),
        "load_average": {"before": round(load[0], 2), "after": round(os.getloadavg()[0], 2)},  # other work here
        "model": {
            "name": args.model if args.checkpoint is None else str(args.checkpoint),
            "hidden_size": runner.hidden_size,
            "layers": runner.pretrained_config["num_hidden_layers"],
            "dtype": args.dtype,
        },
        "settings": {
            "device": str(device),
            "turns": args.turns,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "build_config": asdict(build_config),
            "backend": runner.backend,
            "cuda_graphs": runner.cuda_graphs,
            "kv_cache_key": runner.kv_cache_key,
            "kv_block_size": runner.kv_block_size,
            "kv_pool_blocks": runner.kv_pool.capacity,
            "kv_pool_bytes": runner.kv_pool.nbytes,
        },
        "chat": chat,
        "same_picture_batch": batches,
    }


def format_reuse(report: dict) -> str:
    """A --kv-cache-reuse report as a fixed-width text table."""
    settings = report["settings"]
    lines = [
        f"{report['model']['name']} ({report['model']['dtype']}) on {report['hardware'].get('gpu', report['hardware']['cpu'])}: "
        f"KV-cache block reuse, blocks of {settings['kv_block_size']} ids, a pool of {settings['kv_pool_blocks']} blocks "
        f"({settings['kv_pool_bytes'] / 2**20:.1f} MiB), keys {settings['kv_cache_key']!r}",
        f"{'chat turn':<10} {'prompt ids':>10} {'computed without':>16} {'computed with':>13} {'TTFT ms without':>15} "
        f"{'TTFT ms with':>12} {'ratio':>6} {'median of pairs':>15}",
    ]
    for t in report["chat"]["turns"]:
        lines.append(
            f"{t['turn']:<10} {t['prompt_ids']:>10} {t['computed_ids_without']:>16} {t['computed_ids_with']:>13} "
            f"{t['ttft_ms_without']:>15.1f} {t['ttft_ms_with']:>12.1f} {t['ttft_ratio']:>6.2f} "
            f"{t['ttft_ratio_median_of_pairs']:>15.2f}"
        )
    chat = report["chat"]
    lines.append(
        f"turns 2+: time to first token {chat['ttft_ratio_turns_2_plus']:.2f}x faster with reuse (best times; median "
        f"of the replays' pairs {chat['ttft_ratio_turns_2_plus_median_of_pairs']:.2f}x); the same answers "
        f"with and without: {chat['same_answers_with_and_without']}"
    )
    lines.append(
        f"{'batch':<10} {'prompt ids':>10} {'computed without':>16} {'computed with':>13} {'TTFT ms without':>15} "
        f"{'TTFT ms with':>12} {'ratio':>6} {'median of pairs':>15}"
    )
    for b in report["same_picture_batch"]:
        lines.append(
            f"{b['batch']:<10} {sum(b['prompt_ids']):>10} {b['computed_ids_without']:>16} {b['computed_ids_with']:>13} "
            f"{b['ttft_ms_without']:>15.1f} {b['ttft_ms_with']:>12.1f} {b['ttft_ratio']:>6.2f} "
            f"{b['ttft_ratio_median_of_pairs']:>15.2f}"
        )
    return "\n".join(lines)


def format_table(report: dict) -> str:
    """The results as a fixed-width text table with the limit above it."""
    bw = report["bandwidth"]
    lines = [
        f"{report['model']['name']} ({report['model']['dtype']}) on "
        f"{report['hardware'].get('gpu', report['hardware']['cpu'])}",
        f"bandwidth: {bw['gb_per_s']:.1f} GB/s over {bw['matrix']} (as {bw['layout']}; runs of "
        f"{bw['products_per_run']} products, the fastest single one {bw['peak_gb_per_s']:.1f} GB/s) -> limit "
        f"{bw['limit_decode_steps_per_s']:.1f} decode steps/s "
        f"({report['model']['weight_bytes_per_token'] / 1e6:.1f} MB of weights per step)",
        f"one decode step's matrix products alone (batch 1, nothing between them): "
        f"{report['products_alone']['ms']:.2f} ms = {report['products_alone']['pct_of_limit']:.1f} % of the limit",
        f"engine: decode back end {report['settings']['backend']!r}, CUDA graphs "
        f"{'on' if report['settings']['cuda_graphs'] else 'off'}; prompts of {min(report['settings']['prompt_lengths'])}"
        f"-{max(report['settings']['prompt_lengths'])} ids, {report['settings']['new_tokens']} new tokens",
        f"{'method':<11} {'batch':>5} {'TTFT ms':>9} {'decode tok/s':>13} {'% of limit':>11} {'peak MB':>9} "
        f"{'x batch 1':>9} {'same tokens':>11}",
    ]
    for r in report["results"]:
        speedup = f"{r['throughput_vs_batch1']:.2f}" if "throughput_vs_batch1" in r else ""
        same = f"{r['same_tokens_as_eager']}/{r['batch']}" if "same_tokens_as_eager" in r else ""
        lines.append(
            f"{r['method']:<11} {r['batch']:>5} {r['ttft_ms']:>9.1f} {r['decode_tokens_per_s']:>13.1f} "
            f"{r['pct_of_limit']:>10.1f}% {r['peak_mem_mb']:>9.1f} {speedup:>9} {same:>11}"
        )
    wo = report.get("weight_only")
    if wo is not None:
        d = wo["drift"]
        lines += [
            f"weight-only {wo['precision']}: {wo['weight_bytes_per_token'] / 1e6:.1f} MB of weights per step "
            f"({wo['weight_bytes_vs_float']:.2f}× the float engine's) -> limit {wo['limit_decode_steps_per_s']:.1f} "
            f"steps/s ({wo['limit_vs_float']:.2f}× the float limit); products alone {wo['products_alone']['ms']:.2f} ms "
            f"= {wo['products_alone']['pct_of_limit']:.1f} % of its limit",
            "decode speed ÷ the float engine's: "
            + ", ".join(
                f"batch {r['batch']} {r['vs_float_engine']:.2f}×" for r in report["results"] if "vs_float_engine" in r
            ),
            f"drift from the float engine ({d['requests']} requests, {d['decode_steps']} decode steps fed the same "
            f"tokens): residual stream after each layer {', '.join(f'{x:.2e}' for x in d['layers_rel_l2'])} "
            f"(relative L2); last step's logits {d['last_step_logits']['rel_l2']:.2e} relative L2, at most "
            f"{d['last_step_logits']['max_abs']:.3g} apart; same top token {d['same_top_all_steps']:.0%} of the steps",
        ]
    for label, times in report.get("first_answer_s", {}).items():
        lines.append(
            f"first answer ({label}): engine ready in {times['load_s']:.2f} s, then answered in "
            f"{times['first_answer_s']:.2f} s"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    """Run the benchmark, print the table, write the JSON."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    args = parse_args(argv)
    if args.first_answer_child is not None:
        print(json.dumps(first_answer(args)))
        return {}
    if args.integrity or args.chat_turns:
        measured = integrity_cost(args) if args.integrity else chat_turn_cost(args)
        report = {"command": "python -m qwenvl_lab.bench " + shlex.join(argv), **measured}
        print(json.dumps(report, indent=2))
        return report
    if args.kv_cache_reuse:
        report = {"command": "python -m qwenvl_lab.bench " + shlex.join(argv), **reuse_gain(args)}
        print(format_reuse(report))
        if args.json is not None:
            files.write_text(
                args.json,
                json.dumps(report, indent=2, ensure_ascii=False) + "\n",
                JSON_WRITER,
                overwrite=args.overwrite,
            )
        return report
    try:
        results = run_benchmark(args, argv)
    except MachineTooBusy as err:
        sys.exit(f"qwenvl-lab bench: {err}")  # advice, not a bug: one line, no traceback
    report = {"command": "python -m qwenvl_lab.bench " + shlex.join(argv), **results}
    print(format_table(report))
    if args.json is not None:
        files.write_text(
            args.json, json.dumps(report, indent=2, ensure_ascii=False) + "\n", JSON_WRITER, overwrite=args.overwrite
        )
    return report


if __name__ == "__main__":
    main()
