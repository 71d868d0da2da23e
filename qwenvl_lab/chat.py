"""Notebook 06 — the chat: pictures and a question (after earlier turns) in, an answer out, for any runner.

The course's pipeline in one place: `make_context` → `img_pos` → fake prompt ids → the prompt table (one per
request, TensorRT-LLM's in-flight convention) → `generate` → the answer, cut at the first stop id and decoded.

A runner is anything with TensorRT-LLM's `generate(batch_input_ids, prompt_table=, prompt_tasks=, max_new_tokens=,
end_id=, pad_id=, return_dict=True, …)` and `vocab_size` / `dtype` attributes: the engine's ModelRunner,
TRTLLMRunner, or `ModelAsRunner` around a QWenLMHeadModel. A vision encoder is anything with
`encode(pictures) -> input_vit [N, 256, H]`: the model's tower, OnnxVisualEncoder, TRTVisualEncoder.
"""

import codecs
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .files import field, read_json
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


def make_prompt(
    tokenizer: QWenTokenizer,
    question: str,
    pictures=(),
    history=None,
    system: str = SYSTEM,
    max_window_size: int = 6144,
    names=None,
):
    """(query, context ids) of one chat turn: the pictures, then the question, after the history's turns (`names`:
    what each picture's span holds, default `picture_name`)."""
    names = [picture_name(p, k + 1) for k, p in enumerate(pictures)] if names is None else names
    query = tokenizer.from_list_format([*({"image": name} for name in names), {"text": question}])
    return query, make_context(tokenizer, query, history=history, system=system, max_window_size=max_window_size)[1]


def answer_text(tokenizer: QWenTokenizer, new_ids) -> str:
    """The text of generated ids up to the first stop id (special tokens such as <ref> and <box> kept, as Qwen-VL's
    chat decodes)."""
    new_ids = [int(i) for i in new_ids]
    end = next((k for k, i in enumerate(new_ids) if i in STOP_IDS), len(new_ids))
    return tokenizer.decode(new_ids[:end])


