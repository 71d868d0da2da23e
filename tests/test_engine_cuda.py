"""The engine on an NVIDIA GPU: each decode back end in CUDA graphs gives the CPU engine's tokens; fp16 stays close."""

import json

import pytest
import torch

from qwenvl_lab import bench
from qwenvl_lab.checkpoint import load_checkpoint, make_tiny_checkpoint
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine
from qwenvl_lab.engine.cuda_graphs import DecodeGraphs, kv_bucket

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    ),
]
PROMPTS = [
    torch.tensor([151644, 8948, 198, 2610, 525]),
    torch.tensor([872, 198, 3838, 374, 304, 279, 6802, 30]),
    torch.arange(100, 170),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny random checkpoint."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), with_vocab=False)


@pytest.fixture(scope="module")
def engine_dir(checkpoint, tmp_path_factory):
    """fp32, three beams."""
    config = BuildConfig(max_batch_size=4, max_input_len=128, max_seq_len=192, max_beam_width=3)
    return build_engine(checkpoint, tmp_path_factory.mktemp("engine"), config)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_cuda_graphs_give_the_cpu_engines_tokens(engine_dir, backend):
    """fp32 on both devices: each back end, captured in CUDA graphs, picks the CPU engine's greedy tokens and beams."""
    cpu = ModelRunner.from_dir(engine_dir)
    gpu = ModelRunner.from_dir(engine_dir, device="cuda", backend=backend, cuda_graphs=True)
    assert isinstance(gpu.decoder, DecodeGraphs)
    for kwargs in ({}, {"num_beams": 3}, {}):
        expected = cpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(gpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0, **kwargs).cpu(), expected)
    captured = dict(gpu.decoder.graphs)
    assert captured and all(isinstance(graph, torch.cuda.CUDAGraph) for graph, _ in captured.values())
    gpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0)
    assert gpu.decoder.graphs.keys() == captured.keys()  # replayed, not captured again


def test_triton_takes_more_rows_than_one_tile(checkpoint, tmp_path):
    """6 requests × 3 beams = 18 cache rows, two of the kernels' row tiles: the CPU engine's tokens and beams."""
    config = BuildConfig(max_batch_size=6, max_input_len=128, max_seq_len=192, max_beam_width=3)
    engine_dir = build_engine(checkpoint, tmp_path / "engine", config)
    cpu = ModelRunner.from_dir(engine_dir)
    gpu = ModelRunner.from_dir(engine_dir, device="cuda", backend="triton", cuda_graphs=True)
    prompts = PROMPTS + [p[1:] for p in PROMPTS]
    for kwargs in ({}, {"num_beams": 3}):
        expected = cpu.generate(prompts, max_new_tokens=6, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(gpu.generate(prompts, max_new_tokens=6, end_id=-1, pad_id=0, **kwargs).cpu(), expected)


def test_fp16_engine_logits_close_to_eager_fp16(checkpoint, tmp_path):
    engine_dir = build_engine(
        checkpoint, tmp_path / "fp16", BuildConfig(max_input_len=128, max_seq_len=192, dtype="float16")
    )
    runner = ModelRunner.from_dir(engine_dir, device="cuda", backend="triton", cuda_graphs=True)
    model = load_checkpoint(checkpoint, dtype=torch.float16, device="cuda")
    ids = PROMPTS[2].cuda()
    with torch.inference_mode():
        eager = model(ids[None]).logits[0, -1]
        engine = runner.engine.prefill(runner.engine.embed(ids), [len(ids)], [range(0, 1)])[0]
        pos, kv_len = torch.tensor([len(ids)], device="cuda"), kv_bucket(len(ids) + 1, runner.max_seq_len)
        step = runner.decoder(eager.argmax()[None], pos, kv_len)[0]
        eager_step = model(torch.cat([ids, eager.argmax()[None]])[None]).logits[0, -1]
    assert torch.allclose(engine, eager, atol=2e-2) and torch.allclose(step, eager_step, atol=2e-2)


def test_bench_on_cuda(tmp_path):
    """The benchmark end to end on the GPU (64 new tokens: enough that a run takes clearly longer than one token)."""
    report = bench.main(
        [
            "--model",
            "tiny",
            "--device",
            "cuda",
            "--batch",
            "1",
            "2",
            "--new-tokens",
            "64",
            "--repeats",
            "3",
            "--json",
            tmp_path / "b.json",
        ]
    )
    assert report["settings"]["cuda_graphs"] and report["settings"]["backend"] == "triton"  # the GPU's fast path
    assert report["hardware"]["gpu"] and all(r["decode_tokens_per_s"] > 0 for r in report["results"])


def test_warm_up_saves_the_tuned_choices_and_a_second_load_reuses_them(engine_dir, tmp_path, monkeypatch):
    """from_dir warms the Triton back end up (autotuning, a CUDA graph); the choices land in tuning.json and a second
    runner starts with them, so the autotuner times nothing again."""
    from qwenvl_lab.engine.decode import triton_linear  # noqa: PLC0415 — triton is optional

    monkeypatch.setattr(triton_linear._tuned, "cache", {})
    first = ModelRunner.from_dir(engine_dir, device="cuda", backend="triton", cuda_graphs=True)
    tuned = json.loads((engine_dir / "tuning.json").read_text())
    key = first.decode_step.tuning_key
    assert list(tuned) == [key] and len(tuned[key]) >= 4 and torch.cuda.get_device_name() in key
    assert first.decoder.graphs  # the first CUDA graph was captured in the warm-up
    monkeypatch.setattr(triton_linear._tuned, "cache", {})
    second = ModelRunner.from_dir(engine_dir, device="cuda", backend="triton", cuda_graphs=True, warm_up=False)
    assert triton_linear.tuned_choices() == tuned[key]  # loaded, nothing timed
    assert torch.equal(
        second.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0),
        first.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0),
    )


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_an_int8_engine_in_cuda_graphs_gives_the_cpu_int8_engines_tokens(checkpoint, tmp_path, backend):
    """Weight-only INT8 (float32 activations): the compiled int8 products, in CUDA graphs, pick the CPU engine's greedy
    tokens and beams (the CPU engine dequantises each matrix with PyTorch ops)."""
    config = BuildConfig(max_batch_size=4, max_input_len=128, max_seq_len=192, max_beam_width=3, weight_only="int8")
    engine_dir = build_engine(checkpoint, tmp_path / "int8", config)
    cpu = ModelRunner.from_dir(engine_dir)
    gpu = ModelRunner.from_dir(engine_dir, device="cuda", backend=backend, cuda_graphs=True)
    assert gpu.engine.layers[0].qkv_t.dtype == torch.int8
    for kwargs in ({}, {"num_beams": 3}):
        expected = cpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(gpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0, **kwargs).cpu(), expected)


def test_bench_measures_the_int8_engine_beside_the_float_one(tmp_path):
    """--weight-only int8 on the GPU: both engines' rows, the int8 engine's own limit, and its drift."""
    report = bench.main(
        ["--model", "tiny", "--device", "cuda", "--batch", "1", "2", "--new-tokens", "32", "--repeats", "2",
         "--no-eager", "--weight-only", "int8", "--drift-steps", "4", "--json", tmp_path / "b.json"]
    )  # fmt: skip
    methods = [r["method"] for r in report["results"]]
    assert methods == ["engine", "engine", "engine-int8", "engine-int8"]
    wo = report["weight_only"]
    assert wo["weight_bytes_vs_float"] < 1 and len(wo["drift"]["layers_rel_l2"]) == report["model"]["layers"]
    assert all(r["vs_float_engine"] > 0 for r in report["results"] if r["method"] == "engine-int8")
