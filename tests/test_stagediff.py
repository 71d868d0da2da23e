"""`qwenvl-lab diff` on the shipped toy model: five real bugs planted one at a time, each named at its stage; the
package's eager model against its engine (every back end, float32 and float16) and the ONNX vision graph, and
transformers' Qwen2 on the mapped weights against the package's language model: no divergence."""

import copy
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from qwenvl_lab.answer_stages import record_answer, runner_probe
from qwenvl_lab.chat import EngineInputs, ModelAsRunner, make_prompt
from qwenvl_lab.cli import main
from qwenvl_lab.dump import DumpRecorder, read_dump
from qwenvl_lab.engine import BuildConfig, ModelRunner
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.layout import to_trtllm_names
from qwenvl_lab.qwen2_lm import qwen2_model
from qwenvl_lab.stage_dumps import model_probe, sampling_settings
from qwenvl_lab.stagediff import CAUSES, UNIT_ROUNDOFF, compare, layer_share, report
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, IM_END_ID, load_tokenizer
from qwenvl_lab.toy import TOY_DIR, load_course_model
from qwenvl_lab.trtllm import pipeline
from qwenvl_lab.trtllm.fp16 import to_float16_onnx
from qwenvl_lab.trtllm.onnx_export import OnnxVisualEncoder, export_visual_onnx
from qwenvl_lab.trtllm.runner import TRTLLMRunner, read_engine_config
from qwenvl_lab.unified_checkpoint import trtllm_config
from qwenvl_lab.vision import preprocess_images
from tests.test_trtllm_runner import ScriptedModelRunnerCpp, write_engine

IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"
PICTURES = [str(IMAGES / "red_circle.png"), str(IMAGES / "blue_square.png")]  # two pictures: two table blocks
QUESTION = "图片里是什么？"
TOY_DEPTHS = {"vision_layers": "3", "lm_layers": "4"}
BUILD = BuildConfig(max_batch_size=1, max_input_len=640, max_seq_len=704, max_prompt_embedding_table_size=512)


@pytest.fixture(scope="module")
def toy():
    return load_course_model(TOY_DIR).requires_grad_(False), load_tokenizer(TOY_DIR)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("dumps")


def dump_of(folder, name, runner, vision, tokenizer, probe, dtype="float32", **kwargs):
    """Record one answer through `runner` and `vision` and read the dump back."""
    recorder = DumpRecorder(name, dtype, notes=dict(TOY_DEPTHS))
    record_answer(recorder, runner, vision, tokenizer, PICTURES, QUESTION, probe, 12, **kwargs)
    return read_dump(recorder.save(folder / f"{name}.safetensors"))


@pytest.fixture(scope="module")
def eager(toy, folder):
    """The reference: the package's eager model in float32, every layer recorded."""
    model, tokenizer = toy
    return dump_of(folder, "eager", ModelAsRunner(model), model.transformer.visual, tokenizer, model_probe(model))


@pytest.fixture(scope="module")
def engine(toy):
    return ModelRunner.from_model(toy[0], BUILD)


def engine_dump(folder, name, runner, toy, vision=None, **kwargs):
    model, tokenizer = toy
    vision = model.transformer.visual if vision is None else vision
    dtype = runner.build_config.dtype
    return dump_of(folder, name, runner, vision, tokenizer, runner_probe(runner), dtype, **kwargs)


def test_the_engine_in_float32_agrees_with_the_eager_model(eager, engine, toy, folder):
    comparison = compare(eager, engine_dump(folder, "engine", engine, toy))
    assert comparison.first is None, report(comparison)
    statuses = {r.name: r.status for r in comparison.results}
    assert set(statuses.values()) <= {"same", "within"} and len(statuses) == len(eager.tensors)
    assert [statuses[f"layers.{i}"] for i in range(4)] == ["within"] * 4  # another summation order, not equal
    assert "no divergence" in report(comparison)


