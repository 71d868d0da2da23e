"""Requests — one check of a batch of requests against an engine, shared by the engine's runner and TRTLLMRunner.

A request is a 1-D tensor of token ids; ids >= vocab_size are fake prompt ids that read the prompt table. Every
limit fixed at build time, every id, the table's shape, dtype and values, and the tasks are checked here, before
any cast or kernel sees them, so that both runners refuse the same inputs with the same messages. Both runners serve
one generation at a time (`OneGeneration`) and stream the same way (`GenerationStream`).
"""

import math
import threading
from dataclasses import dataclass

import torch

from .fake_ids import check_spans_hold_fake_ids
from .limits import BuildConfig
from .prompt_table import runtime_prompt_table


def as_id_list(batch_input_ids) -> list[torch.Tensor]:
    """batch_input_ids as a list of 1-D int64 tensors (a [B, L] tensor is split by row), each id >= 0."""
    if isinstance(batch_input_ids, torch.Tensor):
        batch_input_ids = list(batch_input_ids) if batch_input_ids.dim() == 2 else [batch_input_ids]
    if not isinstance(batch_input_ids, (list, tuple)) or not batch_input_ids:
        raise ValueError("batch_input_ids must be a non-empty list of 1-D token-id tensors, one per request")
    ids = []
    for i, seq in enumerate(batch_input_ids):
        try:
            seq = torch.as_tensor(seq)
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            raise ValueError(f"request {i}: not a 1-D sequence of token ids that fit in int64 ({err})") from None
        if (
            seq.dim() != 1
            or seq.numel() == 0
            or seq.dtype.is_floating_point
            or seq.dtype.is_complex
            or seq.dtype == torch.bool
        ):
            raise ValueError(
                f"request {i}: expected a non-empty 1-D tensor of token ids, got {seq.dtype} {tuple(seq.shape)}"
            )
        seq = seq.long()
        negative = torch.nonzero(seq < 0)
        if len(negative):
            k = int(negative[0])
            raise ValueError(f"request {i}: token ids must be non-negative, got {int(seq[k])} at position {k}")
        ids.append(seq)
    return ids


def parse_tasks(prompt_tasks, batch_size: int, num_tables: int) -> list[int]:
    """Task ids from "0,1,…" or a sequence / tensor of ints: one per request, each naming one of `num_tables` tables."""
    if isinstance(prompt_tasks, str):
        try:
            tasks = [int(t) for t in prompt_tasks.split(",")]
        except ValueError:
            raise ValueError(
                f'prompt_tasks must be a comma-separated list of integers like "0,1", got {prompt_tasks!r}'
            ) from None
    else:
        try:
            values = torch.as_tensor(prompt_tasks).reshape(-1)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise TypeError(
                f'prompt_tasks must be a string like "0,1" or a sequence of ints, got {prompt_tasks!r}'
            ) from None
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise TypeError(f"prompt_tasks must hold integers, got {values.dtype}")
        tasks = values.tolist()
    if len(tasks) != batch_size:
        raise ValueError(f"{len(tasks)} prompt_tasks for {batch_size} requests: give one task per request")
    if any(not 0 <= t < num_tables for t in tasks):
        raise ValueError(f"prompt_tasks {tasks} must each name one of the {num_tables} tables (0…{num_tables - 1})")
    return tasks


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_greedy(top_k: int, top_p: float) -> bool:
    """True when the knobs mean greedy decoding: top_k 1, or top_k 0 with top_p 0 (TensorRT-LLM's rule)."""
    return top_k == 1 or (top_k == 0 and top_p == 0.0)


