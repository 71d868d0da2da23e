"""`python tools/decode_profile.py` — where one decode step's time goes on a GPU: kernels by role, and the gaps.

The engine (Qwen-VL-Chat's shapes with random weights on CUDA, or the toy model) generates greedily under
torch.profiler, the decode step replayed as CUDA graphs with the Triton kernels, as the benchmark runs it. Each kernel
the GPU ran is sorted into its role by its name and its place in the step (a step is the 2L + 1 norms, L attention
kernels and 4L + 1 products of the Triton step, then the work outside the graph: the greedy pick and the runner's
bookkeeping), and the time between kernels is counted as gaps, inside the graph and around it. Per step: the time of
each role, its share of the step, each product's bandwidth (weight bytes ÷ its time), and the kernels outside the
graph by name. `--device cpu` runs the same measurement on the PyTorch back end without graphs (the CPU's operators
stand in for kernels): a dry run of the script, not a measurement of the GPU design.

    python tools/decode_profile.py --model qwen-vl-chat --device cuda --batch 1 --json profile.json
    python tools/decode_profile.py --model qwen-vl-chat --device cuda --batch 1 --weight-only int8 --json p8.json
"""

import argparse
import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path

from qwenvl_lab import files

JSON_WRITER = files.writer("decode profile --json", "a decode step's profile")
TRITON = {"_fused_linear_kernel": "product", "_rms_norm_kernel": "norm", "_decode_attention_kernel": "attention"}
PRODUCTS = ("qkv", "dense", "gate_fc", "proj")  # a layer's products in the step's order; then lm_head


def role_of(name: str) -> str | None:
    """The Triton kernel a kernel name belongs to ("product", "norm", "attention"), or None (a PyTorch kernel)."""
    return next((role for kernel, role in TRITON.items() if kernel in name), None)


def steps_of(kernels: list[dict], layers: int) -> list[list[dict]]:
    """The kernels [{name, start_us, dur_us}] of the decode steps, in order: a step starts at the first Triton kernel
    after PyTorch kernels (the prefill, or the previous step's pick and bookkeeping) and runs to the next step. Only
    steps with all their L attention kernels are kept, and not the last one, whose PyTorch kernels are the end of the
    generation."""
    steps, outside = [], True
    for k in sorted(kernels, key=lambda k: k["start_us"]):
        triton = role_of(k["name"]) is not None
        if triton and outside:
            steps.append([])
        outside = not triton
        if steps:
            steps[-1].append(k)
    return [s for s in steps[:-1] if sum(role_of(k["name"]) == "attention" for k in s) == layers]


def summarize(kernels: list[dict], layers: int, product_bytes: dict) -> dict:
    """Per decode step (the mean over whole steps): milliseconds and shares by role, gaps inside the graph (between
    Triton kernels) and outside it, each product role's microseconds and GB/s (`product_bytes`: its weight bytes),
    and the kernels outside the graph by name (microseconds a step, launches a step)."""
    steps = steps_of(kernels, layers)
    if len(steps) < 2:
        raise ValueError(
            f"the profile holds {len(steps)} whole decode step(s) of {layers} layers: profile more steps (the kernels "
            "inside CUDA graphs need CUPTI's graph tracing, on with torch 2.x and CUDA 12)"
        )
    totals = defaultdict(float)
    per_product = defaultdict(list)
    outside = defaultdict(lambda: [0.0, 0])
    for step in steps:
        last = step[-1]
        end = min((k["start_us"] for k in kernels if k["start_us"] > last["start_us"]), default=None)
        end = end if end is not None else last["start_us"] + last["dur_us"]  # the next step's first kernel
        totals["step"] += end - step[0]["start_us"]
        products = 0
        for k, nxt in zip(step, step[1:] + [None]):
            role = role_of(k["name"])
            gap = max(0.0, (nxt["start_us"] if nxt is not None else end) - (k["start_us"] + k["dur_us"]))
            inside = role is not None and nxt is not None and role_of(nxt["name"]) is not None
            totals["gaps inside the graph" if inside else "gaps outside the graph"] += gap
            if role == "product":
                name = PRODUCTS[products % 4] if products < 4 * layers else "lm_head"
                per_product[name].append(k["dur_us"])
                products += 1
            if role is None:
                totals["pick and bookkeeping"] += k["dur_us"]
                outside[k["name"]][0] += k["dur_us"]
                outside[k["name"]][1] += 1
            else:
                totals[role + "s" if role != "attention" else role] += k["dur_us"]
    n = len(steps)
    step_us = totals["step"] / n
    roles = {key: value / n / 1e3 for key, value in totals.items()}
    return {
        "steps": n,
        "ms_per_step": roles,
        "share_of_step": {key: 1e3 * value / step_us for key, value in roles.items() if key != "step"},
        "products": {
            name: {
                "us_per_step": sum(times) / n,
                "launches_per_step": len(times) / n,
                "us_each": sum(times) / len(times),
                "gb_per_s": product_bytes[name] * len(times) / n / (sum(times) / n * 1e-6) / 1e9
                if name in product_bytes
                else None,
            }
            for name, times in per_product.items()
        },
        "outside_the_graph": {
            name: {"us_per_step": t / n, "launches_per_step": c / n} for name, (t, c) in sorted(outside.items())
        },
        "kernels_per_step": sum(len(s) for s in steps) / n,
    }


