"""Notebook 07 — the benchmark: eager `generate` against the engine — TTFT, decode speed, bandwidth limit, memory.

    python -m qwenvl_lab.bench --model toy --device cpu --batch 1 2 4 8 --new-tokens 32 --json toy-cpu.json
    python -m qwenvl_lab.bench --model qwen-vl-chat --device cuda --dtype float16 --json data/benchmarks/h200.json

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
its other work.
"""

import argparse
import copy
import ctypes
import gc
import importlib.util
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

from . import options
from .checkpoint import load_checkpoint, make_tiny_checkpoint
from .checks.tensors import to_torch_dtype
from .engine import BuildConfig, ModelRunner, build_engine, verify_engine
from .engine.cuda_graphs import KV_BUCKET
from .engine.decode import BACKENDS, FAST_PATH
from .modeling import QWEN_VL_CHAT_VISUAL, QWenLMHeadModel, QWenVLConfig
from .options import Parser
from .resources import images_dir
from .tokenizing import ENDOFTEXT_ID, IM_END_ID, IM_START_ID, IMAGE_END_ID, IMAGE_START_ID, IMG_TOKEN_SPAN
from .toy import TOY_DIR

MODELS = ("toy", "tiny", "qwen-vl-chat")
IMAGES_DIR = images_dir()
NEWLINE_ID = 198  # "\n" in qwen.tiktoken
MAX_THREADS = 1024  # --threads: more than any machine the benchmark runs on has cores


