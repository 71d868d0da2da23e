"""Notebook 06 — the answer path: pictures and a question (after earlier turns) in, an answer out, for any runner.

Every answer of the package takes this one path: `make_prompt` (the turn's query carries its pictures, a history its
own) → `engine_inputs` (each request's pictures, in the order of its image spans, through the vision encoder; fake
ids and one table per request, TensorRT-LLM's in-flight convention) → the runner's `generate` → `answers` (each
request's new ids up to the first stop id, decoded). `ask_batch` and `ask` run it whole, `Conversation` streams it
turn after turn.

A runner is any `requests.Runner`: the engine's ModelRunner, TRTLLMRunner, or `ModelAsRunner` around a
QWenLMHeadModel. A vision encoder is anything with `encode(pictures) -> input_vit [N, 256, H]`: the model's tower,
OnnxVisualEncoder, TRTVisualEncoder.
"""

import codecs
import hashlib
import os
import warnings
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from .checks.tensors import INT32_MAX, as_id_list, dtype_name
from .checks.values import check_int, check_path
from .files import field, read_json
from .img_pos import locate_img_pos, span_lengths
from .limits import BuildConfig
from .pictures import load_image
from .prompt_table import per_request_tables
from .requests import (
    CheckedRequest,
    OneGeneration,
    Runner,
    SamplingConfig,
    ends_with_stop_word,
    held_by,
    new_tokens,
    room_for_answer,
    steady_logits,
)
from .tokenizing import (
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    IMAGE_START_ID,
    IMG_TOKEN_SPAN,
    Query,
    QWenTokenizer,
    history_turn,
    make_context,
    warn_image_tags_as_text,
)

SYSTEM = "You are a helpful assistant."
STOP_IDS = (IM_END_ID, IM_START_ID)  # Qwen-VL-Chat's stop words: the end of its turn, or the start of another
SPAN_NAME = "picture{k}.png"  # the path written into the span of a picture given as an image object
UNLIMITED = INT32_MAX  # ModelAsRunner's batch, beam and table limits: none


def as_pictures(pictures) -> list:
    """A turn's pictures as a list: None or () for none, one picture (a path or an image) alone, or a list of them."""
    return [] if pictures is None else list(pictures) if isinstance(pictures, (list, tuple)) else [pictures]


def picture_name(picture, k: int) -> str:
    """What the image span of the k-th picture (from 1) holds: its path, or a placeholder for an image object."""
    return os.fspath(picture) if isinstance(picture, (str, os.PathLike)) else SPAN_NAME.format(k=k)


class PictureQuery(Query):
    """A turn's Query that carries its pictures (paths or images) in the order of its image spans, so that a history
    holding it brings its pictures along: a picture given as an image leaves only a placeholder name in its span."""

    __slots__ = ("pictures",)

    def __reduce__(self):
        return _picture_query, (self.segments, self.pictures)


def _picture_query(segments, pictures) -> PictureQuery:
    query = PictureQuery(segments)
    query.pictures = tuple(pictures)
    return query


def query_pictures(query) -> tuple:
    """The pictures behind a query's image spans: a PictureQuery's own, a Query's image paths, none in plain text."""
    if isinstance(query, PictureQuery):
        return query.pictures
    return query.images if isinstance(query, Query) else ()


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
    what each picture's span holds, default `picture_name`). The query is a PictureQuery: it carries the pictures."""
    pictures = list(pictures)
    warn_image_tags_as_text(question, "the question", "give the picture in pictures=[…]")
    names = [picture_name(p, k + 1) for k, p in enumerate(pictures)] if names is None else names
    listed = tokenizer.from_list_format([*({"image": name} for name in names), {"text": question}])
    query = _picture_query(listed.segments, pictures)
    return query, make_context(tokenizer, query, history=history, system=system, max_window_size=max_window_size)[1]


