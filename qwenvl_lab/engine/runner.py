"""Engine, runner — TensorRT-LLM's ModelRunner in PyTorch: requests checked against the build limits, then generated."""

import importlib.util
from pathlib import Path

import torch

from ..fake_ids import check_spans_hold_fake_ids
from ..layout import to_trtllm_names
from ..prompt_table import prompt_tuning_embedding, runtime_prompt_table
from ..tokenizing import IM_END_ID
from ..trtllm.convert import trtllm_config
from ..trtllm.runner import as_id_list, parse_tasks
from .beam_search import BeamSearch
from .build import BuildConfig, check_model_limits, load_engine_config, load_engine_weights
from .cuda_graphs import DecodeGraphs
from .forward import LanguageModelEngine
from .sampling import is_greedy, sample_tokens


def numba_by_default(device: torch.device, dtype: torch.dtype) -> bool:
    """The numba one-row decode kernel by default: on a CPU, for float32 engines, with numba installed."""
    return device.type == "cpu" and dtype == torch.float32 and importlib.util.find_spec("numba") is not None


def fused_by_default(device: torch.device, rows: int) -> bool:
    """The Triton decode kernels by default: on CUDA, with triton installed, for at most their MAX_ROWS rows a step."""
    if device.type != "cuda" or importlib.util.find_spec("triton") is None:
        return False
    from .triton_linear import MAX_ROWS

    return rows <= MAX_ROWS