def ask_batch(
    runner,
    vision,
    tokenizer: QWenTokenizer,
    questions,
    history=None,
    system: str = SYSTEM,
    input_vit=None,
    max_new_tokens: int = 64,
    **sampling,
) -> list[str]:
    """Answers to a batch of (pictures, question) pairs, each after the same history.

    The pictures of every prompt (the history's first, then its own) go through `vision` in one call, unless
    `input_vit` [N, 256, H] gives their features in that order. With vision=None and no input_vit the image spans
    keep their paths and the runner must read the pictures itself (`ModelAsRunner`: Qwen-VL's original way).
    On a tensor-parallel rank other than 0 (no outputs there) every answer is None.
    """
    prompts = [make_prompt(tokenizer, question, pictures, history, system)[1] for pictures, question in questions]
    batch = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(ids) for ids in prompts], batch_first=True, padding_value=ENDOFTEXT_ID
    )  # [B, L]
    img_pos = locate_img_pos(batch)  # [N, 3]
    table = None
    if len(img_pos) and (vision is not None or input_vit is not None):
        if input_vit is None:
            own = iter(p for pictures, _ in questions for p in pictures)
            in_history = sum(1 for turn, _ in (history or ()) for _ in locate_img_pos(tokenizer.encode(turn)))
            pictures = [
                decode_image_path(batch[i, a + 1 : b])
                if k % (len(img_pos) // len(questions)) < in_history
                else next(own)
                for k, (i, a, b) in enumerate(img_pos.tolist())
            ]
            with torch.inference_mode():
                input_vit = vision.encode(pictures)  # [N, 256, H]
        batch, flat, _, rows = per_request_tables(batch, input_vit.cpu(), runner.vocab_size)
        table = flat.view(len(questions), rows, -1).to(to_torch_dtype(runner.dtype))  # [B, rows, H]
    requests = [batch[r, : len(ids)] for r, ids in enumerate(prompts)]
    out = runner.generate(
        requests,
        prompt_table=table,
        max_new_tokens=max_new_tokens,
        end_id=IM_END_ID,
        pad_id=IM_END_ID,
        return_dict=True,
        **sampling,
    )
    if out is None:  # a tensor-parallel rank other than 0: TensorRT-LLM gives the outputs to rank 0 only
        return [None] * len(questions)
    return [
        answer_text(tokenizer, out["output_ids"][r, 0, len(ids) : int(out["sequence_lengths"][r, 0])].tolist())
        for r, ids in enumerate(prompts)
    ]


def ask(
    runner,
    vision,
    tokenizer: QWenTokenizer,
    pictures,
    question: str,
    history=None,
    system: str = SYSTEM,
    max_new_tokens: int = 64,
    **sampling,
) -> tuple[str, list]:
    """Answer `question` about `pictures` (paths or images, may be empty) after `history`: (answer, new history)."""
    pictures = [] if pictures is None else list(pictures) if isinstance(pictures, (list, tuple)) else [pictures]
    history = [] if history is None else list(history)
    query, _ = make_prompt(tokenizer, question, pictures, history, system)
    [answer] = ask_batch(
        runner, vision, tokenizer, [(pictures, question)], history, system, max_new_tokens=max_new_tokens, **sampling
    )
    return answer, history + [(query, answer)]


class ModelAsRunner:
    """A QWenLMHeadModel behind the runners' `generate`: transformers' generate on the left-padded batch.

    The reference the engines are compared with. Image spans may hold fake ids (with a prompt table) or the
    pictures' paths (the model then reads them itself, Qwen-VL's original way).
    """

    def __init__(self, model):
        self.model = model
        self.vocab_size, self.dtype, self.max_seq_len = model.config.vocab_size, model.dtype, model.config.seq_length

    def generate(
        self,
        batch_input_ids,
        prompt_table=None,
        prompt_tasks=None,
        max_new_tokens: int = 64,
        end_id: int = IM_END_ID,
        pad_id: int = IM_END_ID,
        num_beams: int = 1,
        temperature: float = 1.0,
        top_k: int = 1,
        top_p: float = 0.0,
        random_seed=None,
        return_dict: bool = False,
        task_vocab_size=None,
    ):
        """output_ids [B, 1 or beams, max input + max_new_tokens] in the engines' layout (ids, new tokens, pad_id)."""
        greedy = check_sampling(temperature, top_k, top_p, random_seed=random_seed)
        ids = as_id_list(batch_input_ids)
        device = self.model.device
        width = max(len(seq) for seq in ids)
        input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.long)
        for i, seq in enumerate(ids):
            input_ids[i, width - len(seq) :], mask[i, width - len(seq) :] = seq, 1  # left padding
        table = {}
        if prompt_table is not None:
            rows = (
                prompt_table.shape[1]
                if prompt_table.dim() == 3
                else (
                    prompt_table.shape[0]
                    if task_vocab_size is None
                    else int(torch.as_tensor(task_vocab_size).reshape(-1)[0])
                )
            )
            tables = prompt_table.shape[0] if prompt_table.dim() == 3 else -(-prompt_table.shape[0] // rows)
            default = list(range(len(ids))) if prompt_table.dim() == 3 and tables > 1 else [0] * len(ids)
            tasks = default if prompt_tasks is None else parse_tasks(prompt_tasks, len(ids), tables)
            table = dict(
                prompt_table=prompt_table.reshape(-1, prompt_table.shape[-1]).to(device, self.dtype),
                tasks=torch.tensor(tasks, dtype=torch.int32, device=device),
                task_vocab_size=rows,
            )
        knobs = (
            dict(do_sample=False)
            if greedy
            else dict(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p if top_p > 0 else 1.0)
        )
        if random_seed is not None:
            torch.manual_seed(random_seed)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids.to(device),
                attention_mask=mask.to(device),
                **table,
                **knobs,
                max_new_tokens=max_new_tokens,
                num_beams=num_beams,
                num_return_sequences=num_beams,
                eos_token_id=end_id if end_id >= 0 else None,
                pad_token_id=pad_id,
            )
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


