"""The runner interface — TensorRT-LLM's `generate` contract, shared by the engine's ModelRunner, TRTLLMRunner and
chat.ModelAsRunner.

A request is a 1-D tensor of token ids; ids >= vocab_size are fake prompt ids that read the prompt table. `Runner`
holds the one `generate`: its sampling settings become a `SamplingConfig`, the batch goes through `check_request`
(every limit fixed at build time, every id, the table's shape, dtype and values, the tasks), then a runner's own
`steps` produce the new tokens and `build_outputs` lays them out the engines' way, so that every runner refuses the
same inputs with the same messages and answers in one layout. A runner serves one generation at a time
(`OneGeneration`) and streams the same way (`GenerationStream`).
"""

import threading
from collections import deque
from dataclasses import dataclass

import torch

from .checks.tensors import INT32_MAX, as_id_list, check_rows_per_request, check_rows_read, one_int, parse_tasks
from .checks.values import check_choice, check_int, check_number, is_int
from .fake_ids import fake_id_runs
from .img_pos import locate_img_pos
from .limits import TABLE_SIZE_RULE, BuildConfig
from .prompt_table import rows_read, runtime_prompt_table, table_size
from .tokenizing import IM_END_ID, IMAGE_START_ID


def is_greedy(top_k: int, top_p: float) -> bool:
    """True when the knobs mean greedy decoding: top_k 1, or top_k 0 with top_p 0 (TensorRT-LLM's rule)."""
    return top_k == 1 or (top_k == 0 and top_p == 0.0)


def held_by(value: float, dtype: torch.dtype) -> float:
    """A positive knob (temperature, top_p, repetition penalty) within what `dtype` holds: at least its smallest
    normal number, which a smaller value would round to 0 in it (every token dropped, or logits / 0), at most its
    largest."""
    finfo = torch.finfo(dtype)
    return min(max(value, finfo.tiny), finfo.max)


def steady_logits(logits: torch.Tensor) -> torch.Tensor:
    """Logits [n, V] with each row's best at 0 (an infinite logit counted as the dtype's largest number): the same
    softmax, and divided by a tiny temperature the other logits go to -inf, never to NaN (inf - inf)."""
    finfo = torch.finfo(logits.dtype)
    logits = logits.clamp(finfo.min, finfo.max)
    return logits - logits.amax(dim=-1, keepdim=True)


LENGTH_PENALTY_MOST = 30.0  # (2**31) ** 30 < the largest float: no answer length makes a beam's score overflow


@dataclass(frozen=True)
class SamplingConfig:
    """How one `generate` call draws its tokens, under TensorRT-LLM's SamplingConfig names.

    Greedy is top_k 1 (or top_k 0 with top_p 0); otherwise temperature, top_k (0: off) and top_p sample.
    repetition_penalty follows transformers' rule (1: off). num_beams > 1 is beam search, which does not sample, with
    length_penalty and early_stopping (True, False or "never", as in transformers). end_id and pad_id are checked
    against the runner's vocabulary by `check_request` (end_id -1: never stop).
    """

    end_id: int = IM_END_ID
    pad_id: int = IM_END_ID
    num_beams: int = 1
    temperature: float = 1.0
    top_k: int = 1
    top_p: float = 0.0
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    random_seed: int | None = None
    repetition_penalty: float = 1.0

    def __post_init__(self):
        check_int("num_beams", self.num_beams, 1)
        check_number("temperature", self.temperature, 0, open_minimum=True)
        check_int("top_k", self.top_k, 0)
        check_number("top_p", self.top_p, 0, 1)
        # a beam's score is divided by length ** length_penalty: within ±30 that stays a finite number for any length
        check_number("length_penalty", self.length_penalty, -LENGTH_PENALTY_MOST, LENGTH_PENALTY_MOST)
        check_choice("early_stopping", self.early_stopping, (True, False, "never"))
        if self.random_seed is not None:
            check_int("random_seed", self.random_seed, 0, 2**63 - 1)
        check_number("repetition_penalty", self.repetition_penalty, 0, open_minimum=True)
        if self.num_beams > 1 and not self.greedy:
            raise ValueError("beam search picks the best beams, it does not sample: leave top_k=1 with num_beams > 1")

    @property
    def greedy(self) -> bool:
        """True when the knobs mean greedy decoding."""
        return is_greedy(self.top_k, self.top_p)


