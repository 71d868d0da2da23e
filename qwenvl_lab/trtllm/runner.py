"""Notebook 05 — TensorRT-LLM's ModelRunnerCpp behind the engine's `generate`, every request checked first."""

from dataclasses import dataclass
from pathlib import Path

import torch

from ..files import CheckpointError, field, read_json
from ..limits import BuildConfig
from ..requests import GenerationStream, OneGeneration, check_request, check_sampling, check_stop_words
from ..tokenizing import IM_END_ID
from .gpu import require_gpu_stack
from .mpi_world import check_world, mpi_world


@dataclass(frozen=True)
class EngineConfig:
    """What the runner checks requests against, read from a TensorRT-LLM engine directory's config.json."""

    vocab_size: int
    hidden_size: int
    tp_size: int
    pp_size: int
    build: BuildConfig  # the limits trtllm-build fixed, and the engine dtype

    @property
    def rows_per_request(self) -> int:
        """Table rows one request may use: the table of the request at position `batchIdx` of a step's batch is copied to row batchIdx × this."""
        return self.build.rows_per_request


def read_engine_config(engine_dir) -> EngineConfig:
    """Parse `engine_dir/config.json` (written by trtllm-build) and check the rank engines are there."""
    engine_dir = Path(engine_dir)
    config_file = engine_dir / "config.json"
    fix = "build the engine first (run_trtllm_build), or build it again if it was interrupted"
    raw = read_json(config_file, fix)
    pretrained = field(raw, "pretrained_config", "dict", config_file, fix)
    build = field(raw, "build_config", "dict", config_file, fix)
    mapping = field(pretrained, "mapping", "dict", f"{config_file} (pretrained_config)", fix)
    try:
        build_config = BuildConfig(
            max_batch_size=field(build, "max_batch_size", "int", config_file, fix),
            max_input_len=field(build, "max_input_len", "int", config_file, fix),
            max_seq_len=field(build, "max_seq_len", "int", config_file, fix),
            max_beam_width=build.get("max_beam_width", 1),
            max_prompt_embedding_table_size=build.get("max_prompt_embedding_table_size", 0),
            dtype=field(pretrained, "dtype", "str", config_file, fix),
        )
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{config_file}: {err}") from None
    config = EngineConfig(
        vocab_size=field(pretrained, "vocab_size", "int", config_file, fix),
        hidden_size=field(pretrained, "hidden_size", "int", config_file, fix),
        tp_size=field(mapping, "tp_size", "int", config_file, fix),
        pp_size=mapping.get("pp_size", 1),
        build=build_config,
    )
    missing = [
        f"rank{r}.engine"
        for r in range(config.tp_size * config.pp_size)
        if not (engine_dir / f"rank{r}.engine").is_file()
    ]
    if missing:
        raise FileNotFoundError(f"{engine_dir} lacks {missing}; was trtllm-build interrupted?")
    return config


# TensorRT-LLM takes early_stopping as an int: its beam search stops once there are enough finished beams for 1, goes
# on while a better beam may come for 0, and for other values as transformers' "never" does
# (cpp/tensorrt_llm/kernels/beamSearchKernels/beamSearchKernelsTemplate.h, NVIDIA/TensorRT-LLM at 2a9abd9536aa)
EARLY_STOPPING = {True: 1, False: 0, "never": 2}


