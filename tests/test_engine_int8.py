"""Weight-only INT8 (TensorRT-LLM's --use_weight_only --weight_only_precision int8): the conversion rule, the engine's
files, the PyTorch engine against a float engine over the weights the int8 values stand for, and the refusals."""

import json

import pytest
import torch
from safetensors.torch import load_file

from qwenvl_lab import bench, cli
from qwenvl_lab.checks.tensors import WEIGHT_ONLY
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine
from qwenvl_lab.engine.build import MANIFEST, load_engine_weights
from qwenvl_lab.engine.decode import backend_class
from qwenvl_lab.files import CheckpointError
from qwenvl_lab.layout import to_trtllm_names
from qwenvl_lab.toy import evaluate
from qwenvl_lab.toy.make_samples import PAIRS, SAMPLES, sample_questions
from qwenvl_lab.trtllm.build_command import trtllm_build_command
from qwenvl_lab.unified_checkpoint import (
    QUANTIZED,
    convert_to_trtllm_checkpoint,
    dequantize,
    dequantized,
    is_quantized,
    load_trtllm_checkpoint,
    quantize_per_channel,
    read_trtllm_config,
    scale_name,
    trtllm_config,
    weight_only_quantize,
)

LIMITS = dict(max_batch_size=3, max_input_len=32, max_seq_len=48, max_beam_width=2)
PROMPTS = [torch.tensor([1, 2, 3, 4, 5]), torch.arange(10, 30), torch.tensor([7, 8])]