@pytest.mark.parametrize("backend", ["numba", pytest.param("triton", marks=pytest.mark.slow)])  # triton: interpreted
def test_every_decode_back_end_agrees_with_the_eager_model(backend, eager, toy, folder):
    pytest.importorskip(backend)
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":  # a GPU machine: the CUDA test below
        pytest.skip("Triton runs on the CPU only interpreted; on a GPU machine the CUDA test covers it")
    runner = ModelRunner.from_model(toy[0], BUILD, backend=backend)
    assert compare(eager, engine_dump(folder, backend, runner, toy)).first is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize(
    ("dtype", "backend", "cuda_graphs"),
    [("float32", "torch", False), ("float16", "triton", True)],
)
def test_the_engine_on_a_gpu_agrees_with_the_eager_model_on_the_cpu(dtype, backend, cuda_graphs, eager, toy, folder):
    """Every dtype and back end on a GPU, float32 without TF32 (PyTorch's cuDNN convolutions use it by default)."""
    model = toy[0]
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        build = BuildConfig(**{**BUILD.__dict__, "dtype": dtype})
        runner = ModelRunner.from_model(model, build, "cuda", backend=backend, cuda_graphs=cuda_graphs)
        tower = copy.deepcopy(model.transformer.visual).to("cuda", getattr(torch, dtype))
        comparison = compare(eager, engine_dump(folder, f"cuda-{dtype}-{backend}", runner, toy, vision=tower))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    assert comparison.first is None, report(comparison)


def test_the_engine_in_float16_drifts_within_float16s_tolerance(eager, toy, folder):
    model = toy[0]
    runner = ModelRunner.from_model(model, BuildConfig(**{**BUILD.__dict__, "dtype": "float16"}))
    half = engine_dump(folder, "engine16", runner, toy, vision=copy.deepcopy(model.transformer.visual).half())
    comparison = compare(eager, half)
    assert comparison.first is None, report(comparison)
    vit = next(r for r in comparison.results if r.name == "input_vit")
    assert vit.status == "within" and vit.dtype == "float16" and vit.rel > 100 * UNIT_ROUNDOFF["float32"]


def test_the_onnx_vision_graph_in_float32_agrees(eager, engine, toy, folder, tmp_path):
    graph = OnnxVisualEncoder(export_visual_onnx(toy[0], tmp_path / "visual.onnx"))
    assert compare(eager, engine_dump(folder, "onnx32", engine, toy, vision=graph)).first is None


# the five planted bugs, one at a time: each must be named at its stage


def test_swapped_gate_and_fc_are_named_at_the_first_layer(eager, toy, folder):
    model = toy[0]
    weights = to_trtllm_names(model.state_dict())
    for i in range(model.config.num_hidden_layers):  # a converter that maps w1 → fc and w2 → gate
        gate, fc = f"transformer.layers.{i}.mlp.gate.weight", f"transformer.layers.{i}.mlp.fc.weight"
        weights[gate], weights[fc] = weights[fc], weights[gate]
    runner = ModelRunner(BUILD, trtllm_config(model.config, "float32"), weights)
    comparison = compare(eager, engine_dump(folder, "swapped", runner, toy))
    assert (comparison.first.name, comparison.first.step) == ("layers.0", "layers"), report(comparison)
    assert (
        comparison.cause is CAUSES["layers"]
        and "the input embeddings agree, and layers.0 is the first" in comparison.diagnosis[-1]
    )
    assert "w2 must become fc and w1 gate" in report(comparison)


def fake_ids_from(base):
    """An edit of the engine inputs: the fake ids numbered from `base` instead of vocab_size."""

    def edit(inputs: EngineInputs) -> EngineInputs:
        ids = inputs.batch_input_ids[0].clone()
        fake = ids >= 151936
        ids[fake] += base - 151936
        return inputs._replace(batch_input_ids=[ids])

    return edit