def room_for_answer(max_seq_len: int, prompt_len: int) -> int:
    """The new tokens a prompt of `prompt_len` ids leaves room for under `max_seq_len` (prompt + answer); a prompt
    that leaves none is refused."""
    room = max_seq_len - prompt_len
    if room < 1:
        raise ValueError(
            f"a prompt of {prompt_len} ids fills the engine's max_seq_len {max_seq_len}: no room for an answer; "
            "shorten it (fewer pictures or history turns) or rebuild with a larger max_seq_len"
        )
    return room


def ends_with_stop_word(tokens, words) -> bool:
    """Whether the generated `tokens` (a list of ids) end with one of the stop sequences `words` (tuples of ids)."""
    return any(len(w) <= len(tokens) and tuple(tokens[len(tokens) - len(w) :]) == w for w in words)


def check_stop_words(stop_words_list, batch_size: int, vocab_size: int) -> list[list[tuple[int, ...]]] | None:
    """TensorRT-LLM's stop_words_list — one list of token-id sequences per request — checked: per request, tuples."""
    if stop_words_list is None:
        return None
    if not isinstance(stop_words_list, (list, tuple)) or len(stop_words_list) != batch_size:
        raise ValueError(
            f"stop_words_list must hold one list of stop sequences per request ({batch_size}), e.g. "
            f"[[[151644]]] * {batch_size}, got {stop_words_list!r:.80}"
        )
    checked = []
    for i, words in enumerate(stop_words_list):
        if not isinstance(words, (list, tuple)) or not all(
            isinstance(w, (list, tuple)) and w and all(is_int(t) and 0 <= t < vocab_size for t in w) for w in words
        ):
            raise ValueError(
                f"stop_words_list[{i}] must be a list of non-empty sequences of token ids in "
                f"[0, {vocab_size}), got {words!r:.80}"
            )
        checked.append([tuple(w) for w in words])
    return checked


@dataclass
class CheckedRequest:
    """A batch that passed `check_request`: ids on the CPU, the table in the engine dtype, one task per request, and
    the table row each id reads (`prompt_table.rows_read`; meaningful where the id is a fake one)."""

    ids: list[torch.Tensor]  # [L_i] int64 each
    table: torch.Tensor | None  # [rows, H] in the engine dtype, or None without images
    tasks: list[int]  # [B]
    task_vocab_size: int  # rows per task block (0 without a table)
    vocab_size: int
    rows: list[torch.Tensor]  # [L_i] each
    stop_words: list[list[tuple[int, ...]]] | None = None  # per request, its stop sequences
    extra_ids: list[list[int]] | None = None  # per request, TensorRT-LLM's input_token_extra_ids: one per id
    picture_hashes: list[list[bytes]] | None = None  # per request, one hash per run of fake ids (a picture)

    def rows_read(self, i: int) -> torch.Tensor:
        """The table rows request i reads, in the order of its fake ids: [n]."""
        return self.rows[i][self.ids[i] >= self.vocab_size]

    def own_tables(self) -> torch.Tensor:
        """Each request's own table (in-flight batching): the rows from its task's first row up to the last it reads,
        zero-padded to the longest: [B, rows, H]; request i's fake ids then index table i from row 0."""
        starts = [task * self.task_vocab_size for task in self.tasks]
        needed = [
            int(self.rows_read(i).max()) + 1 - start if len(self.rows_read(i)) else 0 for i, start in enumerate(starts)
        ]
        tables = self.table.new_zeros(len(self.ids), max(max(needed), 1), self.table.shape[1])  # [B, R, H]
        for i, (start, n) in enumerate(zip(starts, needed)):
            tables[i, :n] = self.table[start : start + n]
        return tables


