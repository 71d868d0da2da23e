"""Chat — pictures and a question (after earlier turns) in, an answer out, for any runner.

The course's pipeline in one place: `make_context` → `img_pos` → fake prompt ids → the prompt table (one per
request, TensorRT-LLM's in-flight convention) → `generate` → the answer, cut at the first stop id and decoded.

A runner is anything with TensorRT-LLM's `generate(batch_input_ids, prompt_table=, prompt_tasks=, max_new_tokens=,
end_id=, pad_id=, return_dict=True, …)` and `vocab_size` / `dtype` attributes: the engine's ModelRunner,
TRTLLMRunner, or `ModelAsRunner` around a QWenLMHeadModel. A vision encoder is anything with
`encode(pictures) -> input_vit [N, 256, H]`: the model's tower, OnnxVisualEncoder, TRTVisualEncoder.
"""

import os

import torch

from .img_pos import locate_img_pos
from .prompt_table import per_request_tables, to_torch_dtype
from .requests import as_id_list, check_sampling, parse_tasks
from .tokenizing import ENDOFTEXT_ID, IM_END_ID, IM_START_ID, QWenTokenizer, decode_image_path, make_context

SYSTEM = "You are a helpful assistant."
STOP_IDS = (IM_END_ID, IM_START_ID)  # Qwen-VL-Chat's stop words: the end of its turn, or the start of another
SPAN_NAME = "picture{k}.png"  # the path written into the span of a picture given as an image object


def picture_name(picture, k: int) -> str:
    """What the image span of the k-th picture (from 1) holds: its path, or a placeholder for an image object."""
    return os.fspath(picture) if isinstance(picture, (str, os.PathLike)) else SPAN_NAME.format(k=k)


def make_prompt(tokenizer: QWenTokenizer, question: str, pictures=(), history=None, system: str = SYSTEM):
    """(query, context ids) of one chat turn: the pictures, then the question, after the history's turns."""
    query = tokenizer.from_list_format([*({"image": picture_name(p, k + 1)} for k, p in enumerate(pictures)),
                                        {"text": question}])
    return query, make_context(tokenizer, query, history=history, system=system)[1]


def answer_text(tokenizer: QWenTokenizer, new_ids) -> str:
    """The text of generated ids up to the first stop id (special tokens such as <ref> and <box> kept, as Qwen-VL's
    chat decodes)."""
    new_ids = [int(i) for i in new_ids]
    end = next((k for k, i in enumerate(new_ids) if i in STOP_IDS), len(new_ids))
    return tokenizer.decode(new_ids[:end])