def context_pictures(own, earlier, ids) -> list:
    """What stands behind each image span of a turn's context ids, in order: `earlier` (the history's, oldest first)
    of the turns make_context kept — the newest, so the last of them — then the turn's `own`."""
    own, earlier = list(own), list(earlier)
    kept = list(ids).count(IMAGE_START_ID) - len(own)  # plain text never holds <img>: every one opens a span
    return earlier[len(earlier) - kept :] + own


def answer_text(tokenizer: QWenTokenizer, new_ids) -> str:
    """The text of generated ids up to the first stop id (special tokens such as <ref> and <box> kept, as Qwen-VL's
    chat decodes)."""
    new_ids = [int(i) for i in new_ids]
    end = next((k for k, i in enumerate(new_ids) if i in STOP_IDS), len(new_ids))
    return tokenizer.decode(new_ids[:end])


class EngineInputs(NamedTuple):
    """A batch's inputs for a runner's `generate`, under TensorRT-LLM's names: each request's image spans hold fake ids
    from vocab_size on, reading its own block of the table (in-flight batching's convention)."""

    batch_input_ids: list[torch.Tensor]  # [L_r] each
    prompt_table: torch.Tensor | None  # [B · rows, H] in the runner's dtype, None without pictures
    prompt_tasks: torch.Tensor | None  # [B] int32: request r reads block r
    task_vocab_size: torch.Tensor | None  # [1] int32: rows a block (as run.py's ptuning_setup gives it)


def prompt_inputs(runner, prompts, input_vit=None) -> EngineInputs:
    """Engine inputs of context ids (prompts [B] of lists of ids) whose image spans stand for input_vit's pictures
    [N, rows, H], request after request, span after span (None: the spans keep their paths)."""
    batch = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(ids) for ids in prompts], batch_first=True, padding_value=ENDOFTEXT_ID
    )  # [B, L]
    if input_vit is None:
        return EngineInputs([batch[r, : len(ids)] for r, ids in enumerate(prompts)], None, None, None)
    fake_ids, table, tasks, rows = per_request_tables(batch, input_vit.cpu(), runner.vocab_size, dtype=runner.dtype)
    requests = [fake_ids[r, : len(ids)] for r, ids in enumerate(prompts)]  # [L_r] each; table [B·rows, H]
    return EngineInputs(requests, table, tasks, torch.tensor([rows], dtype=torch.int32))


def engine_inputs(  # noqa: PLR0913 — the answer path's inputs, each the caller's to choose
    runner,
    vision,
    tokenizer: QWenTokenizer,
    questions,
    history=None,
    system: str = SYSTEM,
    input_vit=None,
    max_window_size: int = 6144,
):
    """Engine inputs of a batch of (pictures, question) pairs, each after the same history.

    Each request's pictures (the history's kept turns' first, then its own) go through `vision`, every distinct
    picture once, unless `input_vit` [N, 256, H] gives their features, request after request in that order. With
    vision=None and no input_vit the image spans keep their paths, for a runner that reads pictures itself
    (`ModelAsRunner`: Qwen-VL's original way).
    """
    history, questions = [] if history is None else list(history), list(questions)
    if not questions:
        raise ValueError("no questions: give at least one (pictures, question) pair, e.g. [([path], '图片里是什么？')]")
    turns = [
        make_prompt(tokenizer, question, pictures, history, system, max_window_size) for pictures, question in questions
    ]
    earlier = [p for turn_query, _ in history for p in query_pictures(turn_query)]
    pictures = [p for query, ids in turns for p in context_pictures(query.pictures, earlier, ids)]  # in span order
    if pictures and vision is None and input_vit is None:
        image = next((k for k, p in enumerate(pictures) if not isinstance(p, (str, os.PathLike))), None)
        if image is not None:
            raise ValueError(
                f"picture {image + 1} is an image, not a file: give a vision encoder (vision=…) or its features "
                "(input_vit=…); only a path in an image span can be read by the model itself"
            )
    elif pictures and input_vit is None:
        distinct = {id(p): p for p in pictures}  # a history's pictures are shared by every request: encoded once
        with torch.inference_mode():
            encoded = dict(zip(distinct, vision.encode(list(distinct.values()))))  # id → [256, H]
        input_vit = torch.stack([encoded[id(p)] for p in pictures])  # [N, 256, H]
    return prompt_inputs(runner, [ids for _, ids in turns], input_vit if pictures else None)


