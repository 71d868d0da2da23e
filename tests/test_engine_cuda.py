"""The engine on an NVIDIA GPU: every decode back end in CUDA graphs gives the CPU engine's tokens; fp16 stays close."""

import json

import pytest
import torch

from qwenvl_lab import bench
from qwenvl_lab.checkpoint import load_checkpoint, make_tiny_checkpoint
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine

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


@pytest.mark.parametrize("backend", ["triton", "compiled", "torch"])
def test_cuda_graphs_give_the_cpu_engines_tokens(engine_dir, backend):
    """fp32 on both devices: each back end, captured in CUDA graphs, picks the CPU engine's greedy tokens and beams."""
    cpu = ModelRunner.from_dir(engine_dir)
    gpu = ModelRunner.from_dir(engine_dir, device="cuda", decode_backend=backend)
    assert gpu.decoder.capture
    assert ModelRunner.from_dir(engine_dir, device="cuda").decode_backend == "triton"  # auto, 12 rows
    for kwargs in ({}, {"num_beams": 3}, {}):
        expected = cpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(gpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0, **kwargs).cpu(), expected)
    captured = dict(gpu.decoder.graphs)
    assert captured and all(isinstance(graph, torch.cuda.CUDAGraph) for graph, _ in captured.values())
    gpu.generate(PROMPTS, max_new_tokens=8, end_id=-1, pad_id=0)
    assert gpu.decoder.graphs.keys() == captured.keys()  # replayed, not captured again


def test_fp16_engine_logits_close_to_eager_fp16(checkpoint, tmp_path):
    engine_dir = build_engine(
        checkpoint, tmp_path / "fp16", BuildConfig(max_input_len=128, max_seq_len=192, dtype="float16")
    )
    runner = ModelRunner.from_dir(engine_dir, device="cuda")
    model = load_checkpoint(checkpoint, dtype=torch.float16, device="cuda")
    ids = PROMPTS[2].cuda()
    with torch.inference_mode():
        eager = model(ids[None]).logits[0, -1]
        engine = runner.engine.prefill(runner.engine.embed(ids), [len(ids)], [range(0, 1)])[0]
        step = runner.decoder(eager.argmax()[None], torch.tensor([len(ids)], device="cuda"), len(ids) + 1)[0]
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
    assert report["settings"]["cuda_graphs"] and report["settings"]["decode_backend"] == "triton"
    assert report["hardware"]["gpu"] and all(r["decode_tokens_per_s"] > 0 for r in report["results"])


def test_warm_up_saves_the_tuned_choices_and_a_second_load_reuses_them(engine_dir, tmp_path, monkeypatch):
    """from_dir warms up on CUDA (autotuning, a CUDA graph); the choices land in tuning.json and a second runner
    starts with them, so the autotuner times nothing again."""
    from qwenvl_lab.engine.decode import triton_linear  # noqa: PLC0415 — triton is optional

    monkeypatch.setattr(triton_linear._tuned, "cache", {})
    first = ModelRunner.from_dir(engine_dir, device="cuda")
    tuned = json.loads((engine_dir / "tuning.json").read_text())
    assert list(tuned) == [first.decode_step.tuning_key()] and len(tuned[first.decode_step.tuning_key()]) >= 4
    assert first.decoder.graphs  # the first CUDA graph was captured in the warm-up
    monkeypatch.setattr(triton_linear._tuned, "cache", {})
    second = ModelRunner.from_dir(engine_dir, device="cuda", warm_up=False)
    assert triton_linear.tuned_choices() == tuned[first.decode_step.tuning_key()]  # loaded, nothing timed
    assert torch.equal(
        second.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0),
        first.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0),
    )