def ask_batch(runner, vision, tokenizer: QWenTokenizer, questions, history=None, system: str = SYSTEM,
              input_vit=None, max_new_tokens: int = 64, **sampling) -> list[str]:
    """Answers to a batch of (pictures, question) pairs, each after the same history.

    The pictures of every prompt (the history's first, then its own) go through `vision` in one call, unless
    `input_vit` [N, 256, H] gives their features in that order. With vision=None and no input_vit the image spans
    keep their paths and the runner must read the pictures itself (`ModelAsRunner`: Qwen-VL's original way).
    On a tensor-parallel rank other than 0 (no outputs there) every answer is None.
    """
    prompts = [make_prompt(tokenizer, question, pictures, history, system)[1] for pictures, question in questions]
    batch = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in prompts], batch_first=True,
                                            padding_value=ENDOFTEXT_ID)  # [B, L]
    img_pos = locate_img_pos(batch)  # [N, 3]
    table = None
    if len(img_pos) and (vision is not None or input_vit is not None):
        if input_vit is None:
            own = iter(p for pictures, _ in questions for p in pictures)
            in_history = sum(1 for turn, _ in (history or ()) for _ in locate_img_pos(tokenizer.encode(turn)))
            pictures = [decode_image_path(batch[i, a + 1 : b]) if k % (len(img_pos) // len(questions)) < in_history
                        else next(own) for k, (i, a, b) in enumerate(img_pos.tolist())]
            with torch.inference_mode():
                input_vit = vision.encode(pictures)  # [N, 256, H]
        batch, flat, _, rows = per_request_tables(batch, input_vit.cpu(), runner.vocab_size)
        table = flat.view(len(questions), rows, -1).to(to_torch_dtype(runner.dtype))  # [B, rows, H]
    requests = [batch[r, : len(ids)] for r, ids in enumerate(prompts)]
    out = runner.generate(requests, prompt_table=table, max_new_tokens=max_new_tokens, end_id=IM_END_ID,
                          pad_id=IM_END_ID, return_dict=True, **sampling)
    if out is None:  # a tensor-parallel rank other than 0: TensorRT-LLM gives the outputs to rank 0 only
        return [None] * len(questions)
    return [answer_text(tokenizer, out["output_ids"][r, 0, len(ids) : int(out["sequence_lengths"][r, 0])].tolist())
            for r, ids in enumerate(prompts)]


def ask(runner, vision, tokenizer: QWenTokenizer, pictures, question: str, history=None, system: str = SYSTEM,
        max_new_tokens: int = 64, **sampling) -> tuple[str, list]:
    """Answer `question` about `pictures` (paths or images, may be empty) after `history`: (answer, new history)."""
    pictures = [] if pictures is None else list(pictures) if isinstance(pictures, (list, tuple)) else [pictures]
    history = [] if history is None else list(history)
    query, _ = make_prompt(tokenizer, question, pictures, history, system)
    [answer] = ask_batch(runner, vision, tokenizer, [(pictures, question)], history, system,
                         max_new_tokens=max_new_tokens, **sampling)
    return answer, history + [(query, answer)]


class ModelAsRunner:
    """A QWenLMHeadModel behind the runners' `generate`: transformers' generate on the left-padded batch.

    The reference the engines are compared with. Image spans may hold fake ids (with a prompt table) or the
    pictures' paths (the model then reads them itself, Qwen-VL's original way).
    """

    def __init__(self, model):
        self.model = model
        self.vocab_size, self.dtype = model.config.vocab_size, model.dtype

    def generate(self, batch_input_ids, prompt_table=None, prompt_tasks=None, max_new_tokens: int = 64,
                 end_id: int = IM_END_ID, pad_id: int = IM_END_ID, num_beams: int = 1, temperature: float = 1.0,
                 top_k: int = 1, top_p: float = 0.0, random_seed=None, return_dict: bool = False,
                 task_vocab_size=None):
        """output_ids [B, 1 or beams, max input + max_new_tokens] in the engines' layout (ids, new tokens, pad_id)."""
        greedy = check_sampling(temperature, top_k, top_p, random_seed=random_seed)
        ids = as_id_list(batch_input_ids)
        device = self.model.device
        width = max(len(seq) for seq in ids)
        input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.long)
        for i, seq in enumerate(ids):
            input_ids[i, width - len(seq):], mask[i, width - len(seq):] = seq, 1  # left padding
        table = {}
        if prompt_table is not None:
            rows = prompt_table.shape[1] if prompt_table.dim() == 3 else (
                prompt_table.shape[0] if task_vocab_size is None else int(torch.as_tensor(task_vocab_size).reshape(-1)[0]))
            tables = prompt_table.shape[0] if prompt_table.dim() == 3 else -(-prompt_table.shape[0] // rows)
            default = list(range(len(ids))) if prompt_table.dim() == 3 and tables > 1 else [0] * len(ids)
            tasks = default if prompt_tasks is None else parse_tasks(prompt_tasks, len(ids), tables)
            table = dict(prompt_table=prompt_table.reshape(-1, prompt_table.shape[-1]).to(device, self.dtype),
                         tasks=torch.tensor(tasks, dtype=torch.int32, device=device), task_vocab_size=rows)
        knobs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_k=top_k,
                                                          top_p=top_p if top_p > 0 else 1.0)
        if random_seed is not None:
            torch.manual_seed(random_seed)
        with torch.inference_mode():
            out = self.model.generate(input_ids.to(device), attention_mask=mask.to(device), **table, **knobs,
                                      max_new_tokens=max_new_tokens, num_beams=num_beams, num_return_sequences=num_beams,
                                      eos_token_id=end_id if end_id >= 0 else None, pad_token_id=pad_id)
        new = out[:, width:].reshape(len(ids), num_beams, -1).cpu()  # [B, beams, ≤ new]
        output_ids = torch.full((len(ids), num_beams, width + max_new_tokens), pad_id, dtype=torch.int32)
        lengths = torch.zeros(len(ids), num_beams, dtype=torch.int32)
        for i, seq in enumerate(ids):
            for j in range(num_beams):
                ends = torch.nonzero(new[i, j] == end_id) if end_id >= 0 else []
                n = int(ends[0]) + 1 if len(ends) else new.shape[2]
                output_ids[i, j, : len(seq)], output_ids[i, j, len(seq) : len(seq) + n] = seq, new[i, j, :n]
                lengths[i, j] = len(seq) + n
        return {"output_ids": output_ids, "sequence_lengths": lengths} if return_dict else output_ids
