"""Step 11 — running the engine: TensorRT-LLM's ModelRunnerCpp behind our engine's `generate`, requests checked."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..fake_ids import check_spans_hold_fake_ids
from ..prompt_table import runtime_prompt_table
from ..tokenizing import IM_END_ID
from .gpu import require_gpu_stack


@dataclass(frozen=True)
class EngineConfig:
    """What the runner checks requests against, read from the engine directory's config.json."""

    vocab_size: int
    hidden_size: int
    dtype: str
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_beam_width: int
    max_prompt_embedding_table_size: int

    @property
    def rows_per_request(self) -> int:
        """Table rows one request may use: request `slot`'s table is copied to row slot × this."""
        return self.max_prompt_embedding_table_size // self.max_batch_size


def read_engine_config(engine_dir) -> EngineConfig:
    """Parse `engine_dir/config.json` (written by trtllm-build) and check the rank engines are there."""
    engine_dir = Path(engine_dir)
    config_file = engine_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{str(config_file)!r} not found; build the engine first (run_trtllm_build)")
    raw = json.loads(config_file.read_text())
    try:
        pretrained, build = raw["pretrained_config"], raw["build_config"]
        config = EngineConfig(
            vocab_size=pretrained["vocab_size"], hidden_size=pretrained["hidden_size"], dtype=pretrained["dtype"],
            tp_size=pretrained["mapping"]["tp_size"], pp_size=pretrained["mapping"].get("pp_size", 1),
            max_batch_size=build["max_batch_size"], max_input_len=build["max_input_len"],
            max_seq_len=build["max_seq_len"], max_beam_width=build.get("max_beam_width", 1),
            max_prompt_embedding_table_size=build.get("max_prompt_embedding_table_size", 0),
        )
    except KeyError as err:
        raise ValueError(
            f"{config_file} is not a TensorRT-LLM engine config (pretrained_config + build_config): missing {err}"
        ) from None
    missing = [f"rank{r}.engine" for r in range(config.tp_size * config.pp_size)
               if not (engine_dir / f"rank{r}.engine").is_file()]
    if missing:
        raise FileNotFoundError(f"{engine_dir} lacks {missing}; was trtllm-build interrupted?")
    return config


def as_id_list(batch_input_ids) -> list[torch.Tensor]:
    """batch_input_ids as a list of 1-D int32 tensors (TensorRT-LLM's form); a [B, L] tensor is split by row."""
    if isinstance(batch_input_ids, torch.Tensor):
        batch_input_ids = list(batch_input_ids) if batch_input_ids.dim() == 2 else [batch_input_ids]
    if not isinstance(batch_input_ids, (list, tuple)) or not batch_input_ids:
        raise ValueError("batch_input_ids must be a non-empty list of 1-D token-id tensors, one per request")
    ids = []
    for i, seq in enumerate(batch_input_ids):
        seq = torch.as_tensor(seq)
        if seq.dim() != 1 or seq.numel() == 0 or seq.dtype.is_floating_point or seq.dtype == torch.bool:
            raise ValueError(
                f"request {i}: expected a non-empty 1-D tensor of token ids, got {seq.dtype} {tuple(seq.shape)}")
        if (seq < 0).any():
            raise ValueError(f"request {i}: token ids must be non-negative")
        ids.append(seq.to(torch.int32))
    return ids


def parse_tasks(prompt_tasks, batch_size: int, num_tables: int) -> list[int]:
    """Task ids from "0,1,…" (one per request, each naming one of `num_tables` tables)."""
    try:
        tasks = [int(t) for t in str(prompt_tasks).split(",")]
    except ValueError:
        raise ValueError(
            f'prompt_tasks must be a comma-separated list of integers like "0,1", got {prompt_tasks!r}') from None
    if len(tasks) != batch_size:
        raise ValueError(f"{len(tasks)} prompt_tasks for {batch_size} requests: give one task per request")
    if any(not 0 <= t < num_tables for t in tasks):
        raise ValueError(f"prompt_tasks {tasks} must each name one of the {num_tables} tables (0…{num_tables - 1})")
    return tasks


