"""numba's one-row decode kernel: the PyTorch step's logits and cache entries, its tokens, its defaults and errors."""

import numpy as np
import pytest
import torch

pytest.importorskip("numba", reason="the CPU decode kernel needs numba (pip install numba)")

import importlib.util

from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine  # noqa: E402
from qwenvl_lab.engine.cuda_graphs import DecodeGraphs  # noqa: E402
from qwenvl_lab.engine.decode.numba_step import LAYER_WEIGHTS  # noqa: E402

NEW_TOKENS = 6


def prefilled(runner, prompt):
    """The runner's engine with `prompt` in cache row 0 (garbage in the cache after it, where a KV bucket reaches)."""
    engine = runner.engine
    torch.manual_seed(0)
    engine.kv_cache.normal_()
    with torch.inference_mode():
        engine.prefill(engine.embed(prompt), [len(prompt)], [range(0, 1)])
    return engine


def test_numba_step_gives_the_pytorch_steps_logits_and_cache_entries(tiny_engine):
    kernel, ops = ModelRunner.from_dir(tiny_engine), ModelRunner.from_dir(tiny_engine, decode_backend="torch")
    assert (kernel.decode_backend, ops.decode_backend) == ("numba", "torch")
    prompt = torch.arange(100, 117)  # 17 ids
    a, b = prefilled(kernel, prompt), prefilled(ops, prompt)
    with torch.inference_mode():
        for token, at, kv_len in ((5, 17, 18), (9, 18, 19), (151643, 19, 64)):  # the last: a bucket past the row
            logits = kernel.decode_step(torch.tensor([token]), torch.tensor([at]), kv_len)
            torch.testing.assert_close(
                logits, ops.decode_step(torch.tensor([token]), torch.tensor([at]), kv_len), atol=1e-4, rtol=1e-4
            )
            assert logits.shape == (1, kernel.vocab_size) and logits.dtype == torch.float32
            torch.testing.assert_close(
                a.kv_cache[:, :, 0, :, : at + 1], b.kv_cache[:, :, 0, :, : at + 1], atol=1e-5, rtol=1e-5
            )  # this step's key and value written at `at`
    assert torch.equal(a.kv_cache[:, :, 1:], b.kv_cache[:, :, 1:])  # other rows untouched


def test_numba_step_gives_the_batched_tokens_past_a_stale_bucket(tiny_engine, tokenizer):
    """Alone (numba's kernel), in a batch of two (PyTorch), and through CUDA-graph buckets whose KV length runs past
    the row over another prompt's stale entries: the same greedy tokens."""
    kernel, graphed = ModelRunner.from_dir(tiny_engine), ModelRunner.from_dir(tiny_engine)
    graphed.decoder = DecodeGraphs(graphed.decode_step, 24, graphed.max_seq_len, "cpu")  # CUDA's buckets, on the CPU
    prompt = torch.tensor(tokenizer.encode("图片里是什么？"))
    other = torch.tensor(tokenizer.encode("Which picture shows more shapes, and what colour are they?"))
    alone = kernel.generate([prompt], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)[0, 0]
    batched = kernel.generate([other, prompt], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)[1, 0]
    assert torch.equal(alone, batched[: len(alone)])
    graphed.generate([other], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)
    assert torch.equal(graphed.generate([prompt], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)[0, 0], alone)
    assert graphed.decode_backend == "numba"
    assert all(bucket > len(prompt) + NEW_TOKENS for _, bucket in graphed.decoder.graphs)


def test_layers_read_the_kernels_stacked_weights(tiny_engine):
    """One copy of the weights: each layer's tensors are views of the [layers, …] arrays the kernel reads."""
    runner = ModelRunner.from_dir(tiny_engine)
    engine, row_decoder = runner.engine, runner.decode_step.row_decoder
    for i, layer in enumerate(engine.layers):
        for name, stacked in zip(LAYER_WEIGHTS, row_decoder.layer_weights):
            assert stacked.shape[0] == len(engine.layers)
            assert np.shares_memory(getattr(layer, name).numpy(), stacked[i])
    assert np.shares_memory(row_decoder.kv_cache, engine.kv_cache.numpy())


def test_numba_is_the_default_for_float32_on_a_cpu_only(tiny_checkpoint, tiny_engine, tmp_path):
    assert ModelRunner.from_dir(tiny_engine).decode_backend == "numba"
    assert "decode_backend='numba'" in repr(ModelRunner.from_dir(tiny_engine))
    bf16 = build_engine(
        tiny_checkpoint,
        tmp_path / "bf16",
        BuildConfig(max_batch_size=1, max_input_len=32, max_seq_len=48, dtype="bfloat16"),
    )
    assert ModelRunner.from_dir(bf16).decode_backend == "torch"
    with pytest.raises(ValueError, match='float32 engines on a CPU, not torch.bfloat16.*decode_backend="auto"'):
        ModelRunner.from_dir(bf16, decode_backend="numba")


def test_without_numba_the_pytorch_ops_run_and_asking_for_it_says_what_to_install(tiny_engine, monkeypatch):

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba" else find_spec(name, *a))
    assert ModelRunner.from_dir(tiny_engine).decode_backend == "torch"
    with pytest.raises(ValueError, match=r'needs numba \(pip install numba\); choose "torch"'):
        ModelRunner.from_dir(tiny_engine, decode_backend="numba")
