"""Per-stage dumps of the package's own implementations (`qwenvl-lab dump`): the eager model, the engine with any
decode back end, and the vision tower as an ONNX graph in ONNX Runtime — pictures and a question through each, every
stage recorded (`answer_stages.record_answer`)."""

from pathlib import Path

import torch

from .answer_stages import record_answer, runner_probe
from .chat import GenerationSettings, ModelAsRunner
from .dump import DumpRecorder
from .engine import ModelRunner, load_engine_vision_tower
from .tokenizing import load_tokenizer
from .toy import default_checkpoint_dir, load_course_model
from .trtllm.onnx_export import OnnxVisualEncoder
from .trtllm.visual_plan import graph_float_types


def model_probe(model, layers: bool = True):
    """A probe (see `answer_stages.record_answer`) for a QWenLMHeadModel, through the recorder's hooks as a user's
    script records one: the first decoder block's input ("input_embeds"), every block's output ("layers.i", with
    `layers`) and the last position's logits of one forward pass."""

    def probe(recorder: DumpRecorder, inputs) -> None:
        batch, table, tasks, task_vocab_size = inputs
        blocks = model.transformer.h
        handles = [recorder.hook_input(blocks[0], "input_embeds")] + (recorder.hook_layers(blocks) if layers else [])
        device = model.device
        knobs = {}
        if table is not None:
            knobs = dict(prompt_table=table.to(device), tasks=tasks.to(device), task_vocab_size=int(task_vocab_size))
        try:
            with torch.inference_mode():
                logits = model(input_ids=batch[0][None].to(device), **knobs).logits  # [1, L, V]
        finally:
            for handle in handles:
                handle.remove()
                recorder.hooks.remove(handle)
        recorder.record("logits", logits[0, -1])

    return probe


def sampling_settings(directory, sample: bool, seed: int) -> dict:
    """The runner's knobs: greedy, or (sample) the directory's generation_config.json's, as run.py reads them, with a
    seed."""
    if not sample:
        return dict(top_k=1)
    return {**GenerationSettings.from_dir(directory, do_sample=True).sampling(), "random_seed": seed}


def implementation_dump(  # noqa: PLR0913 — the command line's options, one argument each
    pictures,
    question: str,
    checkpoint=None,
    engine=None,
    backend: str = "torch",
    dtype: str = "float32",
    device="cpu",
    vision_onnx=None,
    layers: bool = False,
    max_new_tokens: int = 16,
    sample: bool = False,
    seed: int = 0,
) -> DumpRecorder:
    """A recorder holding every stage of one answer from the package: the engine in directory `engine` (its decode
    `backend`), else the eager model of `checkpoint` (default: the course's) in `dtype`; the vision part the engine's
    or the model's own tower, or the ONNX graph `vision_onnx` in ONNX Runtime. Greedy, unless `sample`: the
    generation_config.json's sampling (run.py's settings) with `seed`."""
    notes = {"question": question, "pictures": ", ".join(Path(p).name for p in pictures)}
    if engine is not None:
        runner = ModelRunner.from_dir(engine, device=device, backend=backend)
        vision, tokenizer, directory = (
            load_engine_vision_tower(engine, device, verify="none"),
            load_tokenizer(engine),
            engine,
        )
        implementation, dtype = f"qwenvl-lab engine, {backend} back end", runner.build_config.dtype
        probe = runner_probe(runner, layers)
        notes["engine"] = str(engine)
    else:
        directory = default_checkpoint_dir() if checkpoint is None else Path(checkpoint)
        model = load_course_model(directory, dtype=getattr(torch, dtype), device=device)
        runner, vision, tokenizer = ModelAsRunner(model), model.transformer.visual, load_tokenizer(directory)
        implementation, probe = "qwenvl-lab eager model (transformers generate)", model_probe(model, layers)
        notes["checkpoint"] = str(directory)
    notes.update(  # the layer counts and width the comparison's tolerances count (stagediff.sizes_of)
        vision_layers=str(len(vision.transformer.resblocks)),
        lm_layers=str(len(runner.engine.layers) if engine is not None else runner.model.config.num_hidden_layers),
        hidden_size=str(runner.hidden_size),
    )
    if vision_onnx is not None:
        vision = OnnxVisualEncoder(vision_onnx)
        types = ", ".join(sorted(graph_float_types(vision_onnx)))
        notes["vision"] = f"ONNX Runtime, {Path(vision_onnx).name} ({types} weights)"
        implementation += ", vision in ONNX Runtime"
    recorder = DumpRecorder(implementation, dtype, device, runner.vocab_size, notes=notes)
    record_answer(
        recorder,
        runner,
        vision,
        tokenizer,
        pictures,
        question,
        probe,
        max_new_tokens,
        **sampling_settings(directory, sample, seed),
    )
    return recorder
