"""Notebook 06 — TensorRT-LLM's run.py on any runner: `generate_for_qwenvl`, and `QWenInfer` over the package's engine.

run.py's QWenInfer holds a tokenizer, the vision part and a runner, and `qwen_infer` answers a question about pictures
(`chat.ask`, the answer path every runner shares); `generate_for_qwenvl`, its step 5, is the answer path's one
generate call (`chat.generate_for_qwenvl`).
"""

from . import chat
from .chat import generate_for_qwenvl
from .engine import ModelRunner, load_engine_vision_tower
from .engine.build import open_engine
from .tokenizing import load_tokenizer


class QWenInfer:
    """run.py's QWenInfer on this package's engine: tokenizer, vision part and ModelRunner; `qwen_infer` answers."""

    def __init__(self, runner: ModelRunner, vision=None, tokenizer=None, verify: str = "full"):
        if vision is None and runner.engine_dir is None:
            raise ValueError("give the vision tower: this runner was not loaded from an engine directory")
        self.runner = runner
        if vision is None:  # the engine's vision part, its files checked as `verify` says, of the runner's build
            vision = load_engine_vision_tower(runner.engine_dir, runner.device, verify, build=runner.build)
        self.vision = vision
        self.tokenizer = load_tokenizer(runner.engine_dir) if tokenizer is None else tokenizer

    @classmethod
    def from_dir(cls, engine_dir, device="cpu", verify: str = "full", **runner_options) -> "QWenInfer":
        """The engine directory's runner, vision part and tokenizer (its qwen.tiktoken, else the package's), every file
        checked once against the manifest (`verify` and `runner_options`, such as the decode `backend` and
        `cuda_graphs`, as in ModelRunner.from_dir)."""
        with open_engine(engine_dir) as engine:  # the language model and the vision part of one build
            runner = ModelRunner.from_dir(engine, device=device, verify=verify, **runner_options)
            vision = load_engine_vision_tower(engine, runner.device, verify="none")  # checked with the rest just now
        return cls(runner, vision)

    def qwen_infer(
        self, images, question: str, history=None, max_new_tokens: int = 64, system: str = chat.SYSTEM, **sampling
    ) -> tuple[str, list]:
        """Answer `question` about `images` (paths or images, may be empty) after `history`: (response, new history).
        The new history keeps each picture as it was read (`chat.ask`): a later turn shows it as this one did, whatever
        its file holds by then."""
        return chat.ask(
            self.runner, self.vision, self.tokenizer, images, question, history, system, max_new_tokens, **sampling
        )


__all__ = ["QWenInfer", "generate_for_qwenvl"]