def test_fake_ids_from_151643_are_named_at_the_fake_ids(eager, engine, toy, folder):
    model, tokenizer = toy
    with pytest.raises(ValueError, match=r"image (span with the picture's path|tags are unbalanced)"):  # refused
        engine_dump(folder, "refused", engine, toy, edit_inputs=fake_ids_from(ENDOFTEXT_ID))
    runner = ModelAsRunner(model)  # the eager model reads them: ids below vocab_size read the vocabulary
    bad = dump_of(folder, "from151643", runner, model.transformer.visual, tokenizer, model_probe(model),
                  edit_inputs=fake_ids_from(ENDOFTEXT_ID))  # fmt: skip
    comparison = compare(eager, bad)
    assert (comparison.first.name, comparison.first.step) == ("input_ids", "fake ids"), report(comparison)
    assert "holds a fake id in A but a vocabulary id in B (151936 against 151643" in comparison.first.detail
    assert "B's image spans hold ids from 151643 (vocab_size 151936): they read the vocabulary" in report(comparison)
    embeds = next(r for r in comparison.results if r.name == "input_embeds")
    assert embeds.status == "carried" or embeds.diverges  # what the lookup read changed with the ids


def swapped_table(inputs: EngineInputs) -> EngineInputs:
    """An edit of the engine inputs: the two pictures' blocks of the table in the other order."""
    table = inputs.prompt_table.clone()
    table[:256], table[256:512] = inputs.prompt_table[256:512], inputs.prompt_table[:256]
    return inputs._replace(prompt_table=table)


def test_the_pictures_table_rows_swapped_are_named_at_the_table(eager, engine, toy, folder):
    comparison = compare(eager, engine_dump(folder, "table-swapped", engine, toy, edit_inputs=swapped_table))
    assert (comparison.first.name, comparison.first.step) == ("prompt_table", "table"), report(comparison)
    assert {r.name: r.status for r in comparison.results}["input_ids"] == "same"
    assert "picture 1's span reads picture 2's features, picture 2's span reads picture 1's" in report(comparison)


def test_an_fp16_vision_graph_is_named_at_the_vision_stage(eager, engine, toy, folder, tmp_path):
    graph = export_visual_onnx(toy[0], tmp_path / "visual.onnx")
    half = OnnxVisualEncoder(to_float16_onnx(graph, tmp_path / "visual_fp16.onnx", keep_fp32=()))
    comparison = compare(eager, engine_dump(folder, "vision16", engine, toy, vision=half))
    assert (comparison.first.name, comparison.first.step) == ("input_vit", "vision"), report(comparison)
    vit = comparison.first
    assert vit.dtype == "float32" and vit.rel > 100 * vit.tolerance  # float16's drift against float32's tolerance
    assert {r.name: r.status for r in comparison.results}["pixels"] == "same"


def test_run_py_sampling_settings_are_named_at_decoding(engine, toy, folder, tmp_path):
    """run.py samples with generation_config.json's top_k 0, top_p 0.3: where the toy model's best token holds more
    than 30 % of the probability that is its greedy answer, so the bug shows on a picture it never saw (a plain green
    field), where it hesitates. Each seed's sampled answer is greedy's or is named at decoding; some seed's differs."""
    model, tokenizer = toy
    field = tmp_path / "green.png"
    Image.new("RGB", (112, 112), (71, 144, 71)).save(field)
    settings = sampling_settings(TOY_DIR, True, seed=0)
    assert (settings["top_k"], settings["top_p"]) == (0, 0.3)  # generation_config.json's, as run.py reads them

    def dump(name, **sampling):
        recorder = DumpRecorder(name, "float32", notes=dict(TOY_DEPTHS))
        probe = runner_probe(engine, layers=False)
        record_answer(recorder, engine, model.transformer.visual, tokenizer, [field], "What is in the picture?",
                      probe, 24, **sampling)  # fmt: skip
        return read_dump(recorder.save(folder / f"{name}.safetensors"))

    greedy = dump("green-greedy")
    named = []
    for seed in range(4):
        comparison = compare(greedy, dump(f"green-sampled-{seed}", **{**settings, "random_seed": seed}))
        if comparison.first is not None:
            assert (comparison.first.name, comparison.first.step) == ("output_ids", "decoding"), report(comparison)
            statuses = {r.name: r.status for r in comparison.results}
            assert statuses["logits"] == "same" and "sampling" in comparison.header_differences
            assert comparison.cause is CAUSES["decoding"] and "top_p 0.3" in report(comparison)
            named.append(seed)
    assert named, "run.py's settings drew greedy's answer with every seed"