def generate_for_qwenvl(
    runner,
    input_ids,
    max_new_tokens: int,
    prompt_table=None,
    tasks=None,
    task_vocab_size=None,
    num_beams: int = 1,
    **sampling,
):
    """run.py's step 5, the one generate call of Qwen-VL-Chat's answers: clamp max_new_tokens to what max_seq_len
    leaves (with a warning), then decode, each answer ending at <|im_end|>: output_ids."""
    batch = as_id_list(input_ids)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    longest = max(len(ids) for ids in batch)
    room = room_for_answer(runner.max_seq_len, longest)
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


def answers(tokenizer: QWenTokenizer, outputs, inputs: EngineInputs) -> list:
    """Each request's answer in a runner's outputs (beam 0): its new ids up to the first stop id, decoded; on a
    tensor-parallel rank other than 0 (no outputs) None for each."""
    requests = inputs.batch_input_ids
    if outputs is None:  # TensorRT-LLM gives the outputs to rank 0 only
        return [None] * len(requests)
    return [answer_text(tokenizer, new_tokens(outputs, r, len(ids))) for r, ids in enumerate(requests)]


def answer_inputs(runner, tokenizer: QWenTokenizer, inputs: EngineInputs, max_new_tokens: int = 64, **sampling) -> list:
    """The answers of a runner to engine inputs, Qwen-VL-Chat's way: greedy unless `sampling` says otherwise, each
    ending at <|im_end|>."""
    batch, table, tasks, task_vocab_size = inputs
    out = generate_for_qwenvl(
        runner, batch, max_new_tokens, table, tasks, task_vocab_size, return_dict=True, **sampling
    )
    return answers(tokenizer, out, inputs)


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
) -> list:
    """The answer path: answers to a batch of (pictures, question) pairs, each after the same history, through any
    runner (`engine_inputs`, then one `generate`, then `answers`)."""
    inputs = engine_inputs(runner, vision, tokenizer, questions, history, system, input_vit)
    return answer_inputs(runner, tokenizer, inputs, max_new_tokens, **sampling)


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
    """Answer `question` about `pictures` (paths or images, may be empty) after `history`: (answer, new history).

    With a vision encoder each picture is read once, here, and the new turn keeps it as read (its span still names
    its path): a later turn shows it as this one did, whatever its file holds by then, as a Conversation does. With
    vision=None the model reads every picture from its path in every turn (Qwen-VL's original way)."""
    pictures = as_pictures(pictures)
    history = [] if history is None else list(history)
    seen = pictures if vision is None else [load_image(p) for p in pictures]
    names = [picture_name(p, k + 1) for k, p in enumerate(pictures)]
    query, _ = make_prompt(tokenizer, question, seen, history, system, names=names)
    [answer] = ask_batch(
        runner, vision, tokenizer, [(seen, question)], history, system, max_new_tokens=max_new_tokens, **sampling
    )
    return answer, history + [(query, answer)]