def parser() -> Parser:
    """`qwenvl-lab bench`'s options."""

    def check(parser, args):
        if args.model == "qwen-vl-chat" and args.checkpoint is None and torch.device(args.device).type != "cuda":
            parser.error("--model qwen-vl-chat makes a 7.7-billion-parameter language model: run it with --device cuda")

    parser = Parser(prog="qwenvl-lab bench", description=__doc__.split("\n")[0], check=check)
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
        "--chat-turns",
        type=options.whole(1, 100_000),
        nargs="+",
        help="instead: seconds of one more turn of a piped chat (cat questions.txt | qwenvl-lab chat) after each of "
        "these numbers of turns, on --model's engine built for 640 ids (the best of --repeats turns there)",
    )
    parser.add_argument("--json", type=options.output_file, help="write the results as JSON here")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options, checked, with the defaults that follow from the device filled in."""
    args = parser().parse_args(argv)
    device = torch.device(args.device)
    args.dtype = args.dtype or ("float16" if device.type == "cuda" else "float32")
    args.backend = args.backend or FAST_PATH.get(device.type, "torch")  # the benchmark measures the fast path
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
                linear(x, layer.qkv_t.t(), layer.qkv_b)
                linear(attn, layer.dense_t.t(), out=residual)
                linear(x, layer.gate_fc_t.t(), swiglu=True)
                linear(mlp, layer.proj_t.t(), out=residual)
            linear(x, engine.lm_head_t.t())
    else:

        def step():
            for layer in engine.layers:
                torch.addmm(layer.qkv_b, x, layer.qkv_t)
                torch.addmm(x, attn, layer.dense_t)
                x @ layer.gate_fc_t
                torch.addmm(x, mlp, layer.proj_t)
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


def make_requests(count: int, vocab_size: int, seed: int) -> list[torch.Tensor]:
    """`count` prompts in the chat layout around one picture span of fake ids (request i reads table rows 256·i…).

    The text is random token ids (the speed does not depend on it; no tokenizer needed): a 20-id system turn and a
    question of 8 + 5·i ids, so the requests differ in length.
    """
    generator = torch.Generator().manual_seed(seed)

    def text(n):
        return torch.randint(0, ENDOFTEXT_ID, (n,), generator=generator)

    newline = torch.tensor([NEWLINE_ID])
    requests = []
    for i in range(count):
        picture = torch.arange(vocab_size + IMG_TOKEN_SPAN * i, vocab_size + IMG_TOKEN_SPAN * (i + 1))  # [256]
        requests.append(
            torch.cat(
                [
                    torch.tensor([IM_START_ID]),
                    text(20),
                    torch.tensor([IM_END_ID]),
                    newline,
                    torch.tensor([IM_START_ID]),
                    text(6),
                    torch.tensor([IMAGE_START_ID]),
                    picture,
                    torch.tensor([IMAGE_END_ID]),
                    newline,
                    text(8 + 5 * i),
                    torch.tensor([IM_END_ID]),
                    newline,
                    torch.tensor([IM_START_ID]),
                    text(2),
                    newline,
                ]
            )
        )
    return requests


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


def engine_generate(runner, requests, table, new_tokens: int) -> torch.Tensor:
    """The engine on the same requests and table (python-session convention, tasks 0): new tokens [B, new_tokens]."""
    out = runner.generate(
        requests,
        prompt_table=table,
        prompt_tasks=",".join("0" * len(requests)),
        task_vocab_size=IMG_TOKEN_SPAN,
        max_new_tokens=new_tokens,
        end_id=-1,
        pad_id=ENDOFTEXT_ID,
    )
    return torch.stack([out[i, 0, len(ids) : len(ids) + new_tokens] for i, ids in enumerate(requests)]).long()


class MachineTooBusy(RuntimeError):
    """The timings came out inconsistent because other work ran on the machine: rerun, differently."""


def measure(generate, requests, table, new_tokens: int, repeats: int, device, baseline: int) -> dict:
    """TTFT (a 1-token run), decode speed ((N-1) tokens ÷ (N-token run - TTFT)), peak memory, tokens."""

    def timed(n):
        synchronize(device)
        start = time.perf_counter()
        out = generate(requests, table, n)
        synchronize(device)
        return time.perf_counter() - start, out

    timed(new_tokens)  # warm-up: allocator, kernels, CUDA graphs
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
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), platform.processor()
    )
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
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
    from .chat import Conversation, GenerationSettings  # noqa: PLC0415 — the answer path, for this measurement only
    from .engine import load_engine_vision_tower  # noqa: PLC0415
    from .tokenizing import load_tokenizer  # noqa: PLC0415

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
        requests = make_requests(1, model.config.vocab_size, args.seed)
        table = picture_features(model, 1, real=checkpoint is not None)[0]  # [256, H]
        synchronize(device)
        start = time.perf_counter()
        runner = ModelRunner.from_model(
            model,
            engine_limits(requests, args),
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


def engine_limits(requests, args: argparse.Namespace) -> BuildConfig:
    """Limits that hold the requests and their new tokens, rounded up to whole KV buckets; one picture each."""
    longest = max(len(ids) for ids in requests)
    return BuildConfig(
        max_batch_size=len(requests),
        max_input_len=-(-longest // KV_BUCKET) * KV_BUCKET,
        max_seq_len=-(-(longest + args.new_tokens) // KV_BUCKET) * KV_BUCKET,
        max_prompt_embedding_table_size=IMG_TOKEN_SPAN * len(requests),
        dtype=args.dtype,
    )


def measure_all(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, baseline: int, workdir: Path
) -> dict:
    """The benchmark proper (engine files and the tiny checkpoint go in `workdir`)."""
    model, checkpoint = load_model(args, device, dtype, workdir)
    batches = sorted(set(args.batch))
    requests = make_requests(max(batches), model.config.vocab_size, args.seed)
    input_vit = picture_features(model, max(batches), real=checkpoint is not None)  # [B, 256, H]
    build_config = engine_limits(requests, args)
    steps = args.new_tokens - 1  # decode steps in a timed run: the probe times as many products in a row
    probes = [bandwidth_probe(model.lm_head.weight, args.repeats, steps)]  # probed again later: the best one counts
    tables = {b: input_vit[:b].reshape(-1, input_vit.shape[-1]) for b in batches}  # [b·256, H]

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
                        ),
                    }
                )
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
    for b in batches:
        result = measure(
            lambda *a: engine_generate(runner, *a),
            requests[:b],
            tables[b],
            args.new_tokens,
            args.repeats,
            device,
            baseline,
        )
        eager = next((r for r in results if r["method"] == "eager" and r["batch"] == b), None)
        if eager is not None:
            result["same_tokens_as_eager"] = int((result["tokens"] == eager["tokens"]).all(dim=1).sum())
        results.append({"method": "engine", **result})
    products = products_alone(runner, args.repeats, steps)
    probes.append(bandwidth_probe(runner.engine.lm_head_t.t(), args.repeats, steps))
    probe = max(probes, key=lambda p: p["gb_per_s"])
    weight_bytes = runner.engine.weight_bytes_per_token  # the same tensors eager reads, in the same dtype
    limit = probe["gb_per_s"] * 1e9 / weight_bytes  # decode steps per second the bandwidth allows
    peak = max(p["peak_gb_per_s"] for p in probes)  # the fastest single product: reported, not the judge
    one = next((r for r in results if r["method"] == "engine" and r["batch"] == 1), None)
    for r in results:
        r.pop("tokens")
        r["pct_of_limit"] = 100 * r["decode_steps_per_s"] / limit
        r["pct_of_peak_limit"] = 100 * r["decode_steps_per_s"] * weight_bytes / (peak * 1e9)
        if one is not None and r["method"] == "engine":
            r["throughput_vs_batch1"] = r["decode_tokens_per_s"] / one["decode_tokens_per_s"]
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "hardware": hardware(device),
        "model": {
            "name": args.model if args.checkpoint is None else str(args.checkpoint),
            "hidden_size": runner.hidden_size,
            "layers": runner.pretrained_config["num_hidden_layers"],
            "vocab_size": runner.vocab_size,
            "dtype": args.dtype,
            "weight_bytes_per_token": weight_bytes,
        },
        "bandwidth": {
            **probe,
            "limit_decode_steps_per_s": limit,
            "peak_gb_per_s": peak,
            "probes_gb_per_s": [p["gb_per_s"] for p in probes],
        },  # before eager, before and after the engine
        "products_alone": {"ms": products * 1e3, "pct_of_limit": 100 / (products * limit)},
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
        f"{'method':<7} {'batch':>5} {'TTFT ms':>9} {'decode tok/s':>13} {'% of limit':>11} {'peak MB':>9} "
        f"{'x batch 1':>9} {'same tokens':>11}",
    ]
    for r in report["results"]:
        speedup = f"{r['throughput_vs_batch1']:.2f}" if "throughput_vs_batch1" in r else ""
        same = f"{r['same_tokens_as_eager']}/{r['batch']}" if "same_tokens_as_eager" in r else ""
        lines.append(
            f"{r['method']:<7} {r['batch']:>5} {r['ttft_ms']:>9.1f} {r['decode_tokens_per_s']:>13.1f} "
            f"{r['pct_of_limit']:>10.1f}% {r['peak_mem_mb']:>9.1f} {speedup:>9} {same:>11}"
        )
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
    try:
        results = run_benchmark(args, argv)
    except MachineTooBusy as err:
        sys.exit(f"qwenvl-lab bench: {err}")  # advice, not a bug: one line, no traceback
    report = {"command": "python -m qwenvl_lab.bench " + shlex.join(argv), **results}
    print(format_table(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


if __name__ == "__main__":
    main()