class ModelRunner:
    """An engine ready to generate: its limits, its weights on one device and a KV cache sized by the build."""

    def __init__(self, build_config: BuildConfig, pretrained_config: dict, weights: dict, device="cpu",
                 cuda_graphs=None, compile_decode=None, engine_dir=None, fused_decode=None, numba_decode=None):
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for but torch sees no CUDA GPU; use device='cpu'")
        check_model_limits(build_config, pretrained_config)
        self.build_config, self.pretrained_config = build_config, pretrained_config
        self.engine_dir = None if engine_dir is None else Path(engine_dir)
        self.max_batch_size, self.max_beam_width = build_config.max_batch_size, build_config.max_beam_width
        self.max_input_len, self.max_seq_len = build_config.max_input_len, build_config.max_seq_len
        self.max_prompt_embedding_table_size = build_config.max_prompt_embedding_table_size
        self.vocab_size, self.hidden_size = pretrained_config["vocab_size"], pretrained_config["hidden_size"]
        self.device, self.dtype = device, build_config.torch_dtype
        on_cuda = device.type == "cuda"
        rows = build_config.max_batch_size * build_config.max_beam_width
        self.fused_decode = bool(fused_decode) if fused_decode is not None else fused_by_default(device, rows)
        # torch.compile fuses the plain decode step's small ops; the fused decode step does not call them
        self.compile_decode = on_cuda and not self.fused_decode if compile_decode is None else bool(compile_decode)
        # numba's kernel takes a CPU's one-row steps, unless the Triton kernels or torch.compile were asked for
        self.numba_decode = numba_by_default(device, self.dtype) and not self.fused_decode and not self.compile_decode \
            if numba_decode is None else bool(numba_decode)
        self.engine = LanguageModelEngine(build_config, pretrained_config, weights, device, self.compile_decode,
                                          self.fused_decode, self.numba_decode)
        self.cuda_graphs = on_cuda if cuda_graphs is None else bool(cuda_graphs)
        self.decoder = DecodeGraphs(self.engine.decode_step, rows, build_config.max_seq_len, device) \
            if self.cuda_graphs else self.engine.decode_step
        self.busy = False  # a generation holds the KV cache (a streaming one until it is exhausted or closed)

    @classmethod
    def from_dir(cls, engine_dir, device="cpu", cuda_graphs=None, compile_decode=None,
                 fused_decode=None, numba_decode=None) -> "ModelRunner":
        """Load an engine directory written by build_engine onto `device` (CUDA graphs and Triton's decode kernels
        default on CUDA; torch.compile where those kernels are off; numba's one-row kernel on a CPU in float32)."""
        build_config, pretrained = load_engine_config(engine_dir)
        return cls(build_config, pretrained, load_engine_weights(engine_dir), device, cuda_graphs, compile_decode,
                   engine_dir, fused_decode, numba_decode)

    @classmethod
    def from_model(cls, model, build_config: BuildConfig, device=None, cuda_graphs=None,
                   compile_decode=None, fused_decode=None, numba_decode=None) -> "ModelRunner":
        """Build the engine in memory from a QWenLMHeadModel (no files; used by the benchmark at full size)."""
        device = next(model.parameters()).device if device is None else device
        pretrained = trtllm_config(model.config, build_config.dtype)
        weights = to_trtllm_names(model.state_dict())
        return cls(build_config, pretrained, weights, device, cuda_graphs, compile_decode, fused_decode=fused_decode,
                   numba_decode=numba_decode)

    def __repr__(self):
        b = self.build_config
        return (f"ModelRunner(device={str(self.device)!r}, dtype={b.dtype}, max_batch_size={b.max_batch_size}, "
                f"max_input_len={b.max_input_len}, max_seq_len={b.max_seq_len}, "
                f"max_prompt_embedding_table_size={b.max_prompt_embedding_table_size}, max_beam_width={b.max_beam_width}, "
                f"cuda_graphs={self.cuda_graphs}, compile_decode={self.compile_decode}, fused_decode={self.fused_decode}, "
                f"numba_decode={self.numba_decode})")

    @torch.inference_mode()
    def generate(self, batch_input_ids, prompt_table=None, prompt_tasks=None, max_new_tokens: int = 64,
                 end_id: int = IM_END_ID, pad_id: int = IM_END_ID, num_beams: int = 1, temperature: float = 1.0,
                 top_k: int = 1, top_p: float = 0.0, length_penalty: float = 1.0, early_stopping=False,
                 random_seed=None, streaming: bool = False, return_dict: bool = False, task_vocab_size=None):
        """Generate for a batch of requests (list of 1-D ids); output_ids [B, beams, max input + max_new_tokens].

        Each row holds the request's ids, then its new tokens (the end_id that stopped it included), then pad_id.
        prompt_table: [rows, H] (with prompt_tasks "0,0,…" and task_vocab_size) or [tables, rows, H] (task_vocab_size
        = rows; tasks default to one table per request, or table 0 when there is one). Greedy is top_k=1 (or
        top_k=0, top_p=0); otherwise temperature, top_k (0 = off) and top_p sample. num_beams > 1 is beam search
        with transformers' semantics. end_id=-1 never stops. streaming=True returns a generator of the same
        outputs after every step (it holds the KV cache until exhausted or closed). return_dict=True gives
        {"output_ids", "sequence_lengths"}.
        """
        self._check_free()
        requests = self._check_requests(batch_input_ids, max_new_tokens)
        self._check_ids(end_id, pad_id)
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or not 1 <= num_beams <= self.max_beam_width:
            raise ValueError(
                f"num_beams {num_beams!r} is outside 1…{self.max_beam_width}, the engine's max_beam_width; rebuild with "
                "BuildConfig(max_beam_width=…) for wider beam search"
            )
        greedy = is_greedy(temperature, top_k, top_p)
        if num_beams > 1 and not greedy:
            raise ValueError("beam search picks the best beams, it does not sample: leave top_k=1 with num_beams > 1")
        check_spans_hold_fake_ids(requests, self.vocab_size)
        table = self._prompt_inputs(requests, prompt_table, prompt_tasks, task_vocab_size)
        embeds = [self._embed(ids, table, r) for r, ids in enumerate(requests)]
        if num_beams > 1:
            search = BeamSearch(len(requests), num_beams, max_new_tokens, end_id, pad_id, length_penalty, early_stopping,
                                self.device)
            steps = self._beam_steps(requests, embeds, search)
        else:
            generator = None
            if random_seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(int(random_seed))
            steps = self._sampling_steps(requests, embeds, max_new_tokens, end_id, pad_id,
                                         lambda logits: sample_tokens(logits, temperature, top_k, top_p, generator))
        steps = self._holding_cache(steps)
        if streaming:
            return (self._outputs(requests, ids, lengths, pad_id, max_new_tokens, return_dict) for ids, lengths in steps)
        for new_ids, generated in steps:
            pass
        return self._outputs(requests, new_ids, generated, pad_id, max_new_tokens, return_dict)

    def _check_free(self) -> None:
        """Raise while another generation holds the KV cache."""
        if self.busy:
            raise RuntimeError("a streaming generation still holds this runner's KV cache: exhaust it or close() it first")

    def _holding_cache(self, steps):
        """Run `steps` with the runner marked busy, so no second generation overwrites the cache meanwhile."""
        self._check_free()
        self.busy = True
        try:
            yield from steps
        finally:
            self.busy = False

    def _check_requests(self, batch_input_ids, max_new_tokens) -> list[torch.Tensor]:
        """The requests as 1-D int64 tensors on the device, checked against the build limits."""
        requests = as_id_list(batch_input_ids)
        if len(requests) > self.max_batch_size:
            raise ValueError(
                f"{len(requests)} requests but the engine was built with max_batch_size {self.max_batch_size}: send at "
                "most that many at once, or rebuild with a larger BuildConfig.max_batch_size"
            )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        for i, ids in enumerate(requests):
            if len(ids) > self.max_input_len:
                raise ValueError(
                    f"request {i} has {len(ids)} input ids but the engine's max_input_len is {self.max_input_len}: "
                    "shorten the prompt (fewer pictures or history turns) or rebuild with a larger max_input_len"
                )
            if len(ids) + max_new_tokens > self.max_seq_len:
                raise ValueError(
                    f"request {i}: {len(ids)} input ids + max_new_tokens {max_new_tokens} exceed the engine's max_seq_len "
                    f"{self.max_seq_len}; ask for at most {self.max_seq_len - len(ids)} new tokens "
                    "(generate_for_qwenvl clamps it for you, as run.py does)"
                )
        return [ids.to(device=self.device, dtype=torch.long) for ids in requests]

    def _check_ids(self, end_id, pad_id) -> None:
        """end_id in [-1, V) (-1: never stop), pad_id in [0, V) (finished rows feed it to the model)."""
        for name, value, low in (("end_id", end_id, -1), ("pad_id", pad_id, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value < self.vocab_size:
                raise ValueError(f"{name} must be an int in [{low}, {self.vocab_size}), got {value!r}")

    def _prompt_inputs(self, requests, prompt_table, prompt_tasks, task_vocab_size):
        """(table [rows, H], tasks [B], task_vocab_size) on the device, or None; every limit checked."""
        if prompt_table is None:
            if prompt_tasks is not None or task_vocab_size is not None:
                raise ValueError("prompt_tasks / task_vocab_size were given without a prompt_table")
            for i, ids in enumerate(requests):
                if bool((ids >= self.vocab_size).any()):
                    raise ValueError(
                        f"request {i} holds fake prompt ids (>= vocab_size {self.vocab_size}) but no prompt_table was "
                        "given: pass the image features as prompt_table (see ptuning_setup)"
                    )
            return None
        if self.max_prompt_embedding_table_size == 0:
            raise ValueError(
                "this engine was built with max_prompt_embedding_table_size=0, so it takes no prompt table and cannot see "
                "images (the flag article 2's trtllm-build command leaves out; TensorRT-LLM issue #1300). Rebuild with "
                "BuildConfig(max_prompt_embedding_table_size=256 × images per request × max_batch_size)"
            )
        prompt_table = runtime_prompt_table(prompt_table, self.hidden_size, self.dtype)
        if prompt_table.dim() == 3:
            num_tables, tvs = prompt_table.shape[0], prompt_table.shape[1]
            if task_vocab_size is not None and int(torch.as_tensor(task_vocab_size).reshape(-1)[0]) != tvs:
                raise ValueError(f"a [tables, rows, H] prompt_table has task_vocab_size = rows = {tvs}; "
                                 f"task_vocab_size {task_vocab_size!r} disagrees (leave it out)")
            table = prompt_table.reshape(-1, self.hidden_size)  # [tables · rows, H]
            default = [0] * len(requests) if num_tables == 1 else list(range(len(requests)))
            if num_tables not in (1, len(requests)) and prompt_tasks is None:
                raise ValueError(f"{num_tables} tables for {len(requests)} requests: say which is whose with prompt_tasks")
        else:
            table = prompt_table
            tvs = table.shape[0] if task_vocab_size is None else int(torch.as_tensor(task_vocab_size).reshape(-1)[0])
            if tvs < 1:
                raise ValueError(f"task_vocab_size must be >= 1 (rows per task), got {tvs}")
            num_tables, default = -(-table.shape[0] // tvs), [0] * len(requests)
        if table.shape[0] > self.max_prompt_embedding_table_size:
            raise ValueError(
                f"the prompt table has {table.shape[0]} rows but the engine holds at most "
                f"max_prompt_embedding_table_size = {self.max_prompt_embedding_table_size} "
                f"({self.max_prompt_embedding_table_size // 256} images of 256 rows); "
                "send fewer images, or rebuild with 256 × images per request × max_batch_size"
            )
        if prompt_tasks is None:
            tasks = default
        else:
            if not isinstance(prompt_tasks, str):
                prompt_tasks = ",".join(str(int(t)) for t in torch.as_tensor(prompt_tasks).reshape(-1).tolist())
            tasks = parse_tasks(prompt_tasks, len(requests), num_tables)
        return table.to(self.device), torch.tensor(tasks, dtype=torch.int32, device=self.device), tvs

    def _embed(self, ids, table, r: int) -> torch.Tensor:
        """Embeddings [L, H] of request r: vocabulary rows, and prompt-table rows for its fake ids (its task's block)."""
        if table is None:
            return self.engine.embed(ids)
        prompt_table, tasks, tvs = table
        return prompt_tuning_embedding(ids[None], self.engine.vocab_embedding, prompt_table, tasks[r : r + 1], tvs,
                                       self.vocab_size)[0]

    @torch.inference_mode()
    def _sampling_steps(self, requests, embeds, max_new_tokens, end_id, pad_id, pick):
        """Greedy or sampled decoding: yields (new ids [B, 1, t+1], generated lengths [B, 1]) after every token."""
        lengths = [len(ids) for ids in requests]
        logits = self.engine.prefill(torch.cat(embeds), lengths, [range(r, r + 1) for r in range(len(requests))])
        pos = torch.tensor(lengths, device=self.device)  # where each row's next input token goes
        new_ids = torch.full((len(requests), max_new_tokens), pad_id, dtype=torch.long, device=self.device)
        generated = torch.zeros(len(requests), dtype=torch.long, device=self.device)
        finished = torch.zeros(len(requests), dtype=torch.bool, device=self.device)
        for t in range(max_new_tokens):
            tokens = pick(logits)  # [B]
            if end_id >= 0:  # rows that ended get pad_id; without an end_id nothing is checked (no per-token sync)
                tokens = torch.where(finished, pad_id, tokens)
                generated += ~finished
                finished |= tokens == end_id
            else:
                generated += 1
            new_ids[:, t] = tokens
            yield new_ids[:, None, : t + 1], generated[:, None]
            if t + 1 == max_new_tokens or (end_id >= 0 and bool(finished.all())):
                return
            logits = self.decoder(tokens, pos, max(lengths) + t + 1)
            pos += 1

    @torch.inference_mode()
    def _beam_steps(self, requests, embeds, search: BeamSearch):
        """Beam search: yields the running beams after every token, then the finished ones ([B, k, T], [B, k])."""
        lengths, k = [len(ids) for ids in requests], search.k
        logits = self.engine.prefill(torch.cat(embeds), lengths, [range(r * k, (r + 1) * k) for r in range(len(requests))])
        logits = logits.repeat_interleave(k, dim=0)  # [B·k, V]: the k beams start from the same prompt
        pos = torch.tensor(lengths, device=self.device).repeat_interleave(k)  # [B·k]
        for t in range(search.max_new_tokens):
            src_rows, tokens, done = search.step(logits, t)
            if done:
                break
            yield search.running_beams(t)
            self.engine.reorder(src_rows, max(lengths) + t)
            logits = self.decoder(tokens, pos, max(lengths) + t + 1)
            pos += 1
        yield search.result()

    def _outputs(self, requests, new_ids, generated, pad_id, max_new_tokens, return_dict):
        """output_ids [B, beams, max input + max_new_tokens] (ids, new tokens, pad_id) and sequence_lengths [B, beams]."""
        b, beams = new_ids.shape[:2]
        width = max(len(ids) for ids in requests) + max_new_tokens
        output_ids = torch.full((b, beams, width), pad_id, dtype=torch.int32, device=self.device)
        for r, ids in enumerate(requests):
            output_ids[r, :, : len(ids)] = ids.to(torch.int32)
            for j in range(beams):
                n = int(generated[r, j])
                output_ids[r, j, len(ids) : len(ids) + n] = new_ids[r, j, :n].to(torch.int32)
        if not return_dict:
            return output_ids
        lengths = torch.tensor([[len(ids)] for ids in requests], device=self.device) + generated
        return {"output_ids": output_ids, "sequence_lengths": lengths.to(torch.int32)}