class ModelAsRunner(Runner):
    """A QWenLMHeadModel behind the runners' `generate` (requests.Runner): transformers' generate on the left-padded
    batch, the reference the engines are compared with.

    Image spans may hold fake ids (with a prompt table) or the pictures' paths (the model then reads them itself,
    Qwen-VL's original way). Its limits are the model's: seq_length ids in all, no batch, beam or table limit.
    """

    path_spans = True

    def __init__(self, model):
        config = model.config
        self.model, self.vocab_size, self.hidden_size, self.dtype = (
            model,
            config.vocab_size,
            config.hidden_size,
            model.dtype,
        )
        self.build_config = BuildConfig(
            max_batch_size=UNLIMITED,
            max_input_len=config.seq_length,
            max_seq_len=config.seq_length,
            max_prompt_embedding_table_size=UNLIMITED,
            dtype=dtype_name(model.dtype),
            max_beam_width=UNLIMITED,
        )
        self.max_input_len, self.max_seq_len, self.max_request_rows = config.seq_length, config.seq_length, None
        self.turn = OneGeneration()

    def steps(self, request: CheckedRequest, max_new_tokens: int, sampling: SamplingConfig, streaming: bool):
        """transformers' generate on the request, in one step (stop words cut each answer after the first it ends
        with, as stopping there would: greedy and seeded decoding draw the same tokens before it)."""
        beams = sampling.num_beams
        if sampling.repetition_penalty != 1.0 or (beams > 1 and request.stop_words is not None):
            raise ValueError(
                "ModelAsRunner applies neither repetition_penalty (transformers' processor would read fake prompt "
                "ids and padding as vocabulary ids) nor stop_words_list with num_beams > 1: use the engine's "
                "ModelRunner for those"
            )
        ids, device = request.ids, self.model.device
        width = max(len(seq) for seq in ids)
        input_ids = torch.full((len(ids), width), sampling.pad_id, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.long)
        for i, seq in enumerate(ids):
            input_ids[i, width - len(seq) :], mask[i, width - len(seq) :] = seq, 1  # left padding
        table = {}
        if request.table is not None:
            table = dict(
                prompt_table=request.table.to(device),
                tasks=torch.tensor(request.tasks, dtype=torch.int32, device=device),
                task_vocab_size=request.task_vocab_size,
            )
        knobs = dict(do_sample=False)
        if not sampling.greedy:  # the engine's guards against knobs float32 rounds to 0 (requests.held_by)
            temperature = held_by(sampling.temperature, torch.float32)
            knobs = dict(do_sample=True, temperature=temperature, top_k=sampling.top_k, top_p=sampling.top_p or 1.0)
            knobs["logits_processor"] = [SteadyLogits()]  # transformers runs it before the temperature
        if sampling.random_seed is not None:
            torch.manual_seed(sampling.random_seed)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids.to(device),
                attention_mask=mask.to(device),
                **table,
                **knobs,
                max_new_tokens=max_new_tokens,
                num_beams=beams,
                num_return_sequences=beams,
                length_penalty=sampling.length_penalty,
                early_stopping=sampling.early_stopping,
                eos_token_id=sampling.end_id if sampling.end_id >= 0 else None,
                pad_token_id=sampling.pad_id,
            )
        new = out[:, width:].reshape(len(ids), beams, -1).cpu()  # [B, beams, ≤ new]
        generated = torch.full((len(ids), beams), new.shape[2], dtype=torch.long)
        if sampling.end_id >= 0:  # each row up to its first end_id, which it keeps
            ends = new == sampling.end_id
            first = ends.int().argmax(dim=2)  # [B, beams]
            generated = torch.where(ends.any(dim=2), first + 1, generated)
        for r, words in enumerate(request.stop_words or []):
            tail = new[r, 0, : int(generated[r, 0])].tolist()
            ends = (t for t in range(1, len(tail) + 1) if ends_with_stop_word(tail[:t], words))
            generated[r, 0] = next(ends, len(tail))
        return iter([(new, generated)])


class SteadyLogits:
    """A logits processor for transformers' generate: the scores with each row's best at 0 (`requests.steady_logits`),
    the same draws, and no NaN when a tiny temperature divides them (a plain callable: the TensorRT-LLM environment
    imports this module without transformers 5)."""

    def __call__(self, input_ids, scores):
        return steady_logits(scores.float())


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
        SamplingConfig(  # the runners' check of the knobs
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
        )
        check_int("max_new_tokens", self.max_new_tokens, 1)
        if isinstance(self.stop, str) or not all(isinstance(w, str) and w for w in self.stop):
            raise TypeError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")

    @classmethod
    def from_dir(cls, directory, **overrides) -> "GenerationSettings":
        """The settings of a checkpoint or engine directory's generation_config.json (Qwen-VL-Chat: sampling with
        top_p 0.3), defaults for what it leaves out, `overrides` last (e.g. do_sample=False for greedy)."""
        file = check_path("directory", directory) / "generation_config.json"
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


