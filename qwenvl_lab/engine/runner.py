"""Notebook 06 — the engine's runner: TensorRT-LLM's ModelRunner in PyTorch, each request checked, then generated."""

from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..checks.values import check_model_limits
from ..layout import to_trtllm_names
from ..limits import BuildConfig
from ..prompt_table import lookup
from ..requests import CheckedRequest, OneGeneration, Runner, SamplingConfig, ends_with_stop_word
from ..unified_checkpoint import trtllm_config, weight_only_quantize
from .beam_search import BeamSearch
from .build import TUNING_FILE, load_engine_config, load_engine_weights
from .cuda_graphs import DecodeGraphs, kv_bucket
from .decode import backend_class
from .forward import LanguageModelEngine
from .sampling import penalize_repetition, sample_tokens


class ModelRunner(Runner):
    """An engine ready to generate: its limits, its weights on one device, a KV cache sized by the build, and the
    decode step named by `backend` ("torch", the reference; "numba" on a CPU or "triton" on a GPU: engine.decode),
    replayed as CUDA graphs when `cuda_graphs` is on."""

    def __init__(
        self,
        build_config: BuildConfig,
        pretrained_config: dict,
        weights: dict,
        device="cpu",
        backend: str = "torch",
        cuda_graphs: bool = False,
        engine_dir=None,
        tuning_file=None,
    ):
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for but torch sees no CUDA GPU; use device='cpu'")
        check_model_limits(build_config, pretrained_config["max_position_embeddings"], pretrained_config["seq_length"])
        self.build_config, self.pretrained_config = build_config, pretrained_config
        self.engine_dir = None if engine_dir is None else Path(engine_dir)
        self.max_batch_size, self.max_beam_width = build_config.max_batch_size, build_config.max_beam_width
        self.max_input_len, self.max_seq_len = build_config.max_input_len, build_config.max_seq_len
        self.max_prompt_embedding_table_size = build_config.max_prompt_embedding_table_size
        self.max_request_rows = self.max_prompt_embedding_table_size  # one request may fill the table (run.py's way)
        self.vocab_size, self.hidden_size = pretrained_config["vocab_size"], pretrained_config["hidden_size"]
        self.device, self.dtype = device, build_config.torch_dtype
        step_class = backend_class(backend, device, self.dtype, cuda_graphs, build_config.weight_only)  # or refused
        self.backend, self.cuda_graphs = backend, cuda_graphs
        self.engine = LanguageModelEngine(build_config, pretrained_config, weights, device, step_class.layout)
        self.decode_step = step_class(self.engine, tuning_file)  # step(ids [n], pos [n], kv_len) -> logits [n, V]
        rows = build_config.max_batch_size * build_config.max_beam_width
        self.decoder = DecodeGraphs(self.decode_step, rows, device) if cuda_graphs else self.decode_step
        self.turn = OneGeneration()  # one generation at a time holds the KV cache

    @classmethod
    def from_dir(
        cls,
        engine_dir,
        device="cpu",
        backend: str = "torch",
        cuda_graphs: bool = False,
        warm_up=None,
        verify: str = "full",
    ) -> "ModelRunner":
        """Load an engine directory written by build_engine onto `device`, every file checked against its manifest
        (`verify`: "full" reads every byte, "quick" samples large files, "none" checks sizes; see verify_engine);
        warm_up (default: with a fast back end or CUDA graphs) does the decode step's first run now rather than in
        the first question."""
        build_config, pretrained = load_engine_config(engine_dir, verify)
        runner = cls(
            build_config,
            pretrained,
            load_engine_weights(engine_dir),
            device,
            backend,
            cuda_graphs,
            engine_dir=engine_dir,
            tuning_file=Path(engine_dir) / TUNING_FILE,
        )
        if backend != "torch" or cuda_graphs if warm_up is None else warm_up:  # the fast back ends compile or tune
            runner.warm_up()
        return runner

    @classmethod
    def from_model(
        cls,
        model,
        build_config: BuildConfig,
        device=None,
        backend: str = "torch",
        cuda_graphs: bool = False,
        tuning_file=None,
    ) -> "ModelRunner":
        """Build the engine in memory from a QWenLMHeadModel (no files; used by the benchmark at full size); a
        weight-only build config quantizes the model's layer matrices (from their values in the engine dtype)."""
        device = next(model.parameters()).device if device is None else device
        pretrained = trtllm_config(model.config, build_config.dtype, weight_only=build_config.weight_only)
        weights = to_trtllm_names(model.state_dict())
        if build_config.weight_only is not None:
            weights = weight_only_quantize(
                {name: w.to(build_config.torch_dtype) for name, w in weights.items()}, build_config.dtype
            )
        return cls(
            build_config,
            pretrained,
            weights,
            device,
            backend,
            cuda_graphs,
            tuning_file=tuning_file,
        )

    def warm_up(self, progress: bool = True) -> None:
        """Do now what the first question would otherwise wait for: a prefill, and the decode step's first run for one
        row — Triton's autotuning, numba's compilation, the first CUDA graph. The Triton kernels' tuned choices are
        saved beside the engine (tuning.json) and reused by the next process that loads it."""
        ids = torch.zeros(1, dtype=torch.long, device=self.device)
        stages = {
            "prefill": lambda: self.engine.prefill(self.engine.embed(ids), [1], [range(0, 1)]),
            "decode step": lambda: self.decoder(ids, ids, kv_bucket(1, self.max_seq_len)),
        }
        self.turn.begin()
        try:
            with torch.inference_mode():
                for name in tqdm(stages, desc="warming up", disable=not progress):
                    stages[name]()
        finally:
            self.turn.end()
        self.decode_step.save_tuning()

    def __repr__(self):
        b = self.build_config
        return (
            f"ModelRunner(device={str(self.device)!r}, dtype={b.dtype}, max_batch_size={b.max_batch_size}, "
            f"max_input_len={b.max_input_len}, max_seq_len={b.max_seq_len}, "
            f"max_prompt_embedding_table_size={b.max_prompt_embedding_table_size}, max_beam_width={b.max_beam_width}, "
            + (f"weight_only={b.weight_only!r}, " if b.weight_only is not None else "")
            + f"backend={self.backend!r}, cuda_graphs={self.cuda_graphs})"
        )

    @torch.inference_mode()
    def steps(self, request: CheckedRequest, max_new_tokens: int, sampling: SamplingConfig, streaming: bool):
        """The engine's decoding of a checked request: greedy or sampled, one token a step, or beam search with
        transformers' semantics; the KV cache holds the batch (one generation at a time)."""
        if sampling.num_beams > 1 and (sampling.repetition_penalty != 1.0 or request.stop_words is not None):
            raise ValueError(
                "repetition_penalty and stop_words_list apply to greedy and sampled decoding here, not to "
                "beam search: leave them out with num_beams > 1"
            )
        requests = [ids.to(self.device) for ids in request.ids]
        table = None if request.table is None else request.table.to(self.device)
        embeds = [self._embed(ids, table, request, r) for r, ids in enumerate(requests)]
        if sampling.num_beams > 1:
            search = BeamSearch(
                len(requests),
                sampling.num_beams,
                max_new_tokens,
                sampling.end_id,
                sampling.pad_id,
                sampling.length_penalty,
                sampling.early_stopping,
                self.device,
            )
            return self._beam_steps(requests, embeds, search)
        generator = None
        if sampling.random_seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.random_seed)

        def pick(logits, seen):
            if seen is not None:
                logits = penalize_repetition(logits, seen, sampling.repetition_penalty)
            return sample_tokens(logits, sampling.temperature, sampling.top_k, sampling.top_p, generator)

        return self._sampling_steps(
            requests,
            embeds,
            max_new_tokens,
            sampling.end_id,
            sampling.pad_id,
            pick,
            request.stop_words,
            track_seen=sampling.repetition_penalty != 1.0,
        )

    def _embed(self, ids, table, request, r: int) -> torch.Tensor:
        """Embeddings [L, H] of request r: vocabulary rows, and the prompt-table rows its fake ids read."""
        if table is None:
            return self.engine.embed(ids)
        rows = request.rows[r].to(self.device)[None]  # [1, L]: checked by check_request
        return lookup(ids[None], self.engine.vocab_embedding, table, rows, self.vocab_size)[0]

    @torch.inference_mode()
    def _sampling_steps(
        self, requests, embeds, max_new_tokens, end_id, pad_id, pick, stop_words=None, track_seen=False
    ):
        """Greedy or sampled decoding: yields (new ids [B, 1, t+1], generated lengths [B, 1]) after every token."""
        lengths = [len(ids) for ids in requests]
        logits = self.engine.prefill(torch.cat(embeds), lengths, [range(r, r + 1) for r in range(len(requests))])
        pos = torch.tensor(lengths, device=self.device)  # where each row's next input token goes
        new_ids = torch.full((len(requests), max_new_tokens), pad_id, dtype=torch.long, device=self.device)
        generated = torch.zeros(len(requests), dtype=torch.long, device=self.device)
        finished = torch.zeros(len(requests), dtype=torch.bool, device=self.device)
        stopping = end_id >= 0 or stop_words is not None  # else nothing is checked (no per-token sync)
        seen = None  # [B, V]: the vocabulary ids of each row so far, for the repetition penalty
        if track_seen:
            seen = torch.zeros(len(requests), self.vocab_size, dtype=torch.bool, device=self.device)
            for r, ids in enumerate(requests):
                seen[r, ids[ids < self.vocab_size]] = True
        rows = torch.arange(len(requests), device=self.device)
        counts = None if stopping else torch.arange(1, max_new_tokens + 1, device=self.device)  # every row: t + 1
        for t in range(max_new_tokens):
            tokens = pick(logits, seen)  # [B]
            if stopping:  # rows that ended get pad_id
                tokens = torch.where(finished, pad_id, tokens)
                generated += ~finished
                finished |= tokens == end_id
            else:
                generated = counts[t].expand(len(requests))  # a view: no kernel a step
            new_ids[:, t] = tokens
            if stop_words is not None:
                finished |= self._ends_with_stop_word(new_ids[:, : t + 1], generated, stop_words)
            if seen is not None:
                seen[rows, tokens] = True
            yield new_ids[:, None, : t + 1], generated[:, None]
            if t + 1 == max_new_tokens or (stopping and bool(finished.all())):
                return
            logits = self.decoder(tokens, pos, kv_bucket(max(lengths) + t + 1, self.max_seq_len))
            pos += 1

    def _ends_with_stop_word(self, new_ids, generated, stop_words) -> torch.Tensor:
        """Rows whose generated tokens (new_ids [B, t], generated [B] of them) end with one of their stop words: [B]."""
        ends = [ends_with_stop_word(new_ids[r, : int(generated[r])].tolist(), w) for r, w in enumerate(stop_words)]
        return torch.tensor(ends, dtype=torch.bool, device=self.device)

    @torch.inference_mode()
    def _beam_steps(self, requests, embeds, search: BeamSearch):
        """Beam search: yields the running beams after every token, then the finished ones ([B, k, T], [B, k])."""
        lengths, k = [len(ids) for ids in requests], search.k
        logits = self.engine.prefill(
            torch.cat(embeds), lengths, [range(r * k, (r + 1) * k) for r in range(len(requests))]
        )
        logits = logits.repeat_interleave(k, dim=0)  # [B·k, V]: the k beams start from the same prompt
        pos = torch.tensor(lengths, device=self.device).repeat_interleave(k)  # [B·k]
        for t in range(search.max_new_tokens):
            src_rows, tokens, done = search.step(logits, t)
            if done:
                break
            yield search.running_beams(t)
            self.engine.reorder(src_rows, max(lengths) + t)
            logits = self.decoder(tokens, pos, kv_bucket(max(lengths) + t + 1, self.max_seq_len))
            pos += 1
        yield search.result()