class TRTLLMRunner:
    """A TensorRT-LLM engine behind our engine's `generate(...)`: per-request prompt tables, checked before the GPU."""

    def __init__(self, config: EngineConfig, session):
        self.config = config
        self.session = session  # tensorrt_llm.runtime.ModelRunnerCpp

    @classmethod
    def from_dir(cls, engine_dir, rank: int = 0, **runner_kwargs) -> "TRTLLMRunner":
        """Open `engine_dir` (trtllm-build's output) with ModelRunnerCpp (C++ executor, in-flight batching).

        KV-cache block reuse stays off (ModelRunnerCpp's default): with prompt tables it would also need
        input_token_extra_ids, since the same fake ids stand for different pictures in different requests.
        With tp_size > 1, launch one process per rank (mpirun -n tp_size) and pass rank=tensorrt_llm.mpi_rank().
        """
        config = read_engine_config(engine_dir)
        require_gpu_stack("tensorrt_llm", "cuda", step="TRTLLMRunner.from_dir")
        from tensorrt_llm.runtime import ModelRunnerCpp

        return cls(config, ModelRunnerCpp.from_dir(str(engine_dir), rank=rank, **runner_kwargs))

    def check_request(self, batch_input_ids, prompt_table=None, prompt_tasks=None, max_new_tokens: int = 64,
                      num_beams: int = 1, task_vocab_size=None):
        """Check a request against the engine: (ids, tables [tasks, rows, H] or None, prompt_tasks "0,1,…" or None)."""
        cfg = self.config
        ids = as_id_list(batch_input_ids)
        if len(ids) > cfg.max_batch_size:
            raise ValueError(f"{len(ids)} requests exceed the engine's max_batch_size {cfg.max_batch_size}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or not 1 <= num_beams <= cfg.max_beam_width:
            raise ValueError(f"num_beams {num_beams!r} is outside 1…{cfg.max_beam_width}, the engine's max_beam_width")
        for i, seq in enumerate(ids):
            if len(seq) > cfg.max_input_len or len(seq) + max_new_tokens > cfg.max_seq_len:
                raise ValueError(
                    f"request {i}: {len(seq)} input ids + {max_new_tokens} new tokens do not fit the engine "
                    f"(max_input_len {cfg.max_input_len}, max_seq_len {cfg.max_seq_len})"
                )
        check_spans_hold_fake_ids(ids, cfg.vocab_size)
        if prompt_table is None:
            if prompt_tasks is not None or task_vocab_size is not None:
                raise ValueError("prompt_tasks / task_vocab_size were given without a prompt_table")
            fake = [i for i, seq in enumerate(ids) if bool((seq >= cfg.vocab_size).any())]
            if fake:
                raise ValueError(
                    f"request {fake[0]} holds fake prompt ids (>= vocab_size {cfg.vocab_size}) but no prompt_table "
                    "was given"
                )
            return ids, None, None
        prompt_table = self._check_table(prompt_table)
        if prompt_tasks is not None and not isinstance(prompt_tasks, str):
            prompt_tasks = ",".join(str(int(t)) for t in torch.as_tensor(prompt_tasks).reshape(-1).tolist())
        rows = [seq[seq >= cfg.vocab_size].long() - cfg.vocab_size for seq in ids]  # each request's table rows
        if prompt_table.dim() == 3:  # one table per task: request i reads tables[task i] only
            tables = prompt_table
            if prompt_tasks is None and tables.shape[0] not in (1, len(ids)):
                raise ValueError(
                    f"{tables.shape[0]} tables for {len(ids)} requests: say which is whose with prompt_tasks")
            tasks = ([0] * len(ids) if tables.shape[0] == 1 else list(range(len(ids)))) if prompt_tasks is None \
                else parse_tasks(prompt_tasks, len(ids), tables.shape[0])
            for i, (r, task) in enumerate(zip(rows, tasks)):
                if len(r) and int(r.max()) >= tables.shape[1]:
                    raise ValueError(
                        f"request {i}: fake id {int(r.max()) + cfg.vocab_size} reads row {int(r.max())} of its table "
                        f"(task {task}), which has {tables.shape[1]} rows; with in-flight batching each request's fake "
                        "ids restart at vocab_size (build them with per_request_tables)"
                    )
        else:  # one flat table (run.py's session): request i reads rows (id - V) + task·task_vocab_size
            tvs = prompt_table.shape[0] if task_vocab_size is None else int(
                torch.as_tensor(task_vocab_size).reshape(-1)[0])
            if tvs < 1:
                raise ValueError(f"task_vocab_size must be >= 1 (rows per task), got {tvs}")
            tasks = [0] * len(ids) if prompt_tasks is None else parse_tasks(
                prompt_tasks, len(ids), -(-prompt_table.shape[0] // tvs))
            tables = self._own_tables(prompt_table, rows, [t * tvs for t in tasks])
            tasks = list(range(len(ids)))
        if tables.shape[1] > cfg.rows_per_request:
            raise ValueError(
                f"a request's table has {tables.shape[1]} rows, but this engine allows "
                f"max_prompt_embedding_table_size / max_batch_size = {cfg.max_prompt_embedding_table_size} / "
                f"{cfg.max_batch_size} = {cfg.rows_per_request} rows per request ({cfg.rows_per_request // 256} "
                "image(s)); send fewer images per request or rebuild with a larger table"
            )
        return ids, tables, ",".join(map(str, tasks))

    def _check_table(self, prompt_table) -> torch.Tensor:
        """The prompt table as a tensor of the engine's hidden size and dtype, [rows, H] or [tables, rows, H]."""
        cfg = self.config
        if cfg.max_prompt_embedding_table_size == 0:
            raise ValueError(
                "this engine was built without --max_prompt_embedding_table_size, so it has no prompt-table input and "
                "would ignore the image (TensorRT-LLM issue #1300); rebuild it with trtllm_build_command"
            )
        return runtime_prompt_table(prompt_table, cfg.hidden_size, cfg.dtype)

    @staticmethod
    def _own_tables(flat: torch.Tensor, rows: list[torch.Tensor], offsets: list[int]) -> torch.Tensor:
        """Cut each request's own table out of one flat table: [B, most rows used, H], zero-padded."""
        needed = [int(r.max()) + 1 if len(r) else 0 for r in rows]
        for i, (offset, n) in enumerate(zip(offsets, needed)):
            if offset + n > flat.shape[0]:
                raise ValueError(
                    f"request {i} reads prompt-table row {offset + n - 1}, past the table's {flat.shape[0]} rows"
                )
        tables = flat.new_zeros(len(rows), max(max(needed), 1), flat.shape[1])  # [B, R, H]
        for i, (offset, n) in enumerate(zip(offsets, needed)):
            tables[i, :n] = flat[offset : offset + n]
        return tables

    def generate(self, batch_input_ids, prompt_table=None, prompt_tasks=None, max_new_tokens: int = 64,
                 end_id: int = IM_END_ID, pad_id: int = IM_END_ID, num_beams: int = 1, temperature: float = 1.0,
                 top_k: int = 1, top_p: float = 0.0, length_penalty: float = 1.0, early_stopping=False,
                 random_seed=None, streaming: bool = False, return_dict: bool = False, task_vocab_size=None):
        """Our engine's generate on the TensorRT-LLM engine: output_ids [B, beams, max input + max_new_tokens].

        Same arguments and outputs as engine.runner.ModelRunner.generate (rows: ids, new tokens, then pad_id;
        return_dict adds sequence_lengths). Request i reads table prompt_tasks[i] and its fake ids run from
        vocab_size over that table's rows (per_request_tables builds ids, table and tasks that way).
        With tensor parallelism only rank 0 gets outputs, as in TensorRT-LLM: on the other ranks ModelRunnerCpp
        enqueues nothing and returns [], and this returns None.
        """
        ids, tables, tasks = self.check_request(batch_input_ids, prompt_table, prompt_tasks, max_new_tokens, num_beams,
                                                task_vocab_size)
        for name, value, low in (("end_id", end_id, -1), ("pad_id", pad_id, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value < self.config.vocab_size:
                raise ValueError(f"{name} must be an int in [{low}, {self.config.vocab_size}), got {value!r}")
        if early_stopping not in (True, False):
            raise ValueError(f"early_stopping must be True or False with TensorRT-LLM, got {early_stopping!r}")
        sampling = dict(num_beams=num_beams, temperature=temperature, top_k=top_k, top_p=top_p,
                        length_penalty=length_penalty, early_stopping=int(early_stopping))
        if random_seed is not None:
            sampling["random_seed"] = int(random_seed)
        outputs = self.session.generate(
            ids, prompt_table=tables, prompt_tasks=tasks, max_new_tokens=max_new_tokens, end_id=end_id, pad_id=pad_id,
            streaming=streaming, return_dict=True, output_sequence_lengths=True, **sampling,
        )
        if isinstance(outputs, list) and not outputs:  # a rank that does not enqueue requests (tp_size > 1)
            return None
        if streaming:
            return (engine_outputs(out, ids, max_new_tokens, pad_id, return_dict) for out in outputs)
        return engine_outputs(outputs, ids, max_new_tokens, pad_id, return_dict)


def engine_outputs(outputs: dict, ids: list[torch.Tensor], max_new_tokens: int, pad_id: int, return_dict: bool):
    """TensorRT-LLM's outputs (padded with end_id to max_seq_len) in our engine's layout (pad_id, input + new)."""
    trt_ids, lengths = outputs["output_ids"], outputs["sequence_lengths"]  # [B, beams, max_seq_len], [B, beams]
    width = max(len(seq) for seq in ids) + max_new_tokens
    output_ids = torch.full((*trt_ids.shape[:2], width), pad_id, dtype=torch.int32, device=trt_ids.device)
    for r, seq in enumerate(ids):
        for j in range(trt_ids.shape[1]):
            n = min(int(lengths[r, j]), len(seq) + max_new_tokens)
            output_ids[r, j, :n] = trt_ids[r, j, :n]
    return {"output_ids": output_ids, "sequence_lengths": lengths.to(torch.int32)} if return_dict else output_ids