class TRTLLMRunner:
    """A TensorRT-LLM engine behind our engine's `generate(...)`: per-request prompt tables, checked before the GPU."""

    def __init__(self, config: EngineConfig, session):
        self.config = config
        self.session = session  # tensorrt_llm.runtime.ModelRunnerCpp
        self.turn = OneGeneration()  # one generation at a time, as in the engine's ModelRunner
        self.vocab_size, self.dtype, self.max_seq_len = config.vocab_size, config.build.dtype, config.build.max_seq_len
        self.max_input_len, self.max_request_rows = config.build.max_input_len, config.rows_per_request

    @classmethod
    def from_dir(cls, engine_dir, rank=None, **runner_kwargs) -> "TRTLLMRunner":
        """Open `engine_dir` (trtllm-build's output) with ModelRunnerCpp (C++ executor, in-flight batching).

        KV-cache block reuse stays off (ModelRunnerCpp's default): with prompt tables it would also need
        input_token_extra_ids, since the same fake ids stand for different pictures in different requests.
        With tp_size > 1, launch one process per rank (mpirun -n tp_size): rank defaults to this process's MPI rank
        (tensorrt_llm.mpi_rank()), the one ModelRunnerCpp.from_dir asserts it is given.
        """
        config = read_engine_config(engine_dir)
        require_gpu_stack("tensorrt_llm", "cuda", step="TRTLLMRunner.from_dir")
        world = mpi_world()
        check_world(world, config.tp_size, config.pp_size, what=f"the engine in {engine_dir}")
        rank = world.rank if rank is None else rank
        if rank != world.rank:
            raise ValueError(
                f"rank={rank!r}, but this process is MPI rank {world.rank} of {world.size}: pass "
                "rank=tensorrt_llm.mpi_rank() (or leave rank out); ModelRunnerCpp.from_dir asserts they agree"
            )
        from tensorrt_llm.runtime import ModelRunnerCpp

        return cls(config, ModelRunnerCpp.from_dir(str(engine_dir), rank=rank, **runner_kwargs))

    def check_request(
        self,
        batch_input_ids,
        prompt_table=None,
        prompt_tasks=None,
        max_new_tokens: int = 64,
        num_beams: int = 1,
        task_vocab_size=None,
        end_id: int = IM_END_ID,
        pad_id: int = IM_END_ID,
    ):
        """Check a request against the engine: (ids int32, tables [B, rows, H] or None, prompt_tasks "0,1,…" or None).

        Each request gets its own table (in-flight batching), cut from the table given: [rows, H] with
        task_vocab_size and prompt_tasks (run.py's session), or [tables, rows, H] with one table per task.
        An empty table — run.py's ptuning_setup without pictures ([1, H], task_vocab_size 0), or one of 0 rows — and
        a table no request reads go to TensorRT-LLM as no table at all: ModelRunnerCpp would give every request a
        PromptTuningConfig of it (an [H] row its 2-D check refuses, or a table of 0 rows).
        """
        cfg = self.config
        if empty_prompt_table(prompt_table, task_vocab_size):
            try:
                return self.check_request(batch_input_ids, None, None, max_new_tokens, num_beams, None, end_id, pad_id)
            except ValueError as err:
                raise ValueError(
                    f"the prompt_table holds no image rows (task_vocab_size 0 or 0 rows), so {err}"
                ) from None
        checked = check_request(
            cfg.build,
            cfg.vocab_size,
            cfg.hidden_size,
            batch_input_ids,
            prompt_table,
            prompt_tasks,
            task_vocab_size,
            max_new_tokens,
            num_beams,
            end_id,
            pad_id,
            in_flight=True,
        )
        ids = [seq.to(torch.int32) for seq in checked.ids]  # every id checked below vocab_size + table rows
        if checked.table is None or not any(len(checked.rows_read(i)) for i in range(len(ids))):
            return ids, None, None
        return ids, checked.own_tables(), ",".join(str(i) for i in range(len(ids)))

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
        length_penalty: float = 1.0,
        early_stopping=False,
        random_seed=None,
        streaming: bool = False,
        return_dict: bool = False,
        task_vocab_size=None,
        repetition_penalty: float = 1.0,
        stop_words_list=None,
    ):
        """Our engine's generate on the TensorRT-LLM engine: output_ids [B, beams, max input + max_new_tokens].

        Same arguments and outputs as engine.runner.ModelRunner.generate (rows: ids, new tokens, then pad_id;
        return_dict adds sequence_lengths). Request i reads table prompt_tasks[i] and its fake ids run from
        vocab_size over that table's rows (per_request_tables builds ids, table and tasks that way).
        With tensor parallelism only rank 0 gets outputs, as in TensorRT-LLM: on the other ranks ModelRunnerCpp
        enqueues nothing and returns [], and this returns None. Threads may share the runner, as the engine's.
        """
        check_sampling(temperature, top_k, top_p, length_penalty, random_seed, repetition_penalty, early_stopping)
        ids, tables, tasks = self.check_request(
            batch_input_ids, prompt_table, prompt_tasks, max_new_tokens, num_beams, task_vocab_size, end_id, pad_id
        )
        stop_words = check_stop_words(stop_words_list, len(ids), self.config.vocab_size)
        sampling = dict(
            num_beams=num_beams,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            length_penalty=length_penalty,
            early_stopping=EARLY_STOPPING[early_stopping],
            repetition_penalty=repetition_penalty,
        )
        if stop_words is not None:
            sampling["stop_words_list"] = [[list(w) for w in words] for words in stop_words]
        if random_seed is not None:
            sampling["random_seed"] = random_seed
        self.turn.begin(streaming)  # threads wait their turn; refused while a stream is open
        stream = None
        try:
            outputs = self.session.generate(
                ids,
                prompt_table=tables,
                prompt_tasks=tasks,
                max_new_tokens=max_new_tokens,
                end_id=end_id,
                pad_id=pad_id,
                streaming=streaming,
                return_dict=True,
                output_sequence_lengths=True,
                **sampling,
            )
            if isinstance(outputs, list) and not outputs:  # a rank that does not enqueue requests (tp_size > 1)
                return None
            if streaming:
                stream = GenerationStream(
                    iter(outputs), lambda out: engine_outputs(out, ids, max_new_tokens, pad_id, return_dict), self.turn
                )
                return stream
            return engine_outputs(outputs, ids, max_new_tokens, pad_id, return_dict)
        finally:
            if stream is None:  # else the stream frees the runner when it ends
                self.turn.end()


def empty_prompt_table(prompt_table, task_vocab_size) -> bool:
    """True for a table that holds no image rows: 0 rows, or run.py's no-picture table (task_vocab_size 0)."""
    if not isinstance(prompt_table, torch.Tensor):
        return False
    if prompt_table.dim() in (2, 3) and prompt_table.shape[-2] == 0:
        return True
    if task_vocab_size is None:
        return False
    try:
        sizes = torch.as_tensor(task_vocab_size).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        return False  # check_request says what is wrong with it
    return sizes.numel() == 1 and not sizes.dtype.is_floating_point and int(sizes[0]) == 0


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