@dataclass(frozen=True)
class GenerationSettings:
    """How a chat draws its answers: the knobs of Qwen-VL-Chat's generation_config.json, and stop strings."""

    max_new_tokens: int = 512
    do_sample: bool = False  # False: greedy
    top_k: int = 0  # with do_sample: 0 = no top-k limit
    top_p: float = 1.0  # with do_sample: 1 = no top-p limit
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    max_window_size: int = 6144  # history turns are dropped, oldest first, past this many tokens
    stop: tuple[str, ...] = ()  # the answer ends before the first of these strings

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p, repetition_penalty=self.repetition_penalty)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if isinstance(self.stop, str) or not all(isinstance(w, str) and w for w in self.stop):
            raise TypeError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")

    @classmethod
    def from_dir(cls, directory, **overrides) -> "GenerationSettings":
        """The settings of a checkpoint or engine directory's generation_config.json (Qwen-VL-Chat: sampling with
        top_p 0.3), defaults for what it leaves out, `overrides` last (e.g. do_sample=False for greedy)."""
        file = Path(directory) / "generation_config.json"
        config = read_json(file, "give a Qwen-VL checkpoint or engine directory, or build GenerationSettings(...)")
        fix = "repair generation_config.json or pass the value as an override"
        known = {}
        for key, kind in (
            ("max_new_tokens", "int"),
            ("top_k", "count"),
            ("temperature", "positive"),
            ("repetition_penalty", "positive"),
            ("max_window_size", "int"),
            ("do_sample", "bool"),
        ):
            if key in config:
                known[key] = field(config, key, kind, file, fix)
        if "top_p" in config:
            known["top_p"] = field(config, "top_p", "positive", file, fix)
        return cls(**{**known, **overrides})

    def sampling(self) -> dict:
        """The runner's knobs: greedy is top_k 1."""
        if not self.do_sample:
            return dict(top_k=1, repetition_penalty=self.repetition_penalty)
        return dict(
            top_k=self.top_k, top_p=self.top_p, temperature=self.temperature, repetition_penalty=self.repetition_penalty
        )