def product_bytes(engine) -> dict:
    """Weight bytes each product role reads in one launch (a layer's matrix and its scales, or lm_head)."""
    layer = engine.layers[0]

    def size(*tensors):
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    return {
        "qkv": size(layer.qkv_t, layer.qkv_s, layer.qkv_b),
        "dense": size(layer.dense_t, layer.dense_s),
        "gate_fc": size(layer.gate_fc_t, layer.gate_fc_s),
        "proj": size(layer.proj_t, layer.proj_s),
        "lm_head": size(engine.lm_head_t),
    }


def kernels_from(prof, device_type) -> list[dict]:
    """The profile's device kernels (or, on a CPU, its operators) as [{name, start_us, dur_us}]."""
    out = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == device_type and e.duration_ns() > 0:
            out.append({"name": e.name(), "start_us": e.start_ns() / 1e3, "dur_us": e.duration_ns() / 1e3})
    return out


def main(argv=None) -> dict:
    """Profile the decode steps of one greedy generation and write the summary."""
    import torch  # noqa: PLC0415 — `--help` answers without torch

    from qwenvl_lab import bench  # noqa: PLC0415
    from qwenvl_lab.engine import ModelRunner  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python tools/decode_profile.py", description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("toy", "qwen-vl-chat"), default="qwen-vl-chat")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=24, help="decode steps profiled (default 24)")
    parser.add_argument("--weight-only", choices=("int8",))
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay the step as CUDA graphs, as the benchmark does (default on; off when the profiler cannot see "
        "the kernels inside graphs: then the kernels' times hold, the gaps are launch gaps)",
    )
    parser.add_argument("--tuning-file", type=Path, help="the Triton tile choices: reused when there, saved after")
    parser.add_argument("--trace", type=Path, help="also write the profiler's Chrome trace here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.steps < 3:
        parser.error("--batch must be >= 1 and --steps >= 3")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here (use --device cpu for a dry run)")
    if args.model == "qwen-vl-chat" and args.device == "cpu":
        parser.error("--model qwen-vl-chat makes a 7.7-billion-parameter model: use --device cuda, or --model toy")
    dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    bench_args = bench.parse_args(
        ["--model", args.model, "--device", args.device, "--dtype", dtype, "--batch", str(args.batch),
         "--new-tokens", str(args.steps + 8)]
        + (["--weight-only", args.weight_only] if args.weight_only else [])
    )  # fmt: skip
    device = torch.device(args.device)
    torch.manual_seed(0)
    model, _ = bench.load_model(bench_args, device, getattr(torch, dtype), Path("."))
    requests, table = bench.make_requests(
        bench.picture_features(model, args.batch, real=False), model.config.vocab_size
    )
    config = bench.engine_limits(requests, table, bench_args)
    if args.weight_only:
        from dataclasses import replace  # noqa: PLC0415

        config = replace(config, weight_only=args.weight_only)
    backend = "triton" if device.type == "cuda" else "torch"
    runner = ModelRunner.from_model(
        model,
        config,
        device,
        backend=backend,
        cuda_graphs=device.type == "cuda" and args.cuda_graphs,
        tuning_file=args.tuning_file,
    )
    del model
    runner.warm_up(progress=False)
    bench.engine_generate(runner, requests, table, args.steps + 8)  # the graphs of every KV bucket the run meets
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    bench.synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        bench.engine_generate(runner, requests, table, args.steps + 8)
        bench.synchronize(device)
    if args.trace is not None:
        prof.export_chrome_trace(str(args.trace))
    kind = torch.autograd.DeviceType.CUDA if device.type == "cuda" else torch.autograd.DeviceType.CPU
    kernels = kernels_from(prof, kind)
    layers = len(runner.engine.layers)
    report = {
        "command": "python tools/decode_profile.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "hardware": bench.hardware(device),
        "settings": {
            "model": args.model,
            "dtype": dtype,
            "weight_only": args.weight_only,
            "batch": args.batch,
            "backend": runner.backend,
            "cuda_graphs": runner.cuda_graphs,
            "prompt_lengths": [len(r) for r in requests],
            "layers": layers,
        },
        "weight_bytes_per_token": runner.engine.weight_bytes_per_token,
    }
    if device.type == "cuda":
        report["profile"] = summarize(kernels, layers, product_bytes(runner.engine))
    else:  # the CPU's operators by total time: a dry run of the plumbing
        by_name = defaultdict(float)
        for k in kernels:
            by_name[k["name"]] += k["dur_us"]
        report["cpu_operators_ms"] = {n: t / 1e3 for n, t in sorted(by_name.items(), key=lambda x: -x[1])[:15]}
    runner.decode_step.save_tuning()
    print(json.dumps(report, indent=2))
    if args.json is not None:
        save_report(args.json, report)
    return report


def save_report(path: Path, report: dict, overwrite: bool = True) -> None:
    """The profile as JSON at `path`, written the package's one way (replacing an earlier profile there)."""
    files.write_text(path, json.dumps(report, indent=2) + "\n", JSON_WRITER, overwrite=overwrite, parents=True)


if __name__ == "__main__":
    main()