def check_sampling(
    temperature=1.0, top_k=1, top_p=0.0, length_penalty=1.0, random_seed=None, repetition_penalty=1.0
) -> bool:
    """Check the sampling knobs; True when they mean greedy (top_k 1, or top_k 0 with top_p 0, as in TensorRT-LLM)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature must be a number > 0 (and finite), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = no top-k limit, 1 = greedy), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 <= top_p <= 1.0:
        raise ValueError(f"top_p must be a number in [0, 1] (0 with top_k 0 = greedy), got {top_p!r}")
    if (
        isinstance(length_penalty, bool)
        or not isinstance(length_penalty, (int, float))
        or not math.isfinite(length_penalty)
    ):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if (
        isinstance(repetition_penalty, bool)
        or not isinstance(repetition_penalty, (int, float))
        or not (0 < repetition_penalty < math.inf)
    ):
        raise ValueError(f"repetition_penalty must be a number > 0 (1: off), got {repetition_penalty!r}")
    if random_seed is not None and (
        isinstance(random_seed, bool) or not isinstance(random_seed, int) or not 0 <= random_seed < 2**63
    ):
        raise TypeError(f"random_seed must be None or an int in [0, 2**63), got {random_seed!r}")
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
            isinstance(w, (list, tuple)) and w and all(_is_int(t) and 0 <= t < vocab_size for t in w) for w in words
        ):
            raise ValueError(
                f"stop_words_list[{i}] must be a list of non-empty sequences of token ids in "
                f"[0, {vocab_size}), got {words!r:.80}"
            )
        checked.append([tuple(w) for w in words])
    return checked


@dataclass
class CheckedRequest:
    """A batch that passed `check_request`: ids on the CPU, the table in the engine dtype, one task per request.

    Request i reads table row (id - vocab_size) + tasks[i] × task_vocab_size for each of its fake ids.
    """

    ids: list[torch.Tensor]  # [L_i] int64 each
    table: torch.Tensor | None  # [rows, H] in the engine dtype, or None without images
    tasks: list[int]  # [B]
    task_vocab_size: int  # rows per task block (0 without a table)
    vocab_size: int

    def rows_read(self, i: int) -> torch.Tensor:
        """The table rows request i reads, in the order of its fake ids: [n]."""
        ids = self.ids[i]
        return ids[ids >= self.vocab_size] - self.vocab_size + self.tasks[i] * self.task_vocab_size

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
) -> CheckedRequest:
    """Check a batch against an engine built with `build` (its vocabulary and hidden sizes given) before it runs.

    in_flight=False: the batch shares one table of at most max_prompt_embedding_table_size rows (the engine's
    ModelRunner, run.py's Python session). in_flight=True: each request gets its own table of at most
    max_prompt_embedding_table_size / max_batch_size rows (ModelRunnerCpp's in-flight batching).
    """
    ids = as_id_list(batch_input_ids)
    if len(ids) > build.max_batch_size:
        raise ValueError(
            f"{len(ids)} requests but the engine was built with max_batch_size {build.max_batch_size}: send at most "
            "that many at once, or rebuild with a larger BuildConfig.max_batch_size"
        )
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not _is_int(num_beams) or not 1 <= num_beams <= build.max_beam_width:
        raise ValueError(
            f"num_beams {num_beams!r} is outside 1…{build.max_beam_width}, the engine's max_beam_width; "
            "rebuild with BuildConfig(max_beam_width=…) for wider beam search"
        )
    for name, value, low in (("end_id", end_id, -1), ("pad_id", pad_id, 0)):  # end_id -1: never stop
        if not _is_int(value) or not low <= value < vocab_size:
            raise ValueError(f"{name} must be an int in [{low}, {vocab_size}), got {value!r}")
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
    if prompt_table is None:
        if prompt_tasks is not None or task_vocab_size is not None:
            raise ValueError("prompt_tasks / task_vocab_size were given without a prompt_table")
        for i, seq in enumerate(ids):
            fake = torch.nonzero(seq >= vocab_size)
            if len(fake):
                k = int(fake[0])
                raise ValueError(
                    f"request {i} holds id {int(seq[k])} at position {k}, past the vocabulary (vocab_size "
                    f"{vocab_size}): a fake prompt id needs a prompt_table (see ptuning_setup), other ids are invalid"
                )
        check_spans_hold_fake_ids(ids, vocab_size)
        return CheckedRequest(ids, None, [0] * len(ids), 0, vocab_size)
    if build.max_prompt_embedding_table_size == 0:
        raise ValueError(
            "this engine was built with max_prompt_embedding_table_size=0, so it has no prompt-table input and cannot "
            "see images (the flag article 2's trtllm-build command leaves out; TensorRT-LLM issue #1300). Rebuild with "
            "max_prompt_embedding_table_size = 256 × images per request × max_batch_size"
        )
    table = runtime_prompt_table(prompt_table, hidden_size, build.dtype)
    if table.dim() == 3:  # one table per task: [tables, rows, H]
        num_tables, tvs = table.shape[0], table.shape[1]
        if task_vocab_size is not None and _scalar(task_vocab_size, "task_vocab_size") != tvs:
            raise ValueError(
                f"a [tables, rows, H] prompt_table has task_vocab_size = rows = {tvs}; "
                f"task_vocab_size {task_vocab_size!r} disagrees (leave it out)"
            )
        if prompt_tasks is None and num_tables not in (1, len(ids)):
            raise ValueError(f"{num_tables} tables for {len(ids)} requests: say which is whose with prompt_tasks")
        default = [0] * len(ids) if num_tables == 1 else list(range(len(ids)))
        table = table.reshape(-1, hidden_size)  # [tables · rows, H]
    else:  # one flat table (run.py's session): rows (id - V) + task · task_vocab_size
        tvs = table.shape[0] if task_vocab_size is None else _scalar(task_vocab_size, "task_vocab_size")
        if tvs == 0 and not any(bool((seq >= vocab_size).any()) for seq in ids):
            # TensorRT-LLM's inputs for requests without pictures: a one-row table that no id reads (run.py and
            # ModelRunner leave it uninitialised), task_vocab_size 0
            if prompt_tasks is not None:
                parse_tasks(prompt_tasks, len(ids), 1)
            check_spans_hold_fake_ids(ids, vocab_size)
            return CheckedRequest(ids, None, [0] * len(ids), 0, vocab_size)
        if tvs < 1:
            raise ValueError(
                f"task_vocab_size must be >= 1 (rows per task), got {tvs}; 0 goes only with requests that hold no "
                "fake ids (a placeholder table for requests without pictures)"
            )
        num_tables, default = -(-table.shape[0] // tvs), [0] * len(ids)
    tasks = default if prompt_tasks is None else parse_tasks(prompt_tasks, len(ids), num_tables)
    checked = CheckedRequest(ids, table, tasks, tvs, vocab_size)
    per_task = prompt_table.dim() == 3
    for i, seq in enumerate(ids):
        fake = torch.nonzero(seq >= vocab_size)[:, 0]
        rows = seq[fake] - vocab_size  # [n]: rows from the start of the request's block
        past = torch.nonzero(rows >= (tvs if per_task else table.shape[0] - tasks[i] * tvs))
        if len(past):
            k = int(fake[past[0]])
            where = (
                f"its own table (task {tasks[i]}) has {tvs} rows; with one table per request each request's fake "
                "ids restart at vocab_size (build them with per_request_tables)"
                if per_task
                else f"the table has {table.shape[0]} rows (task {tasks[i]} starts at row {tasks[i] * tvs})"
            )
            raise ValueError(
                f"request {i}: id {int(seq[k])} at position {k} reads prompt-table row "
                f"{int(seq[k]) - vocab_size + tasks[i] * tvs}, but {where}; ids must lie in "
                f"[0, vocab_size + table rows)"
            )
    check_spans_hold_fake_ids(ids, vocab_size)
    if in_flight:
        rows = checked.own_tables().shape[1]
        if rows > build.rows_per_request:
            raise ValueError(
                f"a request's table has {rows} rows, but this engine allows max_prompt_embedding_table_size / "
                f"max_batch_size = {build.max_prompt_embedding_table_size} / {build.max_batch_size} = "
                f"{build.rows_per_request} rows per request ({build.rows_per_request // 256} image(s)); send fewer "
                "images per request or rebuild with a larger table"
            )
    elif table.shape[0] > build.max_prompt_embedding_table_size:
        raise ValueError(
            f"the prompt table has {table.shape[0]} rows but the engine holds at most max_prompt_embedding_table_size "
            f"= {build.max_prompt_embedding_table_size} ({build.max_prompt_embedding_table_size // 256} images of 256 "
            "rows); send fewer images, or rebuild with 256 × images per request × max_batch_size"
        )
    bad = torch.nonzero(~torch.isfinite(table).all(dim=-1))
    if len(bad):
        raise ValueError(
            f"prompt-table row {int(bad[0])} holds NaN or infinity: the image features are broken "
            "(check the vision tower's output for that picture)"
        )
    return checked


def _scalar(value, name: str) -> int:
    """An int from an int or a one-element tensor / sequence (run.py passes task_vocab_size as a tensor [1])."""
    try:
        flat = torch.as_tensor(value).reshape(-1)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise TypeError(f"{name} must be an int or a one-element tensor, got {value!r}") from None
    if flat.numel() != 1 or flat.dtype.is_floating_point or flat.dtype == torch.bool:
        raise TypeError(f"{name} must be an int or a one-element integer tensor, got {value!r}")
    return int(flat[0])


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
