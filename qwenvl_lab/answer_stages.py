"""One answer recorded stage by stage, for any runner and vision encoder: a per-stage dump of the answer path.

`record_answer` walks the steps `chat.ask` takes — the prompt (`chat.make_prompt`), `img_pos`, the pictures'
pixels and features (the vision encoder), the fake ids and the prompt table (`chat.prompt_inputs`), what a probe sees
inside the language model (its embeddings, layers and first logits), and the generated ids
(`chat.generate_for_qwenvl`) — and records each in a `dump.DumpRecorder`. It imports no model: the TensorRT-LLM
pipeline's GPU stage records through it too. A vision encoder is anything with `image_size` and `__call__(pixels)`:
the model's `VisionTransformer`, `OnnxVisualEncoder`, `TRTVisualEncoder`.
"""

from dataclasses import fields

import torch

from . import chat
from .dump import DumpRecorder
from .img_pos import locate_img_pos
from .requests import SamplingConfig, new_tokens
from .vision import preprocess_images

SAMPLING_KNOBS = ("top_k", "top_p", "temperature", "random_seed", "num_beams", "repetition_penalty")


def decoding(sampling: dict) -> dict:
    """What a dump's header says of its decoding: {"greedy": …} and the knobs (SamplingConfig's, defaults filled in)."""
    names = {f.name for f in fields(SamplingConfig)}
    config = SamplingConfig(**{k: v for k, v in sampling.items() if k in names})
    return {"greedy": config.greedy, **{k: getattr(config, k) for k in SAMPLING_KNOBS}}


def encoder_device(vision) -> torch.device:
    """Where a vision encoder takes its pixels: a torch module's parameters' device, else the CPU (ONNX Runtime and
    TensorRT encoders move the pixels themselves)."""
    parameters = getattr(vision, "parameters", None)
    return next(parameters()).device if callable(parameters) else torch.device("cpu")


def record_vision(recorder: DumpRecorder, vision, pictures, preprocess=preprocess_images) -> torch.Tensor:
    """The pictures' "pixels" [N, 3, S, S] (`preprocess(pictures, image_size)`) and "input_vit" [N, 256, H],
    recorded: input_vit."""
    pixels = preprocess(pictures, vision.image_size)  # [N, 3, S, S] float32
    recorder.record("pixels", pixels)
    with torch.inference_mode():
        input_vit = vision(pixels.to(encoder_device(vision)))  # [N, 256, H]
    recorder.record("input_vit", input_vit)
    return input_vit


def record_inputs(recorder: DumpRecorder, inputs: chat.EngineInputs) -> None:
    """The engine inputs of one request, recorded: "input_ids" (fake ids in its spans) and the table's three."""
    recorder.record("input_ids", inputs.batch_input_ids[0])
    if inputs.prompt_table is not None:
        recorder.record("prompt_table", inputs.prompt_table)
        recorder.record("tasks", inputs.prompt_tasks)
        recorder.record("task_vocab_size", inputs.task_vocab_size)


def record_answer(  # noqa: PLR0913 — the answer path's pieces, then what to record and how to decode
    recorder: DumpRecorder,
    runner,
    vision,
    tokenizer,
    pictures,
    question: str,
    probe=None,
    max_new_tokens: int = 16,
    edit_inputs=None,
    preprocess=preprocess_images,
    **sampling,
) -> list[int]:
    """Answer `question` about `pictures` through `runner` and `vision` (greedy unless `sampling` says otherwise),
    recording every stage on the way: the answer's new ids.

    `probe(recorder, inputs)`, when given, records what the language model computes from the engine inputs (the
    embeddings, layers and first logits: `ModelRunner.prefill_stages`, or hooks on a model). `edit_inputs(inputs) ->
    inputs` changes the engine inputs before the model reads them (and before they are recorded): the course plants
    its table and fake-id bugs with it.
    """
    pictures = [] if pictures is None else list(pictures)
    recorder.sampling = decoding(sampling) if recorder.sampling is None else recorder.sampling
    if recorder.vocab_size is None:
        recorder.vocab_size = runner.vocab_size
    _, ids = chat.make_prompt(tokenizer, question, pictures)
    recorder.record("prompt_ids", ids)
    recorder.record("img_pos", locate_img_pos(torch.tensor([ids])))  # [N, 3]
    input_vit = record_vision(recorder, vision, pictures, preprocess) if pictures else None
    inputs = chat.prompt_inputs(runner, [ids], input_vit)
    if edit_inputs is not None:
        inputs = edit_inputs(inputs)
    record_inputs(recorder, inputs)
    if probe is not None:
        probe(recorder, inputs)
    batch, table, tasks, task_vocab_size = inputs
    out = chat.generate_for_qwenvl(
        runner, batch, max_new_tokens, table, tasks, task_vocab_size, return_dict=True, **sampling
    )
    new = new_tokens(out, 0, len(ids))
    recorder.record("output_ids", new)
    return new


def runner_probe(runner, layers: bool = True):
    """A probe (see `record_answer`) for a runner with `prefill_stages` (the engine's ModelRunner): its embeddings,
    first logits and (with `layers`) every layer's output, computed by the engine's own prefill."""

    def probe(recorder: DumpRecorder, inputs: chat.EngineInputs) -> None:
        batch, table, tasks, task_vocab_size = inputs
        for name, tensor in runner.prefill_stages(batch, table, tasks, task_vocab_size).items():
            if layers or not name.startswith("layers."):
                recorder.record(name, tensor)

    return probe