def check_spans_hold_fake_ids(requests, vocab_size: int) -> None:
    """Refuse image spans that still hold a picture's path: an engine sees pictures only through a prompt table."""
    for i, ids in enumerate(requests):
        if not bool((ids == IMAGE_START_ID).any()):
            continue
        if any(bool((ids[a + 1 : b] < vocab_size).any()) for _, a, b in locate_img_pos(ids, span=None).tolist()):
            raise ValueError(
                f"request {i} holds an image span with the picture's path, which only the original model reads (an "
                "engine would embed the path bytes as text): encode the picture with the vision tower, replace the span "
                "with fake ids and pass a prompt_table (single_table_batch / per_request_tables, or QWenInfer.qwen_infer)"
            )


def picture_hash_bytes(value, where: str) -> bytes:
    """A picture's hash as bytes: bytes or a str as given (a hex digest, a name), an int >= 0 by its big-endian bytes."""
    if isinstance(value, (bytes, bytearray)) and value:
        return bytes(value)
    if isinstance(value, str) and value:
        return value.encode()
    if is_int(value) and value >= 0:
        return int(value).to_bytes(max(1, (int(value).bit_length() + 7) // 8), "big")
    raise ValueError(f"{where} must be a picture's hash: non-empty bytes or str, or an int >= 0; got {value!r:.80}")


def check_reuse_keys(ids: list[torch.Tensor], vocab_size: int, input_token_extra_ids, multimodal_hashes):
    """What KV-cache reuse may key a batch's blocks by, checked: TensorRT-LLM's input_token_extra_ids (per request one
    int in [0, 2**64) per id) and multimodal_hashes (per request one hash per run of fake ids, a picture's span, in
    order), as (extra ids, hashes as bytes), each None when not given."""
    extra = hashes = None
    if input_token_extra_ids is not None:
        if not isinstance(input_token_extra_ids, (list, tuple)) or len(input_token_extra_ids) != len(ids):
            raise ValueError(
                f"input_token_extra_ids must hold one list of extra ids per request ({len(ids)}), as TensorRT-LLM's "
                f"ModelRunnerCpp.generate takes them; got {input_token_extra_ids!r:.80}"
            )
        extra = []
        for i, (seq, given) in enumerate(zip(ids, input_token_extra_ids)):
            values = given.tolist() if isinstance(given, torch.Tensor) else given
            if not isinstance(values, (list, tuple)) or len(values) != len(seq):
                raise ValueError(
                    f"input_token_extra_ids[{i}] must hold one extra id per input id ({len(seq)}): 0 for text, the "
                    f"same id > 0 for the same picture's fake ids; got {given!r:.80}"
                )
            if not all(is_int(x) and 0 <= x < 2**64 for x in values):
                bad = next(x for x in values if not (is_int(x) and 0 <= x < 2**64))
                raise ValueError(f"input_token_extra_ids[{i}] holds {bad!r}: extra ids are ints in [0, 2**64)")
            extra.append([int(x) for x in values])
    if multimodal_hashes is not None:
        if not isinstance(multimodal_hashes, (list, tuple)) or len(multimodal_hashes) != len(ids):
            raise ValueError(
                f"multimodal_hashes must hold one list of picture hashes per request ({len(ids)}); "
                f"got {multimodal_hashes!r:.80}"
            )
        hashes = []
        for i, (seq, given) in enumerate(zip(ids, multimodal_hashes)):
            runs = len(fake_id_runs(seq, vocab_size))
            if not isinstance(given, (list, tuple)) or len(given) != runs:
                raise ValueError(
                    f"multimodal_hashes[{i}] must hold one hash per picture of request {i} (its runs of fake ids: "
                    f"{runs}), in order; got {given!r:.80}"
                )
            hashes.append([picture_hash_bytes(h, f"multimodal_hashes[{i}][{k}]") for k, h in enumerate(given)])
    return extra, hashes


def check_limits(build: BuildConfig, ids: list[torch.Tensor], max_new_tokens, num_beams) -> None:
    """Refuse a batch past what the engine was built for: requests, input ids, input + new ids, beams."""
    if len(ids) > build.max_batch_size:
        raise ValueError(
            f"{len(ids)} requests but the engine was built with max_batch_size {build.max_batch_size}: send at most "
            "that many at once, or rebuild with a larger BuildConfig.max_batch_size"
        )
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    if check_int("num_beams", num_beams, 1) > build.max_beam_width:
        raise ValueError(
            f"num_beams {num_beams!r} is outside 1…{build.max_beam_width}, the engine's max_beam_width; "
            "rebuild with BuildConfig(max_beam_width=…) for wider beam search"
        )
    for i, seq in enumerate(ids):
        if len(seq) > build.max_input_len:
            raise ValueError(
                f"request {i} has {len(seq)} input ids but the engine's max_input_len is {build.max_input_len}: "
                "shorten the prompt (fewer pictures or history turns) or rebuild with a larger max_input_len"
            )
        room = room_for_answer(build.max_seq_len, len(seq))
        if max_new_tokens > room:
            raise ValueError(
                f"request {i}: {len(seq)} input ids + max_new_tokens {max_new_tokens} exceed the engine's max_seq_len "
                f"{build.max_seq_len}; ask for at most {room} new tokens "
                "(generate_for_qwenvl clamps it for you, as run.py does)"
            )


def check_request(  # noqa: PLR0913 — an engine's limits and sizes, then TensorRT-LLM's generate inputs
    build: BuildConfig,
    vocab_size: int,
    hidden_size: int,
    batch_input_ids,
    prompt_table=None,
    prompt_tasks=None,
    task_vocab_size=None,
    max_new_tokens=64,
    num_beams=1,
    end_id=-1,
    pad_id=0,
    in_flight: bool = False,
    path_spans: bool = False,
    stop_words_list=None,
    input_token_extra_ids=None,
    multimodal_hashes=None,
) -> CheckedRequest:
    """Check a batch against an engine built with `build` (its vocabulary and hidden sizes given) before it runs.

    in_flight=False: the batch shares one table of at most max_prompt_embedding_table_size rows (the engine's
    ModelRunner, run.py's Python session). in_flight=True: each request gets its own table of at most
    max_prompt_embedding_table_size / max_batch_size rows (ModelRunnerCpp's in-flight batching). path_spans=True: image
    spans may hold a picture's path (a runner that reads pictures itself). stop_words_list: TensorRT-LLM's, one list of
    token-id sequences per request. input_token_extra_ids and multimodal_hashes: what KV-cache reuse may key blocks
    by (`check_reuse_keys`); a runner without a cache ignores them.
    """
    ids = as_id_list(batch_input_ids)
    check_limits(build, ids, max_new_tokens, num_beams)
    check_int("end_id", end_id, -1, vocab_size - 1)  # end_id -1: never stop
    check_int("pad_id", pad_id, 0, vocab_size - 1)
    table, tasks, tvs, ends, where = _table_of(
        build, vocab_size, hidden_size, ids, prompt_table, prompt_tasks, task_vocab_size
    )
    rows = [rows_read(seq[None], torch.tensor([task]), tvs, vocab_size)[0] for seq, task in zip(ids, tasks)]
    for i, seq in enumerate(ids):
        if table is not None:
            check_rows_read(i, seq, rows[i], vocab_size, table, ends[i], where[i])
        elif bool((seq >= vocab_size).any()):
            k = int(torch.nonzero(seq >= vocab_size)[0])
            raise ValueError(
                f"request {i} holds id {int(seq[k])} at position {k}, past the vocabulary (vocab_size {vocab_size}): "
                "a fake prompt id needs a prompt_table (see ptuning_setup), other ids are invalid"
            )
    if not path_spans:
        check_spans_hold_fake_ids(ids, vocab_size)
    stop_words = check_stop_words(stop_words_list, len(ids), vocab_size)
    extra_ids, picture_hashes = check_reuse_keys(ids, vocab_size, input_token_extra_ids, multimodal_hashes)
    checked = CheckedRequest(ids, table, tasks, tvs, vocab_size, rows, stop_words, extra_ids, picture_hashes)
    if table is not None and in_flight:
        size, batch = build.max_prompt_embedding_table_size, build.max_batch_size
        block = f"max_prompt_embedding_table_size / max_batch_size = {size} / {batch}"
        check_rows_per_request(checked.own_tables().shape[1], build.rows_per_request, block)
    elif table is not None and table.shape[0] > build.max_prompt_embedding_table_size:
        raise ValueError(
            f"the prompt table has {table.shape[0]} rows but the engine holds at most max_prompt_embedding_table_size "
            f"= {build.max_prompt_embedding_table_size} rows; send fewer pictures, or rebuild with {TABLE_SIZE_RULE}"
        )
    return checked


def _table_of(build: BuildConfig, vocab_size: int, hidden_size: int, ids, prompt_table, prompt_tasks, task_vocab_size):
    """(table [rows, H] or None, tasks, task_vocab_size, the row each request may not reach, what those rows are)."""
    none = (None, [0] * len(ids), 0, [0] * len(ids), [""] * len(ids))
    if prompt_table is None:
        if prompt_tasks is not None or task_vocab_size is not None:
            raise ValueError("prompt_tasks / task_vocab_size were given without a prompt_table")
        return none
    if build.max_prompt_embedding_table_size == 0:
        raise ValueError(
            "this engine was built with max_prompt_embedding_table_size=0, so it has no prompt-table input and cannot "
            "see images (the flag article 2's trtllm-build command leaves out; TensorRT-LLM issue #1300). Rebuild with "
            f"max_prompt_embedding_table_size = {TABLE_SIZE_RULE}"
        )
    table = runtime_prompt_table(prompt_table, hidden_size, build.dtype)
    if table.dim() == 3:  # one table per task: [tables, rows, H]
        num_tables, tvs = table.shape[0], table.shape[1]
        if task_vocab_size is not None and one_int(task_vocab_size, "task_vocab_size") != tvs:
            raise ValueError(
                f"a [tables, rows, H] prompt_table has task_vocab_size = rows = {tvs}; "
                f"task_vocab_size {task_vocab_size!r} disagrees (leave it out)"
            )
        if prompt_tasks is None and num_tables not in (1, len(ids)):
            raise ValueError(f"{num_tables} tables for {len(ids)} requests: say which is whose with prompt_tasks")
        default = [0] * len(ids) if num_tables == 1 else list(range(len(ids)))
        tasks = default if prompt_tasks is None else parse_tasks(prompt_tasks, len(ids), "prompt_tasks", num_tables)
        where = [
            f"its own table (task {t}) has {tvs} rows; with one table per request each request's fake ids restart at "
            "vocab_size (build them with per_request_tables)"
            for t in tasks
        ]
        return table.reshape(-1, hidden_size), tasks, tvs, [(t + 1) * tvs for t in tasks], where
    # one flat table (run.py's session): rows (id - V) + task · task_vocab_size
    tvs = table.shape[0] if task_vocab_size is None else one_int(task_vocab_size, "task_vocab_size", 0, INT32_MAX)
    if tvs == 0:
        # TensorRT-LLM's inputs for requests without pictures: a one-row table that no id reads (run.py and
        # ModelRunner leave it uninitialised), task_vocab_size 0
        if prompt_tasks is not None:
            parse_tasks(prompt_tasks, len(ids), "prompt_tasks", 1)
        if any(bool((seq >= vocab_size).any()) for seq in ids):
            raise ValueError(
                "task_vocab_size must be >= 1 (rows per task), got 0; 0 goes only with requests that hold no fake ids "
                "(a placeholder table for requests without pictures)"
            )
        return none
    num_tables = -(-len(table) // tvs)
    tasks = [0] * len(ids) if prompt_tasks is None else parse_tasks(prompt_tasks, len(ids), "prompt_tasks", num_tables)
    where = [table_size(table, t, tvs) for t in tasks]
    return table, tasks, tvs, [len(table)] * len(ids), where


def build_outputs(ids: list[torch.Tensor], new_ids, generated, pad_id: int, max_new_tokens: int, return_dict: bool):
    """The runners' outputs: output_ids [B, beams, max input + max_new_tokens] — each row the request's ids, its new
    tokens (new_ids [B, beams, t], the first generated [B, beams] of them), then pad_id — and, with return_dict,
    sequence_lengths [B, beams]."""
    b, beams = new_ids.shape[:2]
    width = max(len(seq) for seq in ids) + max_new_tokens
    output_ids = torch.full((b, beams, width), pad_id, dtype=torch.int32, device=new_ids.device)
    for r, seq in enumerate(ids):
        output_ids[r, :, : len(seq)] = seq.to(torch.int32)
        for j in range(beams):
            n = int(generated[r, j])
            output_ids[r, j, len(seq) : len(seq) + n] = new_ids[r, j, :n].to(torch.int32)
    if not return_dict:
        return output_ids
    lengths = torch.tensor([[len(seq)] for seq in ids], device=new_ids.device) + generated
    return {"output_ids": output_ids, "sequence_lengths": lengths.to(torch.int32)}


def new_tokens(outputs: dict, request: int, input_len: int, beam: int = 0) -> list[int]:
    """The ids a runner generated for one request (beam `beam`), the end id that stopped it included: its row of
    output_ids from `input_len` (the request's length) up to its sequence length (run.py slices output_ids alike)."""
    return outputs["output_ids"][request, beam, input_len : int(outputs["sequence_lengths"][request, beam])].tolist()


class Runner:
    """TensorRT-LLM's `generate` contract, the same for every runner. A runner sets `build_config` (its limits),
    `vocab_size`, `hidden_size`, `dtype` (a prompt table's), `max_input_len`, `max_seq_len`, `max_request_rows` (the
    table rows one request may read) and `turn` (its OneGeneration), and writes `steps`: the new tokens of a checked
    request."""

    in_flight = False  # True: each request gets its own table of rows_per_request rows (ModelRunnerCpp)
    path_spans = False  # True: image spans may hold a picture's path (a runner that reads pictures itself)

    @property
    def busy(self) -> bool:
        """True while a generation runs or a streaming generation is open."""
        return self.turn.busy

    def check_request(  # noqa: PLR0913 — generate's inputs, as check_request takes them
        self,
        batch_input_ids,
        prompt_table=None,
        prompt_tasks=None,
        task_vocab_size=None,
        max_new_tokens: int = 64,
        sampling: SamplingConfig = SamplingConfig(),
        stop_words_list=None,
        input_token_extra_ids=None,
        multimodal_hashes=None,
    ) -> CheckedRequest:
        """The batch checked against this runner's limits, vocabulary and hidden size (`check_request`)."""
        return check_request(
            self.build_config,
            self.vocab_size,
            self.hidden_size,
            batch_input_ids,
            prompt_table,
            prompt_tasks,
            task_vocab_size,
            max_new_tokens,
            sampling.num_beams,
            sampling.end_id,
            sampling.pad_id,
            self.in_flight,
            self.path_spans,
            stop_words_list,
            input_token_extra_ids,
            multimodal_hashes,
        )

    def generate(  # noqa: PLR0913 — TensorRT-LLM's ModelRunner.generate keywords, as the course teaches them
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
        length_penalty: float = 1.0,
        early_stopping=False,
        random_seed=None,
        streaming: bool = False,
        return_dict: bool = False,
        task_vocab_size=None,
        repetition_penalty: float = 1.0,
        stop_words_list=None,
        input_token_extra_ids=None,
        multimodal_hashes=None,
    ):
        """Generate for a batch of requests (list of 1-D ids): output_ids [B, beams, max input + max_new_tokens].

        Each row holds the request's ids, then its new tokens (the end_id or stop word that stopped it included), then
        pad_id. prompt_table, as TensorRT-LLM's runners take it: [rows, H] (with prompt_tasks "0,0,…" and
        task_vocab_size) or [tables, rows, H] (task_vocab_size = rows; tasks default to table r for request r, or
        table 0 when there is one). The sampling knobs are SamplingConfig's. stop_words_list (one list of token-id
        sequences per request) stops a request once its new tokens end with one of them. streaming=True returns a
        GenerationStream of the same outputs after every step; return_dict=True gives {"output_ids",
        "sequence_lengths"}. input_token_extra_ids (TensorRT-LLM's: per request one extra id per input id, 0 for text)
        and multimodal_hashes (per request one hash per picture) are what a runner with KV-cache reuse may key its
        blocks by (engine.ModelRunner's kv_cache_key); runners without a cache check and ignore them. Threads may share a runner: a call waits for the generation running (one at a time), and
        is refused while a streaming generation is open. On a tensor-parallel rank other than 0 it returns None.
        """
        sampling = SamplingConfig(
            end_id=end_id,
            pad_id=pad_id,
            num_beams=num_beams,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            random_seed=random_seed,
            repetition_penalty=repetition_penalty,
        )
        request = self.check_request(
            batch_input_ids,
            prompt_table,
            prompt_tasks,
            task_vocab_size,
            max_new_tokens,
            sampling,
            stop_words_list,
            input_token_extra_ids,
            multimodal_hashes,
        )
        self.turn.begin(streaming)  # threads wait their turn; refused while a stream is open
        stream = None
        try:
            steps = self.steps(request, max_new_tokens, sampling, streaming)
            if steps is None:  # a rank that gets no outputs (tensor parallelism)
                return None

            def outputs(step):
                return build_outputs(request.ids, *step, sampling.pad_id, max_new_tokens, return_dict)

            if streaming:
                stream = GenerationStream(steps, outputs, self.turn)
                return stream
            return outputs(deque(steps, maxlen=1)[0])  # run every step, keep the last one's tokens
        finally:
            if stream is None:  # else the stream frees the runner when it ends
                self.turn.end()

    def steps(self, request: CheckedRequest, max_new_tokens: int, sampling: SamplingConfig, streaming: bool):
        """The new tokens of a checked request, as (new_ids [B, beams, t], generated [B, beams]) after each step
        (or only the last), or None on a rank that gets no outputs."""
        raise NotImplementedError


BUSY = "a streaming generation still holds this runner's KV cache: exhaust it or close() it first"


class OneGeneration:
    """One generation at a time on a runner, whose KV cache (or TensorRT-LLM session) holds one batch: a call from
    another thread waits until the running generation ends; while a streaming generation is open — until it is
    exhausted, closed or dropped — every other call is refused at once, since nothing bounds how long it stays open."""

    def __init__(self):
        self._changed = threading.Condition()
        self._running = self._streaming = False

    @property
    def busy(self) -> bool:
        """True while a generation runs or a stream is open."""
        return self._running

    def begin(self, streaming: bool = False) -> None:
        """Take the runner (waiting for a generation that runs, refusing while a stream is open)."""
        with self._changed:
            while self._running:
                if self._streaming:
                    raise RuntimeError(BUSY)
                self._changed.wait()
            self._running, self._streaming = True, streaming

    def end(self) -> None:
        """Give the runner back."""
        with self._changed:
            self._running = self._streaming = False
            self._changed.notify_all()


class GenerationStream:
    """A streaming generation: iterating gives the outputs after every token. It holds its runner until it is
    exhausted, closed (`close()`, leaving a `with` block) or dropped (a `for` loop broken out of, a function that
    returned), whichever comes first."""

    def __init__(self, steps, to_outputs, turn: OneGeneration):
        self.steps, self.to_outputs, self.turn = steps, to_outputs, turn  # turn: taken (begin) by the caller

    def __iter__(self):
        return self

    def __next__(self):
        if self.steps is None:
            raise StopIteration
        try:
            step = next(self.steps)
        except BaseException:  # exhausted, or failed: the runner is free either way
            self.close()
            raise
        return self.to_outputs(step)

    def close(self) -> None:
        """Stop the generation now and free the runner (idempotent)."""
        if self.steps is not None:
            steps, self.steps = self.steps, None
            try:
                if hasattr(steps, "close"):
                    steps.close()
            finally:
                self.turn.end()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
