"""Notebook 05 — TensorRT-LLM's ModelRunnerCpp behind the engine's `generate`, every request checked first."""

from dataclasses import dataclass
from pathlib import Path

import torch

from ..files import CheckpointError, field, read_json
from ..limits import BuildConfig
from ..requests import CheckedRequest, OneGeneration, Runner, SamplingConfig
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


class TRTLLMRunner(Runner):
    """A TensorRT-LLM engine behind the runners' `generate` (requests.Runner): each request checked before the GPU,
    then sent to ModelRunnerCpp with its own prompt table (in-flight batching)."""

    in_flight = True

    def __init__(self, config: EngineConfig, session):
        self.config, self.build_config = config, config.build
        self.session = session  # tensorrt_llm.runtime.ModelRunnerCpp
        self.turn = OneGeneration()  # one generation at a time, as in the engine's ModelRunner
        self.vocab_size, self.hidden_size, self.dtype = config.vocab_size, config.hidden_size, config.build.dtype
        self.max_input_len, self.max_seq_len = config.build.max_input_len, config.build.max_seq_len
        self.max_request_rows = config.rows_per_request

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
        from tensorrt_llm.runtime import ModelRunnerCpp  # noqa: PLC0415 — optional: GPU machines

        return cls(config, ModelRunnerCpp.from_dir(str(engine_dir), rank=rank, **runner_kwargs))

    def steps(self, request: CheckedRequest, max_new_tokens: int, sampling: SamplingConfig, streaming: bool):
        """ModelRunnerCpp.generate on the checked request: its ids as int32, each request's own table (none when no
        request reads a row: ModelRunnerCpp would hand every request a PromptTuningConfig of it), TensorRT-LLM's
        outputs (padded with end_id to max_seq_len) read back as new tokens."""
        ids = [seq.to(torch.int32) for seq in request.ids]  # every id checked below vocab_size + table rows
        reads = request.table is not None and any(len(request.rows_read(i)) for i in range(len(ids)))
        knobs = dict(
            num_beams=sampling.num_beams,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            length_penalty=sampling.length_penalty,
            early_stopping=EARLY_STOPPING[sampling.early_stopping],
            repetition_penalty=sampling.repetition_penalty,
        )
        if request.stop_words is not None:
            knobs["stop_words_list"] = [[list(w) for w in words] for words in request.stop_words]
        if sampling.random_seed is not None:
            knobs["random_seed"] = sampling.random_seed
        outputs = self.session.generate(
            ids,
            prompt_table=request.own_tables() if reads else None,
            prompt_tasks=",".join(str(i) for i in range(len(ids))) if reads else None,
            max_new_tokens=max_new_tokens,
            end_id=sampling.end_id,
            pad_id=sampling.pad_id,
            streaming=streaming,
            return_dict=True,
            output_sequence_lengths=True,
            **knobs,
        )
        if isinstance(outputs, list) and not outputs:  # a rank that does not enqueue requests (tp_size > 1)
            return None
        return (new_ids(out, ids, max_new_tokens) for out in (outputs if streaming else [outputs]))


def new_ids(outputs: dict, ids: list[torch.Tensor], max_new_tokens: int):
    """(new ids [B, beams, max_new_tokens], generated [B, beams]) from TensorRT-LLM's outputs, whose rows hold each
    request's ids, its new tokens, then end_id up to max_seq_len."""
    trt_ids, lengths = outputs["output_ids"], outputs["sequence_lengths"]  # [B, beams, max_seq_len], [B, beams]
    prompt = torch.tensor([[len(seq)] for seq in ids], device=lengths.device)  # [B, 1]
    generated = (lengths.long() - prompt).clamp(0, max_new_tokens)  # [B, beams]
    new = torch.zeros((*trt_ids.shape[:2], max_new_tokens), dtype=torch.int32, device=trt_ids.device)
    for r, seq in enumerate(ids):
        for j in range(trt_ids.shape[1]):
            n = int(generated[r, j])
            new[r, j, :n] = trt_ids[r, j, len(seq) : len(seq) + n]
    return new, generated
