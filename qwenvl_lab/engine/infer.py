"""Engine, inference — run.py's `generate_for_qwenvl` and `QWenInfer.qwen_infer`: pictures + question in, answer out."""

import warnings

import torch

from ..fake_ids import make_fake_prompt_ids, replace_image_spans
from ..img_pos import as_batch, locate_img_pos
from ..prompt_table import ptuning_setup
from ..tokenizing import IM_END_ID, decode_image_path, load_tokenizer, make_context
from ..trtllm.runner import as_id_list
from .build import load_vision_tower
from .runner import ModelRunner

SYSTEM = "You are a helpful assistant."


def generate_for_qwenvl(runner: ModelRunner, input_ids, max_new_tokens: int, prompt_table=None, tasks=None,
                        task_vocab_size=None, num_beams: int = 1, **sampling) -> torch.Tensor:
    """run.py's step 5: clamp max_new_tokens to what max_seq_len leaves (with a warning), then decode: output_ids."""
    batch = as_id_list(input_ids)
    longest = max(len(ids) for ids in batch)
    room = runner.max_seq_len - longest
    if room < 1:
        raise ValueError(f"a prompt of {longest} ids fills the engine's max_seq_len {runner.max_seq_len}: no room for an "
                         "answer; shorten it (fewer pictures or history turns) or rebuild with larger limits")
    if max_new_tokens > room:
        warnings.warn(f"max_new_tokens {max_new_tokens} clamped to {room}: max_seq_len {runner.max_seq_len} minus the "
                      "longest prompt (run.py's min(max_new_tokens, limit - input_len))", stacklevel=2)
        max_new_tokens = room
    sampling.setdefault("end_id", IM_END_ID)
    sampling.setdefault("pad_id", IM_END_ID)
    return runner.generate(batch, prompt_table=prompt_table, prompt_tasks=tasks, task_vocab_size=task_vocab_size,
                           max_new_tokens=max_new_tokens, num_beams=num_beams, **sampling)


class QWenInfer:
    """run.py's QWenInfer on this engine: tokenizer, vision part and ModelRunner; `qwen_infer` answers a question."""

    def __init__(self, runner: ModelRunner, vision=None, tokenizer=None):
        if vision is None and runner.engine_dir is None:
            raise ValueError("give the vision tower: this runner was not loaded from an engine directory")
        self.runner = runner
        self.vision = load_vision_tower(runner.engine_dir, runner.device) if vision is None else vision
        self.tokenizer = load_tokenizer(runner.engine_dir) if tokenizer is None else tokenizer

    @classmethod
    def from_dir(cls, engine_dir, device="cpu", **runner_kwargs) -> "QWenInfer":
        """The engine directory's runner, vision part and tokenizer (its qwen.tiktoken, else dashscope's)."""
        return cls(ModelRunner.from_dir(engine_dir, device=device, **runner_kwargs))

    @torch.inference_mode()
    def qwen_infer(self, images, question: str, history=None, max_new_tokens: int = 64, num_beams: int = 1,
                   system: str = SYSTEM, **sampling) -> tuple[str, list]:
        """Answer `question` about `images` (paths, may be empty) after `history`: (response, new history)."""
        images = [] if images is None else list(images) if isinstance(images, (list, tuple)) else [images]
        history = [] if history is None else list(history)
        query = self.tokenizer.from_list_format([*({"image": image} for image in images), {"text": question}])
        _, context_tokens = make_context(self.tokenizer, query, history=history, system=system)
        input_ids = as_batch(context_tokens)  # [1, L]
        img_pos = locate_img_pos(input_ids)  # [N, 3]: this turn's pictures and the history's
        prompt_table = tasks = task_vocab_size = None
        if len(img_pos):
            paths = [decode_image_path(input_ids[i, a + 1 : b].tolist()) for i, a, b in img_pos.tolist()]
            input_vit = self.vision.encode(paths)  # [N, 256, H]
            fake_prompt_id = make_fake_prompt_ids(self.runner.vocab_size, len(img_pos), input_vit.shape[1])  # [N, 256]
            input_ids = replace_image_spans(input_ids, img_pos, fake_prompt_id)
            prompt_table, tasks, task_vocab_size = ptuning_setup(input_vit, self.runner.dtype, self.runner.hidden_size,
                                                                 input_ids=input_ids)
        output = generate_for_qwenvl(self.runner, input_ids, max_new_tokens, prompt_table, tasks, task_vocab_size,
                                     num_beams, return_dict=True, **sampling)
        input_len, end = input_ids.shape[1], int(output["sequence_lengths"][0, 0])
        response = self.tokenizer.decode(output["output_ids"][0, 0, input_len:end].tolist(), skip_special_tokens=True)
        return response, history + [(query, response)]