# a model this project did not write: transformers' Qwen2 on the mapped weights


def qwen2_dump(model, tokenizer, folder):
    """A dump of transformers' Qwen2ForCausalLM, recorded the way docs/diff.md shows for a user's own script: hooks
    on the decoder layers, the embeddings merged Qwen-VL's way (the span's rows overwritten by input_vit)."""
    qwen2 = qwen2_model(model)
    recorder = DumpRecorder(
        "transformers Qwen2ForCausalLM on mapped weights",
        "float32",
        vocab_size=qwen2.config.vocab_size,
        sampling={"greedy": True},
        notes=dict(TOY_DEPTHS),
    )
    recorder.hook_input(qwen2.model.layers[0], "input_embeds")
    recorder.hook_layers(qwen2.model.layers)
    _, ids = make_prompt(tokenizer, QUESTION, PICTURES)
    recorder.record("prompt_ids", ids)
    pixels = preprocess_images(PICTURES, model.config.visual["image_size"])
    recorder.record("pixels", pixels)
    with torch.inference_mode():
        input_vit = model.transformer.visual(pixels)  # Qwen2 has no vision tower: the course's
        recorder.record("input_vit", input_vit)
        embeds = qwen2.model.embed_tokens(torch.tensor([ids]))  # [1, L, H]
        for k, (_, a, b) in enumerate(locate_img_pos(torch.tensor([ids])).tolist()):
            embeds[0, a + 1 : b] = input_vit[k]
        out = qwen2.generate(
            inputs_embeds=embeds,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=12,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=IM_END_ID,
            pad_token_id=IM_END_ID,
        )
    recorder.record("logits", out.logits[0])  # the first step's raw logits [1, V]
    recorder.record("output_ids", out.sequences[0])  # with inputs_embeds alone: the new tokens only
    recorder.remove_hooks()
    return read_dump(recorder.save(folder / "qwen2.safetensors"))


def test_transformers_qwen2_on_mapped_weights_agrees_with_the_packages_language_model(eager, toy, folder):
    comparison = compare(eager, qwen2_dump(*toy, folder))
    assert comparison.first is None, report(comparison)
    statuses = {r.name: r.status for r in comparison.results}
    compared = {"pixels", "input_vit", "prompt_ids", "input_embeds", "logits", "output_ids"} | {
        f"layers.{i}" for i in range(4)
    }
    assert {n for n, s in statuses.items() if s in ("same", "within")} == compared
    assert {n for n, s in statuses.items() if s == "only in A"} == {
        "img_pos",
        "input_ids",
        "prompt_table",
        "tasks",
        "task_vocab_size",
    }
    assert statuses["input_embeds"] == "same"  # the same rows, looked up or overwritten


def test_the_command_line_dumps_and_compares(toy, eager, folder, capsys):
    a, b = folder / "cli-a.safetensors", folder / "cli-b.safetensors"
    common = ["--image", PICTURES[0], "--max-new-tokens", "4"]
    assert main(["dump", *common, "--output", str(a)]) == 0
    assert main(["dump", *common, "--output", str(b), "--layers"]) == 0
    assert "dump written to" in capsys.readouterr().out
    header = read_dump(b).header  # the sizes the tolerances count, the run, the decoding
    assert (header["vision_layers"], header["lm_layers"], header["hidden_size"]) == ("3", "4", "128")
    assert header["implementation"].startswith("qwenvl-lab eager model") and '"greedy": true' in header["sampling"]
    assert main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no divergence" in out and "only in B" in out  # the layers B recorded
    assert main(["diff", str(a), str(eager.path)]) == 1  # one picture against two
    out = capsys.readouterr().out
    assert "first diverging stage: pixels (preprocessing)" in out and "given different pictures" in out
    assert main(["diff", "--json", str(eager.path), str(a)]) == 1
    assert '"first_diverging_stage": "pixels"' in capsys.readouterr().out