class TextStream:
    """Generated ids → text as they arrive: UTF-8 characters split across tokens come out whole, special tokens
    (such as <ref> and <box>) as their text; "".join of the pieces is `answer_text` of the same ids."""

    def __init__(self, tokenizer: QWenTokenizer):
        self.tokenizer = tokenizer
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes (may be empty while a character is still incomplete)."""
        if token_id < ENDOFTEXT_ID:
            return self.decoder.decode(self.tokenizer.encoding.decode_single_token_bytes(token_id))
        return self.flush() + self.tokenizer.decode([token_id])

    def flush(self) -> str:
        """The end of the text: an incomplete character becomes U+FFFD."""
        text = self.decoder.decode(b"", final=True)
        self.decoder.reset()
        return text


class Conversation:
    """A multi-turn chat about pictures on one runner: the history is kept (within max_window_size, as make_context
    does), each picture's input_vit is computed once and reused in later turns, answers can stream."""

    def __init__(
        self,
        runner,
        vision,
        tokenizer: QWenTokenizer,
        system: str = SYSTEM,
        settings: GenerationSettings = GenerationSettings(),
    ):
        self.runner, self.vision, self.tokenizer = runner, vision, tokenizer
        self.system, self.settings = system, settings
        self.history: list = []  # (query, answer) of each turn
        self.features: dict = {}  # span text (a picture's path or placeholder name) → input_vit [256, H]
        self.pictures: list = []  # every picture given, in order

    def clear(self) -> None:
        """Forget the history and the pictures."""
        self.history, self.features, self.pictures = [], {}, []

    def ask(self, question: str, pictures=(), **overrides) -> str:
        """The answer to `question` about `pictures` (paths or images, added to the conversation)."""
        return "".join(self.stream(question, pictures, **overrides))

    def stream(self, question: str, pictures=(), **overrides):
        """Yield the answer's text as it is generated; the turn joins the history when the stream ends (also when it
        is closed early: the answer so far). `overrides` change GenerationSettings for this turn."""
        settings = replace(self.settings, **overrides)
        pictures = [] if pictures is None else list(pictures) if isinstance(pictures, (list, tuple)) else [pictures]
        names = [picture_name(p, len(self.pictures) + k + 1) for k, p in enumerate(pictures)]
        query, ids = make_prompt(
            self.tokenizer, question, pictures, self.history, self.system, settings.max_window_size, names
        )
        ids = torch.tensor(ids)[None]  # [1, L]
        table = self._table(ids, dict(zip(names, pictures)))
        if table is not None:
            ids, table = table
        self.pictures += pictures
        room = self.runner.max_seq_len - ids.shape[1]
        if room < 1:
            raise ValueError(
                f"the conversation fills the engine's max_seq_len {self.runner.max_seq_len} ({ids.shape[1]} "
                "ids): clear() it, lower max_window_size, or rebuild the engine with a larger max_seq_len"
            )
        steps = self.runner.generate(
            [ids[0]],
            prompt_table=table,
            max_new_tokens=min(settings.max_new_tokens, room),
            end_id=IM_END_ID,
            pad_id=IM_END_ID,
            stop_words_list=[[(IM_START_ID,)]],
            streaming=True,
            return_dict=True,
            **settings.sampling(),
        )
        text, total, shown, seen = TextStream(self.tokenizer), "", 0, ids.shape[1]
        try:
            for out in steps:
                end = int(out["sequence_lengths"][0, 0])
                new, seen = out["output_ids"][0, 0, seen:end].tolist(), end
                ended = any(i in STOP_IDS for i in new)
                total += "".join(text.push(i) for i in new if i not in STOP_IDS) + (text.flush() if ended else "")
                total, ended, safe = _cut_at_stop(total, settings.stop, ended)
                if safe > shown:
                    piece, shown = total[shown:safe], safe
                    yield piece
                if ended:
                    break
            else:  # max_new_tokens reached
                total, _, safe = _cut_at_stop(total + text.flush(), settings.stop, True)
                if safe > shown:
                    piece, shown = total[shown:safe], safe
                    yield piece
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
            self.history.append((query, total[:shown]))

    def _table(self, ids: torch.Tensor, new: dict):
        """(ids with fake ids [1, L], table [1, rows, H]) for the pictures of ids [1, L], or None without pictures:
        features already computed are reused, the new pictures' computed in one call."""
        img_pos = locate_img_pos(ids)  # [N, 3]
        if not len(img_pos):
            return None
        names = [decode_image_path(ids[0, a + 1 : b]) for _, a, b in img_pos.tolist()]
        missing = [name for name in dict.fromkeys(names) if name not in self.features]
        if missing:
            with torch.inference_mode():
                encoded = self.vision.encode([new.get(name, name) for name in missing])  # [M, 256, H]
            self.features.update(zip(missing, encoded.cpu()))
        input_vit = torch.stack([self.features[name] for name in names])  # [N, 256, H]
        fake_ids, flat, _, rows = per_request_tables(ids, input_vit, self.runner.vocab_size)
        return fake_ids, flat.view(1, rows, -1).to(to_torch_dtype(self.runner.dtype))


def _cut_at_stop(text: str, stop, ended: bool) -> tuple[str, bool, int]:
    """(text cut before its first stop string, whether it ended, how much of it can be shown): while the answer goes
    on, a tail that may be the start of a stop string is held back."""
    found = [text.find(word) for word in stop if word in text]
    if found:
        return text[: min(found)], True, min(found)
    if ended:
        return text, True, len(text)
    held = max((k for word in stop for k in range(1, len(word)) if text.endswith(word[:k])), default=0)
    return text, False, len(text) - held
