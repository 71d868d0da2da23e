"""The engine's Triton decode kernels (on a CPU through Triton's interpreter): each equals its PyTorch reference,
refuses what it cannot do, and the decode step built from them gives the plain engine's tokens."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip(
    "triton",
    reason="the fused decode kernels need triton, which has wheels for Linux (x86_64, aarch64) "
    "only: pip install triton there",
)

from qwenvl_lab import bench
from qwenvl_lab.checkpoint import TINY_CONFIG  # noqa: E402
from qwenvl_lab.engine import BuildConfig, ModelRunner  # noqa: E402
from qwenvl_lab.engine.decode import triton_linear  # noqa: E402
from qwenvl_lab.engine.decode.triton_attention import CHUNK, decode_attention  # noqa: E402
from qwenvl_lab.engine.decode.triton_linear import ROW_TILE, embed_rms_norm, fused_linear, rms_norm  # noqa: E402
from qwenvl_lab.modeling import QWenLMHeadModel, QWenVLConfig, RMSNorm, apply_rope  # noqa: E402
from qwenvl_lab.unified_checkpoint import quantize_per_channel  # noqa: E402

K, N = 96, 40  # not multiples of the tiles: the masks are exercised
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # without a GPU: Triton's interpreter (tests/conftest.py)


@pytest.fixture(autouse=True)
def on_device():
    """Every tensor of these tests on DEVICE."""
    with torch.device(DEVICE):
        yield


def close(dtype):
    """Tolerances: float32 to rounding, float16 to a few of its units (the kernels keep float32 until the end)."""
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, ROW_TILE + 3])  # the last: two tiles of rows
def test_fused_linear_equals_its_reference(dtype, rows):
    torch.manual_seed(rows)
    x, w, b = torch.randn(rows, K).to(dtype), (torch.randn(N, K) / 10).to(dtype), torch.randn(N).to(dtype)
    product = x.float() @ w.float().T
    torch.testing.assert_close(fused_linear(x, w).float(), product, **close(dtype))
    torch.testing.assert_close(fused_linear(x, w, b).float(), product + b.float(), **close(dtype))
    residual = torch.randn(rows, N)
    out = residual.clone()
    assert fused_linear(x, w, out=out) is out  # added in place into the float32 residual stream, split over K
    torch.testing.assert_close(out, residual + product, **close(dtype))
    gate_fc = (torch.randn(2 * N, K) / 10).to(dtype)  # gate rows, then fc rows
    h = x.float() @ gate_fc.float().T
    torch.testing.assert_close(
        fused_linear(x, gate_fc, swiglu=True).float(), h[:, :N] * F.silu(h[:, N:]), **close(dtype)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, ROW_TILE + 3])
def test_int8_fused_linear_equals_the_float_product_of_its_dequantized_weight(dtype, rows):
    """Weight-only INT8: int8 rows read and turned into x's dtype in registers, the float32 sums scaled per row —
    against x @ (q · scale).T in float32, for the plain product, bias, split-K accumulation and the gated MLP."""
    torch.manual_seed(rows)
    x, b = torch.randn(rows, K).to(dtype), torch.randn(N).to(dtype)
    q, scale = quantize_per_channel(torch.randn(N, K) / 10)
    scale = scale.to(dtype)
    w = q.float() * scale.float()[:, None]  # [N, K]: what the int8 rows stand for
    product = x.float() @ w.T
    torch.testing.assert_close(fused_linear(x, q, scale=scale).float(), product, **close(dtype))
    got = fused_linear(x, q, b, scale=scale)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), product + b.float(), **close(dtype))
    residual = torch.randn(rows, N)
    out = residual.clone()
    assert fused_linear(x, q, out=out, scale=scale) is out
    torch.testing.assert_close(out, residual + product, **close(dtype))
    q2, scale2 = quantize_per_channel(torch.randn(2 * N, K) / 10)  # gate rows, then fc rows, each row its scale
    scale2 = scale2.to(dtype)
    h = x.float() @ (q2.float() * scale2.float()[:, None]).T
    torch.testing.assert_close(
        fused_linear(x, q2, swiglu=True, scale=scale2).float(), h[:, :N] * F.silu(h[:, N:]), **close(dtype)
    )


def test_logits_come_out_in_float32_from_a_float16_product():
    torch.manual_seed(0)
    x, w = torch.randn(2, K).half(), (torch.randn(N, K) / 10).half()
    got = fused_linear(x, w, dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, x.float() @ w.float().T, **close(torch.float16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embed_rms_norm_is_the_embedding_in_float32_and_its_norm(dtype):
    """The step's first kernel: F.embedding, .float() and rms_norm in one launch; ids may be a strided view (beam
    search hands its tokens as one)."""
    torch.manual_seed(0)
    table, weight = torch.randn(50, K).to(dtype), torch.rand(K).to(dtype) + 0.5
    for ids in (torch.tensor([3, 49, 0]), torch.tensor([7, 1, 8, 2, 9, 3])[::2]):
        x, h = embed_rms_norm(ids, table, weight, 1e-6)
        assert x.dtype == torch.float32 and h.dtype == dtype
        assert torch.equal(x, F.embedding(ids, table).float())
        torch.testing.assert_close(h, rms_norm(F.embedding(ids, table).float(), weight, 1e-6), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_equals_the_models(dtype):
    """From the float32 residual stream to the engine dtype: the model's RMSNorm (float32: to rounding)."""
    torch.manual_seed(0)
    norm = RMSNorm(K, 1e-6)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(3, K) * 3
    with torch.no_grad():
        expected = norm.to(dtype)(x.to(dtype) if dtype != torch.float32 else x)
    got = rms_norm(x, norm.weight.data.to(dtype), 1e-6)
    assert got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, **close(dtype))  # a GPU's rsqrt is not PyTorch's to the last bit
    else:
        torch.testing.assert_close(got, expected, atol=8e-3, rtol=4e-3)  # the model rounds x to float16 first


