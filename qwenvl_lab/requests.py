"""Requests — one check of a batch of requests against an engine, shared by the engine's runner and TRTLLMRunner.

A request is a 1-D tensor of token ids; ids >= vocab_size are fake prompt ids that read the prompt table. Every
limit fixed at build time, every id, the table's shape, dtype and values, and the tasks are checked here, before
any cast or kernel sees them, so that both runners refuse the same inputs with the same messages. Both runners serve
one generation at a time (`OneGeneration`) and stream the same way (`GenerationStream`).
"""

import threading
from dataclasses import dataclass

import torch

from .checks.tensors import INT32_MAX, as_id_list, check_rows_read, one_int, parse_tasks
from .checks.values import check_choice, check_int, check_number, is_int
from .img_pos import locate_img_pos
from .limits import BuildConfig
from .prompt_table import runtime_prompt_table, table_rows, table_size
from .tokenizing import IMAGE_START_ID


def is_greedy(top_k: int, top_p: float) -> bool:
    """True when the knobs mean greedy decoding: top_k 1, or top_k 0 with top_p 0 (TensorRT-LLM's rule)."""
    return top_k == 1 or (top_k == 0 and top_p == 0.0)


def check_sampling(
    temperature=1.0,
    top_k=1,
    top_p=0.0,
    length_penalty=1.0,
    random_seed=None,
    repetition_penalty=1.0,
    early_stopping=False,
) -> bool:
    """Check the sampling knobs; True when they mean greedy (top_k 1, or top_k 0 with top_p 0, as in TensorRT-LLM)."""
    check_number("temperature", temperature, 0, open_minimum=True)
    check_int("top_k", top_k, 0)
    check_number("top_p", top_p, 0, 1)
    check_number("length_penalty", length_penalty)
    check_number("repetition_penalty", repetition_penalty, 0, open_minimum=True)
    check_choice("early_stopping", early_stopping, (True, False, "never"))
    if random_seed is not None:
        check_int("random_seed", random_seed, 0, 2**63 - 1)
    return is_greedy(top_k, top_p)


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
    the table row each id reads (`prompt_table.table_rows`; meaningful where the id is a fake one)."""

    ids: list[torch.Tensor]  # [L_i] int64 each
    table: torch.Tensor | None  # [rows, H] in the engine dtype, or None without images
    tasks: list[int]  # [B]
    task_vocab_size: int  # rows per task block (0 without a table)
    vocab_size: int
    rows: list[torch.Tensor]  # [L_i] each

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
        if any(bool((ids[a + 1 : b] < vocab_size).any()) for _, a, b in locate_img_pos(ids).tolist()):
            raise ValueError(
                f"request {i} holds an image span with the picture's path, which only the original model reads (an "
                "engine would embed the path bytes as text): encode the picture with the vision tower, replace the span "
                "with fake ids and pass a prompt_table (single_table_batch / per_request_tables, or QWenInfer.qwen_infer)"
            )


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
        if len(seq) + max_new_tokens > build.max_seq_len:
            raise ValueError(
                f"request {i}: {len(seq)} input ids + max_new_tokens {max_new_tokens} exceed the engine's max_seq_len "
                f"{build.max_seq_len}; ask for at most {build.max_seq_len - len(seq)} new tokens "
                "(generate_for_qwenvl clamps it for you, as run.py does)"
            )


def check_request(
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
) -> CheckedRequest:
    """Check a batch against an engine built with `build` (its vocabulary and hidden sizes given) before it runs.

    in_flight=False: the batch shares one table of at most max_prompt_embedding_table_size rows (the engine's
    ModelRunner, run.py's Python session). in_flight=True: each request gets its own table of at most
    max_prompt_embedding_table_size / max_batch_size rows (ModelRunnerCpp's in-flight batching). path_spans=True: image
    spans may hold a picture's path (a runner that reads pictures itself).
    """
    ids = as_id_list(batch_input_ids)
    check_limits(build, ids, max_new_tokens, num_beams)
    check_int("end_id", end_id, -1, vocab_size - 1)  # end_id -1: never stop
    check_int("pad_id", pad_id, 0, vocab_size - 1)
    table, tasks, tvs, ends, where = _table_of(
        build, vocab_size, hidden_size, ids, prompt_table, prompt_tasks, task_vocab_size
    )
    rows = [table_rows(seq[None], torch.tensor([task]), tvs, vocab_size)[0] for seq, task in zip(ids, tasks)]
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
    checked = CheckedRequest(ids, table, tasks, tvs, vocab_size, rows)
    if table is not None and in_flight:
        own = checked.own_tables().shape[1]
        if own > build.rows_per_request:
            raise ValueError(
                f"a request's table has {own} rows, but this engine allows max_prompt_embedding_table_size / "
                f"max_batch_size = {build.max_prompt_embedding_table_size} / {build.max_batch_size} = "
                f"{build.rows_per_request} rows per request ({build.rows_per_request // 256} image(s)); send fewer "
                "images per request or rebuild with a larger table"
            )
    elif table is not None and table.shape[0] > build.max_prompt_embedding_table_size:
        raise ValueError(
            f"the prompt table has {table.shape[0]} rows but the engine holds at most max_prompt_embedding_table_size "
            f"= {build.max_prompt_embedding_table_size} ({build.max_prompt_embedding_table_size // 256} images of 256 "
            "rows); send fewer images, or rebuild with 256 × images per request × max_batch_size"
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
            "max_prompt_embedding_table_size = 256 × images per request × max_batch_size"
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