def test_the_rule_is_tensorrt_llms_absmax_over_128_rounded_half_away_and_clipped():
    """cutlass_preprocessors.cpp's symmetric_quantize: scale = max |w| / 128, round() (half away from zero), clip to
    [-128, 127]; a channel of zeros gets scale 0 and q 0."""
    w = torch.tensor(
        [
            [0.5, -1.0, 0.25, 1.0],  # scale 1/128: 64, -128, 32, 128 → clipped to 127
            [2.5 / 128, -2.5 / 128, 1.0, 0.0],  # ±2.5 steps round away from zero (torch.round would give ±2)
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.tolist() == [1 / 128, 1 / 128, 0.0]
    assert q.tolist() == [[64, -128, 32, 127], [3, -3, 127, 0], [0, 0, 0, 0]]


def test_each_channel_has_its_own_scale_and_the_rounding_error_is_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(40, 96) * torch.logspace(-3, 1, 40)[:, None]  # channels of very different sizes
    q, scale = quantize_per_channel(w)
    torch.testing.assert_close(scale, w.abs().amax(dim=1) / 128)
    error = (w - dequantize(q, scale, torch.float32)).abs() / scale[:, None]  # in steps
    clipped = q == 127  # only a channel's positive maximum can be clipped: 128 steps → 127
    assert (error[~clipped] <= 0.5 + 1e-4).all() and (error[clipped] <= 1 + 1e-4).all()  # float32 rounding aside
    assert error.max() > 0.99  # the clipped maxima are there
    w2 = w.clone()
    w2[7] *= 10
    q2, scale2 = quantize_per_channel(w2)
    assert torch.equal(torch.cat([scale2[:7], scale2[8:]]), torch.cat([scale[:7], scale[8:]]))
    assert torch.equal(q2[7], q[7]) and scale2[7] == scale[7] * 10  # the channel's q is scale-free


def test_the_five_layer_matrices_are_quantized_and_nothing_else(tiny_model):
    """As TensorRT-LLM: qkv, dense, gate, fc and proj of every layer; lm_head, vocab_embedding, norms and bias stay."""
    weights = to_trtllm_names(tiny_model.state_dict())
    out = weight_only_quantize({k: v.half() for k, v in weights.items()}, "float16")
    quantized = {k for k in weights if is_quantized(k)}
    assert len(quantized) == len(QUANTIZED) * tiny_model.config.num_hidden_layers
    assert set(out) == set(weights) | {scale_name(k) for k in quantized}
    for name, tensor in out.items():
        if name in quantized:
            assert tensor.dtype == torch.int8 and tensor.shape == weights[name].shape
            assert out[scale_name(name)].shape == (tensor.shape[0],)
            assert out[scale_name(name)].dtype == torch.float16  # scales in the checkpoint dtype, as upstream
        elif not name.endswith("per_channel_scale"):
            assert torch.equal(tensor, weights[name].half())
    assert "lm_head.weight" not in quantized and "transformer.vocab_embedding.weight" not in quantized


def test_a_weight_only_checkpoint_says_w8a16_and_reads_back_dequantized(tiny_checkpoint, tiny_model, tmp_path):
    out = convert_to_trtllm_checkpoint(tiny_checkpoint, tmp_path / "w8", dtype="float32", weight_only="int8")
    config = read_trtllm_config(out)
    assert config["quantization"] == {"quant_algo": "W8A16", "kv_cache_quant_algo": None}
    rank = load_file(out / "rank0.safetensors")
    assert rank["transformer.layers.0.mlp.proj.weight"].dtype == torch.int8
    rebuilt = load_trtllm_checkpoint(out)
    q, scale = (
        rank["transformer.layers.1.attention.qkv.weight"],
        rank["transformer.layers.1.attention.qkv.per_channel_scale"],
    )
    assert torch.equal(rebuilt.transformer.h[1].attn.c_attn.weight, dequantize(q, scale, torch.float32))
    assert torch.equal(rebuilt.lm_head.weight, tiny_model.lm_head.weight)  # not quantized
    with pytest.raises(ValueError, match="one rank"):
        convert_to_trtllm_checkpoint(tiny_checkpoint, tmp_path / "tp2", weight_only="int8", tp_size=2)
    config["quantization"]["quant_algo"] = "W4A16"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="W4A16"):
        read_trtllm_config(out)


@pytest.mark.parametrize("bad", ["int4", "INT8", True, 8])
def test_only_int8_is_built(bad):
    with pytest.raises(ValueError, match="weight_only must be None or one of"):
        BuildConfig(weight_only=bad)
    with pytest.raises(ValueError, match="weight_only must be None or one of"):
        trtllm_config(tiny_config(), weight_only=bad)
    assert WEIGHT_ONLY == {"int8": "W8A16"}


def tiny_config():
    from qwenvl_lab.checkpoint import TINY_CONFIG  # noqa: PLC0415
    from qwenvl_lab.modeling import QWenVLConfig  # noqa: PLC0415

    return QWenVLConfig(**TINY_CONFIG)


@pytest.fixture(scope="module")
def int8_engine(tiny_checkpoint, tmp_path_factory):
    return build_engine(
        tiny_checkpoint, tmp_path_factory.mktemp("int8") / "e", BuildConfig(**LIMITS, weight_only="int8")
    )


def float_reference(engine_dir) -> ModelRunner:
    """A float32 engine over the weights the int8 engine's values stand for (each matrix times its scales)."""
    int8 = ModelRunner.from_dir(engine_dir)
    weights = dequantized(load_engine_weights(engine_dir), "float32")
    pretrained = {**int8.pretrained_config, "quantization": {"quant_algo": None, "kv_cache_quant_algo": None}}
    return ModelRunner(BuildConfig(**LIMITS), pretrained, weights)


def test_the_int8_engine_keeps_int8_in_its_files_and_manifest(int8_engine):
    assert json.loads((int8_engine / "llm" / "config.json").read_text())["quantization"]["quant_algo"] == "W8A16"
    manifest = json.loads((int8_engine / MANIFEST).read_text())
    assert manifest["build_config"]["weight_only"] == "int8" and "llm/rank0.safetensors" in manifest["files"]
    weights = load_engine_weights(int8_engine)
    assert weights["transformer.layers.0.attention.dense.weight"].dtype == torch.int8
    assert weights["transformer.layers.0.attention.dense.per_channel_scale"].dtype == torch.float32
    runner = ModelRunner.from_dir(int8_engine)
    assert runner.engine.weight_only == "int8" and "weight_only='int8'" in repr(runner)
    assert runner.engine.layers[0].qkv_t.dtype == torch.int8 and runner.engine.layers[0].gate_fc_s is not None
    float_engine = float_reference(int8_engine).engine
    matrices = sum(t.numel() for name, t in weights.items() if is_quantized(name))
    saved = matrices * 3 - sum(t.numel() * 4 for name, t in weights.items() if name.endswith("per_channel_scale"))
    assert float_engine.weight_bytes_per_token - runner.engine.weight_bytes_per_token == saved  # 1 byte, not 4


def test_the_int8_engine_decodes_like_a_float_engine_over_its_dequantized_weights(int8_engine):
    int8, reference = ModelRunner.from_dir(int8_engine), float_reference(int8_engine)
    for kwargs in ({}, {"num_beams": 2}):
        expected = reference.generate(PROMPTS, max_new_tokens=5, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(int8.generate(PROMPTS, max_new_tokens=5, end_id=-1, pad_id=0, **kwargs), expected)
    with torch.inference_mode():
        ids, pos = torch.tensor([5, 6]), torch.tensor([5, 20])
        torch.testing.assert_close(int8.decode_step(ids, pos, 21), reference.decode_step(ids, pos, 21))


def test_weights_that_disagree_with_the_build_config_are_refused(int8_engine):
    runner = ModelRunner.from_dir(int8_engine)
    weights = load_engine_weights(int8_engine)
    with pytest.raises(CheckpointError, match="must agree"):  # int8 weights, a float build config
        ModelRunner(BuildConfig(**LIMITS), runner.pretrained_config, weights)
    floats = {**weights, **dequantized(weights, "float32")}  # float matrices beside their scales
    with pytest.raises(CheckpointError, match="its weights are floating point: they must agree"):
        ModelRunner(BuildConfig(**LIMITS, weight_only="int8"), runner.pretrained_config, floats)
    with pytest.raises(CheckpointError, match="missing keys"):  # no scales at all
        ModelRunner(
            BuildConfig(**LIMITS, weight_only="int8"), runner.pretrained_config, dequantized(weights, "float32")
        )


def test_numba_refuses_int8_and_says_what_to_choose():
    pytest.importorskip("numba")
    with pytest.raises(ValueError, match='reads float32 weights, not weight-only int8: choose backend="torch"'):
        backend_class("numba", "cpu", torch.float32, weight_only="int8")


def test_from_model_quantizes_from_the_engine_dtypes_values(tiny_model):
    config = BuildConfig(**LIMITS, dtype="float16", weight_only="int8")
    runner = ModelRunner.from_model(tiny_model, config)
    q, scale = quantize_per_channel(tiny_model.transformer.h[0].mlp.c_proj.weight.half())
    assert torch.equal(runner.engine.layers[0].proj_t, q.t()) and torch.equal(
        runner.engine.layers[0].proj_s, scale.half()
    )


def test_build_command_line_writes_an_int8_engine_and_refuses_other_precisions(tiny_checkpoint, tmp_path, capsys):
    engine = tmp_path / "e"
    assert (
        cli.main(["build", "--checkpoint", str(tiny_checkpoint), "--engine", str(engine), "--weight-only", "int8"]) == 0
    )
    assert ModelRunner.from_dir(engine).build_config.weight_only == "int8"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["build", "--engine", str(tmp_path / "x"), "--weight-only", "int4"])
    assert exit_.value.code == 2 and "--weight-only" in capsys.readouterr().err


def test_the_tensorrt_llm_route_refuses_a_weight_only_build_config(tmp_path):
    with pytest.raises(ValueError, match="--use_weight_only --weight_only_precision int8"):
        trtllm_build_command(
            tmp_path, tmp_path / "e", BuildConfig(max_prompt_embedding_table_size=2048, weight_only="int8")
        )


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--weight-only", "int4"], "invalid choice"),
        (["--device", "cpu", "--backend", "numba", "--weight-only", "int8"], "--backend numba reads float32"),
        (["--weight-only", "int8", "--first-answer"], "--first-answer times the float engine alone"),
        (["--weight-only", "int8", "--drift-steps", "0"], "--drift-steps must be a whole number >= 1"),
        (["--weight-only", "int8", "--new-tokens", "8", "--drift-steps", "8"], "below --new-tokens (8)"),
    ],
)
def test_bench_refuses_what_it_cannot_measure(argv, match, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert match in capsys.readouterr().err


def test_bench_puts_both_engines_on_the_cpus_reference_back_end():
    args = bench.parse_args(["--weight-only", "int8"])
    assert (args.backend, args.weight_only) == ("torch", "int8")
    assert bench.parse_args([]).backend in ("numba", "torch")  # without int8: the CPU's fast path, as before


def test_drift_is_zero_for_the_same_trace_and_measures_a_known_difference():
    torch.manual_seed(0)
    trace = {"states": torch.randn(3, 2, 8), "logits": torch.randn(5, 2, 16), "tokens": torch.zeros(4, 2)}
    same = bench.drift(trace, trace)
    assert same["layers_rel_l2"] == [0.0, 0.0, 0.0] and same["same_top_all_steps"] == 1.0
    assert (same["requests"], same["decode_steps"]) == (2, 4)
    other = {**trace, "states": trace["states"] * 1.01, "logits": trace["logits"].clone()}
    other["logits"][-1, 0] = -other["logits"][-1, 0]  # request 0's last logits flipped: another top token
    moved = bench.drift(trace, other)
    assert moved["layers_rel_l2"] == pytest.approx([0.01] * 3, rel=1e-5)
    assert moved["last_step_logits"]["same_top"] == 0.5 and moved["prefill_logits"]["rel_l2"] == 0.0
    assert moved["last_step_logits"]["rel_l2"] == pytest.approx(1.0)  # (2 ‖l‖ / ‖l‖ + 0) / 2 requests
    assert moved["same_top_all_steps"] == pytest.approx(9 / 10)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--weight-only", "int8"], "--weight-only needs --dtype"),
        (["--engine", "nowhere"], "no such folder"),
        (["--engine", "{engine}", "--dtype", "float16"], "leave out --dtype"),
        (["--n", "0"], "--n must be a whole number from 1"),
        (["--dtype", "int8"], "invalid choice"),
        (["--json", "."], "is a folder"),
    ],
)
def test_evaluate_refuses_what_it_cannot_ask(argv, match, capsys, tmp_path):
    engine = tmp_path / "engine"  # a folder that reads as an engine's to the option type (its manifest is there)
    engine.mkdir()
    (engine / "manifest.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        evaluate.parser().parse_args([arg.format(engine=engine) for arg in argv])
    assert exit_.value.code == 2 and match in capsys.readouterr().err


def test_the_sample_questions_are_the_readmes():
    rows = sample_questions()
    assert {tuple(p) for p, _, _ in rows} == {(n,) for n in SAMPLES} | set(PAIRS)
    assert all(q and a for _, q, a in rows) and len(rows) == len({(tuple(p), q) for p, q, _ in rows})


def test_evaluate_builds_the_engine_of_each_precision():
    config = evaluate.engine_config("bfloat16", "int8")
    assert (config.dtype, config.weight_only, config.max_batch_size) == ("bfloat16", "int8", evaluate.EVAL_BATCH)
    assert config.max_prompt_embedding_table_size == 256 * 2 * evaluate.EVAL_BATCH  # two pictures a question


def test_evaluate_prints_and_saves_a_run_with_or_without_its_controls(tmp_path, monkeypatch, capsys):
    """The report of a run (report() stands in: the printing and the JSON, not the 500 questions)."""
    samples = [{"pictures": ["red_circle.png"], "question": "?", "trained": "A red circle.", "answer": "A red circle."}]
    full = {
        "accuracy": {"what/en": 1.0, "overall": 0.98},
        "accuracy_table_zeroed": {"what/en": 0.0, "overall": 0.03},
        "no_picture": {"none/en": 1.0},
        "samples": samples,
    }
    for result, shown in ((full, "table zeroed"), ({"accuracy": full["accuracy"], "samples": samples}, None)):
        monkeypatch.setattr(evaluate, "report", lambda *a, r=result: r)
        monkeypatch.setattr(evaluate, "load_toy_model", lambda *a, **k: None)
        out = tmp_path / "run.json"
        assert evaluate.main(["--n", "2", "--json", str(out), "--overwrite"]) == result  # the loop's second run too
        printed = capsys.readouterr().out
        assert json.loads(out.read_text()) == result and "overall" in printed and "1 of 1 answers" in printed
        assert (shown in printed) if shown else ("table zeroed" not in printed and "none/en" not in printed)