def picture_key(picture) -> str:
    """What a picture is, by content: its size and the sha256 of its RGB pixels (a path, an image, or the same
    picture again after its file changed: the same pixels give the same key, other pixels another)."""
    return f"{picture.width}x{picture.height}:" + hashlib.sha256(picture.tobytes()).hexdigest()


def picture_rows(ids) -> int:
    """The prompt-table rows the pictures of context ids [L] take: their image spans' lengths (img_pos)."""
    return sum(span_lengths(locate_img_pos(torch.tensor([list(ids)]), span=None)))


def prompt_limits(runner) -> tuple[int, int | None]:
    """(most ids, most prompt-table rows) one request may send to a runner and still get an answer: its max_input_len
    (at most max_seq_len − 1, room for one new token) and the table rows it accepts per request (None: no limit)."""
    return min(runner.max_input_len, runner.max_seq_len - 1), runner.max_request_rows


class Conversation:
    """A multi-turn chat about pictures on one runner: the history is kept (within max_window_size, as make_context
    does, and within what the engine accepts: the oldest turns are left out first, `left_out` says how many), each
    picture's input_vit is computed once and reused while its content stays the same and a turn that shows it can
    still return, answers can stream. A turn the engine refuses changes nothing.

    A turn costs the same after 50 turns as after 1600: turns that no later prompt can hold (even after the shortest
    question, the turns after them fill the engine) are never looked at again, their pictures' features are let go,
    and each turn's size is counted once, when it joins the history."""

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
        self.clear()

    def clear(self) -> None:
        """Forget the history and the pictures."""
        self.history: list = []  # (query, answer) of each turn
        self.features: dict = {}  # picture_key → input_vit [256, H]
        self.pictures: list = []  # every picture given, in order
        self.left_out = 0  # history turns the last question's prompt left out, the oldest, to fit the engine
        self._keys: list = []  # the picture_key of each picture of each turn, as it was when given
        self._sizes: list = []  # (ids, prompt-table rows) of each turn as make_context lays it out in a prompt
        self._first = 0  # the first turn a prompt may still hold: every turn before it is out for good
        self._held = [0, 0]  # (ids, prompt-table rows) of the turns from _first on
        self._users: dict = {}  # picture_key → how many pictures of the turns from _first on show it

    def ask(self, question: str, pictures=(), **overrides) -> str:
        """The answer to `question` about `pictures` (paths or images, added to the conversation)."""
        return "".join(self.stream(question, pictures, **overrides))

    def stream(self, question: str, pictures=(), **overrides):
        """Yield the answer's text as it is generated; the turn joins the history when the stream ends (also when it
        is closed early: the answer so far). `overrides` change GenerationSettings for this turn."""
        settings = replace(self.settings, **overrides)
        pictures = as_pictures(pictures)
        loaded = [load_image(p) for p in pictures]  # read once: what this turn shows, whatever the file holds later
        keys = [picture_key(image) for image in loaded]
        names = [picture_name(p, len(self.pictures) + k + 1) for k, p in enumerate(pictures)]
        query, ids, start = self._fit(question, pictures, names, settings.max_window_size)
        in_context = context_pictures(keys, [key for turn in self._keys[start:] for key in turn], ids)
        new = {key: image for key, image in zip(keys, loaded) if key not in self.features}
        features = dict(self.features)
        if new:
            with torch.inference_mode():
                features.update(zip(new, self.vision.encode(list(new.values())).cpu()))  # [256, H] each
        input_vit = torch.stack([features[k] for k in in_context]) if in_context else None  # [N, 256, H]
        inputs = engine_inputs(
            self.runner, None, self.tokenizer, [(pictures, question)], self.history[start:], self.system, input_vit,
            settings.max_window_size,
        )  # fmt: skip
        batch, table, tasks, task_vocab_size = inputs
        room = room_for_answer(self.runner.max_seq_len, len(ids))
        steps = generate_for_qwenvl(
            self.runner,
            batch,
            min(settings.max_new_tokens, room),  # a chat's max_new_tokens is a bound: no warning when it is cut
            table,
            tasks,
            task_vocab_size,
            stop_words_list=[[(IM_START_ID,)]],
            multimodal_hashes=[in_context],  # each picture by its pixels: what KV-cache reuse keys its blocks by
            streaming=True,
            return_dict=True,
            **settings.sampling(),
        )
        # the engine took the turn: from here on it joins the conversation
        self.features, self.pictures = features, self.pictures + pictures
        self.left_out = len(self.history) - (ids.count(IM_START_ID) - 3) // 2  # 2 <|im_start|> a turn
        text, total, shown, seen = TextStream(self.tokenizer), "", 0, len(ids)
        try:
            for out in steps:
                new_ids = new_tokens(out, 0, seen)
                seen += len(new_ids)
                ended = any(i in STOP_IDS for i in new_ids)
                total += "".join(text.push(i) for i in new_ids if i not in STOP_IDS) + (text.flush() if ended else "")
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
            self._add_turn(query, total[:shown], keys)

    def _add_turn(self, query, answer: str, keys) -> None:
        """Join a turn to the history, its size counted once (a turn's ids do not depend on the turns around it)."""
        ids = self.tokenizer.encode_query(history_turn(query, answer))
        self.history.append((query, answer))
        self._keys.append(keys)
        self._sizes.append((len(ids), picture_rows(ids)))
        self._held = [self._held[0] + len(ids), self._held[1] + picture_rows(ids)]
        for key in keys:
            self._users[key] = self._users.get(key, 0) + 1
        self._forget_turns_out_for_good(*prompt_limits(self.runner))

    def _forget_turns_out_for_good(self, most_ids: int, most_rows: int | None) -> None:
        """Move `_first` past the turns no prompt can hold again: a prompt that holds a turn holds every later one, so
        once the later ones and the shortest question fill the engine, the turn never returns (the history only
        grows). Their pictures' features go, unless a later turn shows the same picture."""
        shortest = len(make_prompt(self.tokenizer, "", (), None, self.system)[1])  # no question, no picture
        while self._first < len(self.history) and (
            shortest + self._held[0] > most_ids or (most_rows is not None and self._held[1] > most_rows)
        ):
            size, rows = self._sizes[self._first]
            self._held = [self._held[0] - size, self._held[1] - rows]
            for key in self._keys[self._first]:
                self._users[key] -= 1
                if not self._users[key]:
                    del self._users[key]
                    self.features.pop(key, None)
            self._first += 1

    def _fit(self, question: str, pictures, names, max_window_size: int):
        """(query, context ids, first history turn kept) of the prompt with the most recent history turns that the
        runner accepts (make_context's max_window_size applies as well); a ValueError when not even the question
        alone fits. The search goes on from the first turn that can still return, adding up the turns' sizes."""
        most_ids, most_rows = prompt_limits(self.runner)
        query, alone = make_prompt(self.tokenizer, question, pictures, None, self.system, max_window_size, names)
        rows = picture_rows(alone)
        if len(alone) > most_ids or (most_rows is not None and rows > most_rows):
            raise ValueError(
                f"this question with its {len(pictures)} picture(s) needs {len(alone)} ids and {rows} prompt-table "
                f"rows, but the engine takes at most {most_ids} ids"
                + ("" if most_rows is None else f" and {most_rows} rows ({most_rows // IMG_TOKEN_SPAN} pictures)")
                + " per question: ask with fewer pictures or a shorter question, or rebuild the engine with larger "
                "limits"
            )
        start, (size, held) = self._first, self._held
        while len(alone) + size > most_ids or (most_rows is not None and rows + held > most_rows):
            size, held = size - self._sizes[start][0], held - self._sizes[start][1]
            start += 1
        # make_context keeps the same turns or fewer (max_window_size), newest first: a prompt the runner accepts
        query, ids = make_prompt(
            self.tokenizer, question, pictures, self.history[start:], self.system, max_window_size, names
        )
        return query, ids, start


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