def test_tolerances_follow_the_coarser_dtype(folder):
    """A perturbation of half a layer's share passes and one of twice it diverges, with float32's and float16's u."""
    torch.manual_seed(0)
    x = torch.randn(64, 32)  # the last layer's output: H = 32, equal in both runs
    for dtype in ("float32", "float16"):
        limit = layer_share(dtype, 32)  # the logits come one layer after it
        for factor, expected in ((0.5, None), (2.0, "logits")):
            direction = torch.randn(32).double()
            a, b = DumpRecorder("a", "float32", notes={"lm_layers": "1"}), DumpRecorder("b", dtype)
            a.record("layers.0", x)
            b.record("layers.0", x)
            logits = torch.randn(32).double()
            a.record("logits", logits.float())
            step = direction / direction.norm() * logits.norm() * limit * factor
            b.record("logits", (logits + step).float() if dtype == "float32" else (logits + step).half())
            da = read_dump(a.save(folder / f"tol-a-{dtype}-{factor}.safetensors"))
            db = read_dump(b.save(folder / f"tol-b-{dtype}-{factor}.safetensors"))
            first = compare(da, db).first
            assert (None if first is None else first.name) == expected, (dtype, factor)


# the comparison's rules on small made-up dumps

V = 151936


def made_up(folder, name, **stages):
    """A dump of the given stages (vocab_size V, float32) read back."""
    recorder = DumpRecorder(name, stages.pop("dtype", "float32"), vocab_size=V, notes=dict(TOY_DEPTHS))
    for stage_name, value in stages.items():
        recorder.record(stage_name.replace("_", ".") if stage_name.startswith("layers_") else stage_name, value)
    return read_dump(recorder.save(folder / f"{name}.safetensors", overwrite=True))


def test_fake_ids_numbered_either_way_read_the_same_rows(folder):
    """run.py numbers fake ids on across a batch (one table, task 0), the executor restarts them per request (its
    own block, task = its place): for the second request of a batch both read the same rows, and agree."""
    torch.manual_seed(0)
    features = torch.randn(256, 8)
    text = torch.tensor([872, 198])
    ids_run_py = torch.cat([text, torch.arange(V + 256, V + 512)])  # the batch's second picture
    ids_executor = torch.cat([text, torch.arange(V, V + 256)])  # its own block 1
    a = made_up(folder, "runpy", input_ids=ids_run_py, prompt_table=torch.cat([torch.zeros(256, 8), features]),
                tasks=torch.tensor([0]), task_vocab_size=torch.tensor([512]))  # fmt: skip
    b = made_up(folder, "executor", input_ids=ids_executor, prompt_table=torch.cat([torch.ones(256, 8), features]),
                tasks=torch.tensor([1]), task_vocab_size=torch.tensor([256]))  # fmt: skip
    comparison = compare(a, b)
    statuses = {r.name: r.status for r in comparison.results}
    assert comparison.first is None, report(comparison)
    assert statuses == {
        "input_ids": "within",  # numbered differently, fake at the same positions
        "prompt_table": "same",  # the rows read are the same
        "tasks": "not compared",
        "task_vocab_size": "not compared",
    }