def rope_tables(seq, hd):
    """cos, sin (the model's NeoX tables) and sin_signed (the kernel's) [seq, hd]."""
    angles = torch.arange(seq)[:, None] * torch.rand(hd // 2)
    return (
        torch.cat([angles.cos()] * 2, dim=-1),
        torch.cat([angles.sin()] * 2, dim=-1),
        torch.cat([-angles.sin(), angles.sin()], dim=-1),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_attention_equals_rope_cache_write_and_sdpa(dtype):
    """Rows at different positions (the first, one chunk, several, the first key of a chunk): RoPE on q and k, k and v
    written into the cache at pos, then SDPA over keys 0..pos."""
    torch.manual_seed(0)
    heads, hd, rows, seq = 2, 16, 5, 2 * CHUNK + 20
    cache = torch.randn(2, rows, heads, seq, hd).to(dtype)
    cos, sin, sin_signed = (t.to(dtype) for t in rope_tables(seq, hd))
    pos = torch.tensor([3, 2 * CHUNK + 9, CHUNK, 0])  # rows 0..3; kv_len = max + 1
    qkv = torch.randn(4, 3 * heads * hd).to(dtype)
    kv_len, tickets = int(pos.max()) + 1, torch.zeros(4 * heads, dtype=torch.int32)
    expected_cache, ref = cache.clone(), qkv.view(4, 3, heads, hd).clone()
    for j in (0, 1):  # q and k: the model's RoPE
        ref[:, j] = apply_rope(ref[:, j], cos[pos][:, None], sin[pos][:, None])
    expected_cache[:, torch.arange(4), :, pos] = ref[:, 1:]
    got = decode_attention(qkv, cos, sin_signed, pos, cache, kv_len, tickets)
    torch.testing.assert_close(cache, expected_cache, **close(dtype))
    mask = torch.arange(kv_len) <= pos[:, None, None, None]  # [4, 1, 1, kv_len]
    expected = F.scaled_dot_product_attention(
        ref[:, 0].float()[:, :, None],
        expected_cache[0, :4, :, :kv_len].float(),
        expected_cache[1, :4, :, :kv_len].float(),
        attn_mask=mask,
    )
    assert got.dtype == dtype and got.shape == (4, heads * hd)
    torch.testing.assert_close(got.float(), expected.reshape(4, -1), **close(dtype))
    assert not tickets.any()  # every head's counter back at 0


def test_kernels_refuse_what_they_cannot_do():
    x, w = torch.randn(2, K), torch.randn(N, K)
    with pytest.raises(ValueError, match="does not fit x"):
        fused_linear(x, torch.randn(N, K + 1))
    with pytest.raises(ValueError, match="swiglu needs gate and fc rows stacked"):
        fused_linear(x, torch.randn(N + 1, K), swiglu=True)
    with pytest.raises(ValueError, match="x is torch.float16 but the weight is torch.float32"):
        fused_linear(x.half(), w)
    with pytest.raises(ValueError, match="contiguous float32"):
        fused_linear(x, w, out=torch.zeros(2, N, dtype=torch.float16))
    q = torch.zeros(N, K, dtype=torch.int8)
    with pytest.raises(ValueError, match="an int8 weight needs its scales"):
        fused_linear(x, q)
    with pytest.raises(ValueError, match="an int8 weight needs its scales"):
        fused_linear(x, w, scale=torch.ones(N))
    with pytest.raises(ValueError, match=f"scale must be a float tensor \\[{N}\\]"):
        fused_linear(x, q, scale=torch.ones(N + 1))
    with pytest.raises(ValueError, match="embed_rms_norm needs ids"):
        embed_rms_norm(torch.zeros(1, 2, dtype=torch.long), torch.zeros(5, K), torch.ones(K), 1e-6)
    with pytest.raises(ValueError, match="weight \\[H\\]"):
        rms_norm(x, torch.ones(K + 1), 1e-6)
    cache, tables = torch.zeros(2, 1, 2, 12, 16), (torch.zeros(12, 16), torch.zeros(12, 16))  # cos, sin_signed
    pos, tickets = torch.tensor([0]), torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="do not fit the cache"):
        decode_attention(torch.zeros(1, 10), *tables, pos, cache, 4, tickets)
    with pytest.raises(ValueError, match="do not fit the cache"):
        decode_attention(torch.zeros(1, 96), *tables, pos, cache, 13, tickets)  # kv_len > the cache's 12 positions
    with pytest.raises(ValueError, match="at least 2 counters"):
        decode_attention(torch.zeros(1, 96), *tables, pos, cache, 4, tickets[:1])
    with pytest.raises(ValueError, match="contiguous qkv"):
        decode_attention(torch.zeros(1, 192)[:, ::2], *tables, pos, cache, 4, tickets)
    with pytest.raises(ValueError, match="head size that is a power of two"):
        decode_attention(
            torch.zeros(1, 72), torch.zeros(12, 12), torch.zeros(12, 12), pos, torch.zeros(2, 1, 2, 12, 12), 4, tickets
        )


def small_model():
    """The tiny Qwen-VL with a 1000-id vocabulary: the interpreter runs every program in Python."""
    torch.manual_seed(0)
    return QWenLMHeadModel(QWenVLConfig(**{**TINY_CONFIG, "vocab_size": 1000})).eval()


@pytest.mark.slow
def test_fused_decode_gives_the_plain_engines_tokens():
    """Greedy and beams, a batch of 3 prompts of different lengths; logits of one step close."""
    model = small_model()
    config = BuildConfig(max_batch_size=3, max_input_len=32, max_seq_len=48, max_beam_width=2)
    plain = ModelRunner.from_model(model, config, DEVICE, backend="torch")
    fused = ModelRunner.from_model(model, config, DEVICE, backend="triton")
    assert "backend='triton'" in repr(fused)
    prompts = [torch.tensor([1, 2, 3, 4, 5]), torch.arange(10, 30), torch.tensor([7, 8])]
    for kwargs in ({}, {"num_beams": 2}):
        expected = plain.generate(prompts, max_new_tokens=5, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(fused.generate(prompts, max_new_tokens=5, end_id=-1, pad_id=0, **kwargs), expected)
    with torch.inference_mode():
        ids, pos = torch.tensor([5, 6]), torch.tensor([5, 20])
        torch.testing.assert_close(
            fused.decode_step(ids, pos, 21), plain.decode_step(ids, pos, 21), atol=1e-5, rtol=1e-5
        )


@pytest.mark.slow
def test_the_int8_triton_step_gives_the_int8_reference_engines_tokens():
    """Weight-only INT8 on the Triton kernels against the same engine on PyTorch ops (which dequantise each matrix):
    greedy and beams, and one step's logits."""
    model = small_model()
    config = BuildConfig(max_batch_size=3, max_input_len=32, max_seq_len=48, max_beam_width=2, weight_only="int8")
    plain = ModelRunner.from_model(model, config, DEVICE, backend="torch")
    fused = ModelRunner.from_model(model, config, DEVICE, backend="triton")
    assert fused.engine.layers[0].qkv_t.dtype == torch.int8
    prompts = [torch.tensor([1, 2, 3, 4, 5]), torch.arange(10, 30), torch.tensor([7, 8])]
    for kwargs in ({}, {"num_beams": 2}):
        expected = plain.generate(prompts, max_new_tokens=5, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(fused.generate(prompts, max_new_tokens=5, end_id=-1, pad_id=0, **kwargs), expected)
    with torch.inference_mode():
        ids, pos = torch.tensor([5, 6]), torch.tensor([5, 20])
        torch.testing.assert_close(
            fused.decode_step(ids, pos, 21), plain.decode_step(ids, pos, 21), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("weight_only", [None, "int8"])
def test_bench_times_the_fused_products_alone(monkeypatch, weight_only):
    """The benchmark's design ceiling runs the engine's own kernels when they are on (on a GPU in one CUDA graph),
    with a weight-only engine's scales."""

    config = BuildConfig(max_batch_size=1, max_input_len=8, max_seq_len=16, weight_only=weight_only)
    fused = ModelRunner.from_model(small_model(), config, DEVICE, backend="triton")
    calls, kernel = [], triton_linear.fused_linear

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(triton_linear, "fused_linear", counted)
    assert bench.products_alone(fused, runs=1, length=2) > 0
    layers = len(fused.engine.layers)
    runs, rest = divmod(len(calls), 4 * layers + 1)  # four products a layer, then lm_head
    assert rest == 0 and runs >= 2  # warm-ups and timed runs (on CUDA: a warm-up and the capture, then replays)
    assert sum(bool(k.get("swiglu")) for k in calls) == runs * layers
    assert sum(k.get("scale") is not None for k in calls) == (4 * layers * runs if weight_only else 0)


def test_tuned_choices_are_saved_and_taken_back(monkeypatch):
    """The autotuner's choices as JSON-ready entries, and back: an entry naming no tile shape is skipped."""
    monkeypatch.setattr(triton_linear._tuned, "cache", {})
    assert (
        triton_linear.use_choices(
            [
                {"key": [40, 96, "none", "torch.float16"], "config": 3},
                {"key": [1, 2], "config": len(triton_linear.CONFIGS)},
                "junk",
            ]
        )
        == 1
    )
    assert triton_linear._tuned.cache == {(40, 96, "none", "torch.float16"): triton_linear.CONFIGS[3]}
    assert triton_linear.tuned_choices() == [{"key": [40, 96, "none", "torch.float16"], "config": 3}]


def test_the_tuned_choices_go_into_the_engines_tuning_file_and_come_back(tmp_path, monkeypatch):
    """save_tuning writes the autotuner's choices under this machine's key; the next back end built over an engine
    with that file hands them back to the autotuner. A choice already saved is not written again."""
    config = BuildConfig(max_batch_size=1, max_input_len=8, max_seq_len=16)
    tuning = tmp_path / "tuning.json"
    tuning.write_text(json.dumps({"another GPU | triton 0": [{"key": [1, 1, "none"], "config": 0}]}))
    first = ModelRunner.from_model(small_model(), config, DEVICE, backend="triton", tuning_file=tuning).decode_step
    chosen = {(40, 96, "none", "torch.float16"): triton_linear.CONFIGS[5]}
    monkeypatch.setattr(triton_linear._tuned, "cache", dict(chosen))
    first.save_tuning()
    saved = json.loads(tuning.read_text())
    assert saved == {
        "another GPU | triton 0": [{"key": [1, 1, "none"], "config": 0}],
        first.tuning_key: [{"key": [40, 96, "none", "torch.float16"], "config": 5}],
    }
    monkeypatch.setattr(triton_linear._tuned, "cache", {})
    ModelRunner.from_model(small_model(), config, DEVICE, backend="triton", tuning_file=tuning)
    assert triton_linear._tuned.cache == chosen
    monkeypatch.setattr(os, "replace", lambda *a: pytest.fail("tuning.json was written again with the same choices"))
    first.save_tuning()
