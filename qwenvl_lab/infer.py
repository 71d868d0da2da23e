"""Notebook 06 — TensorRT-LLM's run.py on any runner: `generate_for_qwenvl`, and `QWenInfer` over the package's engine.

run.py's QWenInfer holds a tokenizer, the vision part and a runner, and `qwen_infer` answers a question about pictures
(`chat.ask`, the answer path every runner shares); `generate_for_qwenvl` is its step 5.
"""

import warnings

import torch

from . import chat
from .checks.tensors import as_id_list
from .checks.values import check_int
from .engine import ModelRunner, load_engine_vision_tower
from .tokenizing import IM_END_ID, load_tokenizer


def generate_for_qwenvl(
    runner,
    input_ids,
    max_new_tokens: int,
    prompt_table=None,
    tasks=None,
    task_vocab_size=None,
    num_beams: int = 1,
    **sampling,
) -> torch.Tensor:
    """run.py's step 5: clamp max_new_tokens to what max_seq_len leaves (with a warning), then decode: output_ids."""
    batch = as_id_list(input_ids)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    longest = max(len(ids) for ids in batch)
    room = runner.max_seq_len - longest
    if room < 1:
        raise ValueError(
            f"a prompt of {longest} ids fills the engine's max_seq_len {runner.max_seq_len}: no room for an "
            "answer; shorten it (fewer pictures or history turns) or rebuild with larger limits"
        )
    if max_new_tokens > room:
        warnings.warn(
            f"max_new_tokens {max_new_tokens} clamped to {room}: max_seq_len {runner.max_seq_len} minus the "
            "longest prompt (run.py's min(max_new_tokens, limit - input_len))",
            stacklevel=2,
        )
        max_new_tokens = room
    sampling.setdefault("end_id", IM_END_ID)
    sampling.setdefault("pad_id", IM_END_ID)
    return runner.generate(
        batch,
        prompt_table=prompt_table,
        prompt_tasks=tasks,
        task_vocab_size=task_vocab_size,
        max_new_tokens=max_new_tokens,
        num_beams=num_beams,
        **sampling,
    )


class QWenInfer:
    """run.py's QWenInfer on this package's engine: tokenizer, vision part and ModelRunner; `qwen_infer` answers."""

    def __init__(self, runner: ModelRunner, vision=None, tokenizer=None, verify: str = "full"):
        if vision is None and runner.engine_dir is None:
            raise ValueError("give the vision tower: this runner was not loaded from an engine directory")
        self.runner = runner
        if vision is None:  # the engine's vision part, its files checked as `verify` says
            vision = load_engine_vision_tower(runner.engine_dir, runner.device, verify)
        self.vision = vision
        self.tokenizer = load_tokenizer(runner.engine_dir) if tokenizer is None else tokenizer

    @classmethod
    def from_dir(cls, engine_dir, device="cpu", verify: str = "full", **runner_options) -> "QWenInfer":
        """The engine directory's runner, vision part and tokenizer (its qwen.tiktoken, else the package's), every file
        checked once against the manifest (`verify` and `runner_options`, such as the decode `backend` and
        `cuda_graphs`, as in ModelRunner.from_dir)."""
        runner = ModelRunner.from_dir(engine_dir, device=device, verify=verify, **runner_options)
        return cls(runner, verify="none")  # its vision files were just checked with the rest

    def qwen_infer(
        self, images, question: str, history=None, max_new_tokens: int = 64, system: str = chat.SYSTEM, **sampling
    ) -> tuple[str, list]:
        """Answer `question` about `images` (paths or images, may be empty) after `history`: (response, new history).
        The new history keeps each picture as it was read (`chat.ask`): a later turn shows it as this one did, whatever
        its file holds by then."""
        return chat.ask(
            self.runner, self.vision, self.tokenizer, images, question, history, system, max_new_tokens, **sampling
        )