def test_a_wrong_task_vocab_size_reads_another_block_or_past_the_table(folder):
    torch.manual_seed(0)
    table = torch.randn(512, 8)
    ids = torch.cat([torch.tensor([872]), torch.arange(V, V + 256)])
    right = made_up(folder, "right", input_ids=ids, prompt_table=table, tasks=torch.tensor([1]),
                    task_vocab_size=torch.tensor([256]))  # fmt: skip
    other_block = made_up(folder, "other", input_ids=ids, prompt_table=table, tasks=torch.tensor([1]),
                          task_vocab_size=torch.tensor([128]))  # fmt: skip
    past_end = made_up(folder, "past", input_ids=ids, prompt_table=table, tasks=torch.tensor([1]),
                       task_vocab_size=torch.tensor([512]))  # fmt: skip
    assert compare(right, other_block).first.name == "prompt_table"
    first = compare(right, past_end).first
    assert first.name == "prompt_table" and "reads row 512 of a 512-row table: past its end" in first.detail


def test_shapes_that_differ_and_values_that_are_not_finite_diverge(folder):
    x = torch.randn(4, 8)
    a = made_up(folder, "finite", input_embeds=x, layers_0=x)
    nan = x.clone()
    nan[1, 2] = float("nan")
    b = made_up(folder, "nan", input_embeds=x, layers_0=nan)
    first = compare(a, b).first
    assert first.name == "layers.0" and first.detail == "B holds NaN or infinite values"
    c = made_up(folder, "short", input_embeds=x[:3], layers_0=x[:3])
    first = compare(a, c).first
    assert first.name == "input_embeds" and first.detail == "shapes differ: [4, 8] against [3, 8]"


def test_a_stage_one_dump_lacks_is_listed_not_compared(folder):
    x = torch.randn(4, 8)
    a = made_up(folder, "full", input_embeds=x, layers_0=x, logits=torch.randn(16))
    b = made_up(folder, "part", layers_0=x)
    statuses = {r.name: r.status for r in compare(a, b).results}
    assert statuses == {"input_embeds": "only in A", "layers.0": "same", "logits": "only in A"}
    assert compare(b, a).results[0].status == "only in B"


def test_after_the_first_divergence_what_differs_is_carried(folder):
    """After the first stage that diverges, a later stage that is not the same is 'carried' (a second cause behind
    the first cannot be told apart until the first is fixed); one that is the same stays the same."""
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    a = made_up(folder, "clean", input_embeds=x, layers_0=x, layers_1=x)
    b = made_up(folder, "carried", input_embeds=x * 1.1, layers_0=x * 1.1, layers_1=x)
    statuses = [r.status for r in compare(a, b).results]
    assert statuses == ["diverges", "carried", "same"]


def test_the_comparison_as_json_names_the_stage_cause_and_evidence(folder):
    x = torch.randn(4, 8)
    comparison = compare(made_up(folder, "j1", layers_0=x), made_up(folder, "j2", layers_0=-x))
    data = comparison.to_json()
    assert data["first_diverging_stage"] == "layers.0" and data["step"] == "layers"
    assert data["evidence"][0]["where"].startswith("NVIDIA/TensorRT-LLM@")
    assert data["stages"][0]["rel"] == pytest.approx(2.0) and data["stages"][0]["cosine"] == pytest.approx(-1.0)


