"""numba's decode kernel: the PyTorch step's logits and cache entries for one row and for several, the same tokens
through greedy decoding and beams, over the engine's own tensors."""

import numpy as np
import pytest
import torch

pytest.importorskip("numba", reason="the CPU decode kernel needs numba (pip install numba)")

from qwenvl_lab.engine import ModelRunner  # noqa: E402
from qwenvl_lab.engine.layers import LAYER_WEIGHTS  # noqa: E402

NEW_TOKENS = 6


@pytest.fixture(scope="module")
def runners(tiny_engine):
    """The tiny engine with the numba kernel and with the PyTorch step."""
    return ModelRunner.from_dir(tiny_engine, backend="numba", warm_up=False), ModelRunner.from_dir(tiny_engine)


def prefilled(runner, prompts):
    """The runner's engine with prompt r in cache row r (random stale entries after them, where a KV bucket reaches)."""
    engine = runner.engine
    torch.manual_seed(0)
    engine.kv_cache.normal_()
    with torch.inference_mode():
        for r, prompt in enumerate(prompts):
            engine.prefill(engine.embed(prompt), [len(prompt)], [range(r, r + 1)])
    return engine


@pytest.mark.parametrize(
    "ids, pos, kv_len",
    [
        ([5], [17], 18),
        ([151643], [19], 64),  # a KV bucket past the row, over stale entries
        ([5, 9, 151643], [17, 3, 40], 64),  # rows at their own positions, each in its own cache row
    ],
)
def test_numba_step_gives_the_pytorch_steps_logits_and_cache_entries(runners, ids, pos, kv_len):
    kernel, ops = runners
    prompts = [torch.arange(100, 117), torch.arange(200, 203), torch.arange(300, 340)]
    a, b = prefilled(kernel, prompts), prefilled(ops, prompts)
    ids, pos = torch.tensor(ids), torch.tensor(pos)
    with torch.inference_mode():
        logits = kernel.decode_step(ids, pos, kv_len)
        torch.testing.assert_close(logits, ops.decode_step(ids, pos, kv_len), atol=1e-4, rtol=1e-4)
    assert logits.shape == (len(ids), kernel.vocab_size) and logits.dtype == torch.float32
    for r, at in enumerate(pos.tolist()):  # this step's key and value written at `at`, nothing after it
        torch.testing.assert_close(
            a.kv_cache[:, :, r, :, : at + 1], b.kv_cache[:, :, r, :, : at + 1], atol=1e-5, rtol=1e-5
        )
        assert torch.equal(a.kv_cache[:, :, r, :, at + 1 :], b.kv_cache[:, :, r, :, at + 1 :])
    assert torch.equal(a.kv_cache[:, :, len(ids) :], b.kv_cache[:, :, len(ids) :])  # other rows untouched


def test_numba_decoding_gives_the_pytorch_tokens_and_beams(runners, tokenizer):
    """A batch of two prompts of different lengths, greedy and with 3 beams (cache rows reordered every step)."""
    kernel, ops = runners
    prompts = [
        torch.tensor(tokenizer.encode("Which picture shows more shapes, and what colour are they?")),
        torch.tensor(tokenizer.encode("图片里是什么？")),
    ]
    for options in ({}, {"num_beams": 3}):
        expected = ops.generate(prompts, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **options)
        assert torch.equal(
            kernel.generate(prompts, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **options), expected
        )


def test_the_kernel_reads_the_engines_own_weights_and_cache(runners):
    """No copy of a weight: the kernel's arrays are the engine's stacked [layers, …] tensors and its KV cache."""
    engine, step = runners[0].engine, runners[0].decode_step
    for name, array in zip(LAYER_WEIGHTS, step.layer_weights):
        assert np.shares_memory(array, engine.stacks[name].numpy()) and array.shape[0] == len(engine.layers)
    assert np.shares_memory(step.kv_cache, engine.kv_cache.numpy())
    assert np.shares_memory(step.embedding, engine.vocab_embedding.numpy())