def test_every_cause_has_evidence_quoted_with_where_it_is():
    assert set(CAUSES) == {s.step for s in __import__("qwenvl_lab.dump").dump.STAGES}
    for cause in CAUSES.values():
        assert cause.evidence and cause.usually
        for evidence in cause.evidence:
            repo_thread = "#" in evidence.where and evidence.where.split("#")[1].isdigit()
            source = "@" in evidence.where and len(evidence.where.split("@")[1].split()[0]) == 40
            assert repo_thread or source, evidence.where


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dump", "--output", ""], "--output"),
        (["dump", "--output", "{tmp}"], "--output"),
        (["dump", "--output", "{tmp}/x.safetensors", "--image", "{tmp}/none.png"], "no such file; give a picture"),
        (["dump", "--output", "{tmp}/x.safetensors", "--image", "{tmp}"], "--image"),
        (["dump", "--output", "{tmp}/x.safetensors", "--engine", "{tmp}/none"], "--engine"),
        (["dump", "--output", "{tmp}/x.safetensors", "--engine", "{file}"], "--engine"),
        (["dump", "--output", "{tmp}/x.safetensors", "--checkpoint", "{file}"], "--checkpoint"),
        (["dump", "--output", "{tmp}/x.safetensors", "--vision-onnx", "{tmp}"], "--vision-onnx"),
        (["dump", "--output", "{tmp}/x.safetensors", "--backend", "numba"], "--backend"),
        (["dump", "--output", "{tmp}/x.safetensors", "--engine", "{tmp}", "--dtype", "float16"], "--dtype"),
        (["dump", "--output", "{tmp}/x.safetensors", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["dump", "--output", "{tmp}/x.safetensors", "--seed", "-1"], "--seed"),
        (["dump", "--output", "{tmp}/x.safetensors", "--seed", "1.5"], "--seed"),
        (["dump", "--output", "{tmp}/x.safetensors", "--seed", str(2**64)], "--seed"),
        (["dump", "--output", "{file}"], "--output"),  # a file that is not a dump
        (["dump", "--output", "{tmp}/x.safetensors", "--engine", "{tmp}"], "--engine"),  # a folder, not an engine
        (["dump", "--output", "{tmp}/x.safetensors", "--checkpoint", "{tmp}"], "--checkpoint"),
        (["dump", "--output", "{tmp}/x.safetensors", "--vision-onnx", "{file}"], "--vision-onnx"),  # not ONNX
        (["diff", "{tmp}/none.safetensors", "{file}"], "A"),
        (["diff", "{file}", "{file}"], "A:"),
        (["diff", "{tmp}", "{file}"], "A"),
    ],
)
def test_bad_command_lines_get_one_line_naming_the_option(argv, message, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("not a dump")
    argv = [a.format(tmp=tmp_path, file=tmp_path / "file.txt") for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("qwenvl-lab")]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


@pytest.mark.standin
def test_the_tensorrt_llm_gpu_stage_records_what_it_can(tmp_path, monkeypatch, toy):
    """The pipeline's --dump path against a stand-in ModelRunnerCpp and a stand-in vision plan (tests only): the
    pixels, the plan's features, the prompt, the fake ids, the table and the generated ids; no embeddings, layers or
    logits, which ModelRunnerCpp does not return."""
    model, tokenizer = toy

    class Plan:  # a vision plan: the toy's tower in float16, as an fp16 plan would run it
        def __init__(self, path):
            self.tower = copy.deepcopy(model.transformer.visual).half()
            self.image_size = self.tower.image_size

        def __call__(self, pixels):
            return self.tower(pixels)

    monkeypatch.setattr(pipeline, "TRTVisualEncoder", Plan)
    _, ids = make_prompt(tokenizer, QUESTION, PICTURES[:1])
    answer = [*tokenizer.encode("A red circle."), IM_END_ID]
    engine = write_engine(tmp_path / "engine", dtype="float16", max_input_len=512, max_seq_len=600)
    runner = TRTLLMRunner(read_engine_config(engine), ScriptedModelRunnerCpp({ids[-1]: answer}, max_seq_len=600))
    dump_path = tmp_path / "trtllm.safetensors"
    text = pipeline.dumped_answer(
        runner, "plan/visual_encoder_fp16.plan", tokenizer, PICTURES[0], QUESTION, 8, dump_path
    )
    assert text == "A red circle."
    dump = read_dump(dump_path)
    assert list(dump.tensors) == [
        "pixels",
        "input_vit",
        "prompt_ids",
        "img_pos",
        "input_ids",
        "prompt_table",
        "tasks",
        "task_vocab_size",
        "output_ids",
    ]
    assert dump.tensors["output_ids"].tolist() == answer and dump.dtype == "float16" and dump.device == "cuda"
    assert "ModelRunnerCpp, vision plan visual_encoder_fp16.plan" in dump.implementation
    sent = runner.session.calls[-1]["prompt_table"]  # what went to TensorRT-LLM is what the dump holds
    assert torch.equal(sent[0], dump.tensors["prompt_table"].to(sent.dtype))
