"""Notebook 06 — the engine's runner: TensorRT-LLM's ModelRunner in PyTorch, each request checked, then generated."""

import math
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..checks.values import check_choice, check_int, check_model_limits
from ..fake_ids import fake_id_runs
from ..layout import to_trtllm_names
from ..limits import BuildConfig, check_engine_memory, engine_memory
from ..prompt_table import lookup
from ..requests import CheckedRequest, OneGeneration, Runner, SamplingConfig, ends_with_stop_word
from ..unified_checkpoint import trtllm_config, weight_only_quantize
from .beam_search import BeamSearch
from .block_reuse import DEFAULT_BLOCK_SIZE, KV_CACHE_KEYS, BlockPool, PrefillStats, RequestKey, rows_hash
from .build import TUNING_FILE, expected_weights, load_engine_config, load_engine_weights, open_engine
from .cuda_graphs import DecodeGraphs, kv_bucket
from .decode import backend_class
from .forward import LanguageModelEngine
from .sampling import penalize_repetition, sample_tokens

IDS_ONLY = (
    "KV-cache reuse keyed by ids alone (kv_cache_key='ids'): request {r} holds fake prompt ids but no "
    "input_token_extra_ids, and fake ids restart at vocab_size in every request, so a cached request about another "
    "picture with the same ids would be reused for it. Give input_token_extra_ids (0 for text, one id > 0 per "
    "picture), or use kv_cache_key='mm_hash' or 'pad_value'"
)


class ModelRunner(Runner):
    """An engine ready to generate: its limits, its weights on one device, a KV cache sized by the build, and the
    decode step named by `backend` ("torch", the reference; "numba" on a CPU or "triton" on a GPU: engine.decode),
    replayed as CUDA graphs when `cuda_graphs` is on.

    With `kv_cache_reuse` (off by default, as TensorRT-LLM's ModelRunnerCpp leaves it) a finished request's full
    blocks of `kv_block_size` ids are kept in a pool of `kv_pool_blocks` blocks (default: as many tokens as the
    cache rows hold; `kv_pool.nbytes` says its size), keyed as `kv_cache_key` says (engine.block_reuse), and a later
    request copies the longest chain of its blocks found there into its rows and computes only the rest.
    `last_prefill` tells how many ids each request of the last call reused and computed.
    """

    def __init__(  # noqa: PLR0913 — the build, the device, how to decode, how to reuse the cache
        self,
        build_config: BuildConfig,
        pretrained_config: dict,
        weights: dict,
        device="cpu",
        backend: str = "torch",
        cuda_graphs: bool = False,
        engine_dir=None,
        tuning_file=None,
        kv_cache_reuse: bool = False,
        kv_cache_key: str = "mm_hash",
        kv_block_size: int = DEFAULT_BLOCK_SIZE,
        kv_pool_blocks: int | None = None,
    ):
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for but torch sees no CUDA GPU; use device='cpu'")
        check_model_limits(build_config, pretrained_config["max_position_embeddings"], pretrained_config["seq_length"])
        need = engine_memory(build_config, pretrained_config, sum(t.numel() for t in weights.values()))
        if device.type == "cpu":
            need["weights"] = 0  # already in memory here
        check_engine_memory(build_config, pretrained_config, need, device)  # before the KV cache is allocated
        self.build = None  # from_dir: the manifest's sha256, which the engine's vision part must match
        self.build_config, self.pretrained_config = build_config, pretrained_config
        self.engine_dir = None if engine_dir is None else Path(engine_dir)
        self.max_batch_size, self.max_beam_width = build_config.max_batch_size, build_config.max_beam_width
        self.max_input_len, self.max_seq_len = build_config.max_input_len, build_config.max_seq_len
        self.max_prompt_embedding_table_size = build_config.max_prompt_embedding_table_size
        self.max_request_rows = self.max_prompt_embedding_table_size  # one request may fill the table (run.py's way)
        self.vocab_size, self.hidden_size = pretrained_config["vocab_size"], pretrained_config["hidden_size"]
        self.device, self.dtype = device, build_config.torch_dtype
        step_class = backend_class(backend, device, self.dtype, cuda_graphs, build_config.weight_only)  # or refused
        check_choice("kv_cache_reuse", kv_cache_reuse, (False, True))
        self.kv_cache_key = check_choice("kv_cache_key", kv_cache_key, KV_CACHE_KEYS)
        # a block longer than max_seq_len would never fill: refused when reuse is on, unused when it is off
        self.kv_block_size = check_int(
            "kv_block_size", kv_block_size, 1, build_config.max_seq_len if kv_cache_reuse else None
        )
        rows = build_config.max_batch_size * build_config.max_beam_width
        if kv_pool_blocks is None:  # as many tokens as the cache rows hold
            kv_pool_blocks = rows * -(-build_config.max_seq_len // self.kv_block_size)
        kv_pool_blocks = check_int("kv_pool_blocks", kv_pool_blocks, 1)
        self.backend, self.cuda_graphs = backend, cuda_graphs
        self.engine = LanguageModelEngine(build_config, pretrained_config, weights, device, step_class.layout)
        self.decode_step = step_class(self.engine, tuning_file)  # step(ids [n], pos [n], kv_len) -> logits [n, V]
        self.kv_pool = BlockPool(self.engine.kv_cache, self.kv_block_size, kv_pool_blocks) if kv_cache_reuse else None
        self._kv_cache_reuse = kv_cache_reuse
        self.last_prefill = None  # PrefillStats of the last generate call
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
        **kv_cache_options,
    ) -> "ModelRunner":
        """Load an engine directory written by build_engine onto `device`, every file checked against its manifest
        (`verify`: "full" reads every byte, "quick" samples large files, "none" checks sizes; see verify_engine);
        warm_up (default: with a fast back end or CUDA graphs) does the decode step's first run now rather than in
        the first question. `kv_cache_options`: kv_cache_reuse, kv_cache_key, kv_block_size, kv_pool_blocks."""
        with open_engine(engine_dir) as engine:  # every file read comes from one build
            build_config, pretrained = load_engine_config(engine, verify)
            need = engine_memory(build_config, pretrained, sum(map(math.prod, expected_weights(pretrained).values())))
            check_engine_memory(build_config, pretrained, need, torch.device(device))  # before reading the weights
            runner = cls(
                build_config,
                pretrained,
                load_engine_weights(engine),
                device,
                backend,
                cuda_graphs,
                engine_dir=engine.path,
                tuning_file=engine.path / TUNING_FILE,
                **kv_cache_options,
            )
            runner.build = engine.manifest_sha256
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
        **kv_cache_options,
    ) -> "ModelRunner":
        """Build the engine in memory from a QWenLMHeadModel (no files; used by the benchmark at full size); a
        weight-only build config quantizes the model's layer matrices (from their values in the engine dtype);
        `kv_cache_options` as in from_dir."""
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
            **kv_cache_options,
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
            + f"backend={self.backend!r}, cuda_graphs={self.cuda_graphs}"
            + (
                ""
                if self.kv_pool is None
                else f", kv_cache_reuse={self.kv_cache_reuse}, kv_cache_key={self.kv_cache_key!r}, "
                f"kv_block_size={self.kv_block_size}, kv_pool_blocks={self.kv_pool.capacity} "
                f"({self.kv_pool.nbytes / 2**20:.1f} MiB)"
            )
            + ")"
        )

    @property
    def kv_cache_reuse(self) -> bool:
        """Whether generate reuses and keeps blocks; may be switched between calls (the pool keeps its blocks)."""
        return self._kv_cache_reuse

    @kv_cache_reuse.setter
    def kv_cache_reuse(self, on: bool) -> None:
        """Switch block reuse on or off (only on a runner built with a pool)."""
        check_choice("kv_cache_reuse", on, (False, True))
        if on and self.kv_pool is None:
            raise ValueError("this runner has no block pool: build it with ModelRunner(..., kv_cache_reuse=True)")
        self._kv_cache_reuse = on

    def _request_keys(self, request: CheckedRequest) -> list[RequestKey]:
        """The block keys' makings of each request (engine.block_reuse), as kv_cache_key says."""
        keys = []
        for r, ids in enumerate(request.ids):
            runs, hashes = fake_id_runs(ids, self.vocab_size), ()
            if self.kv_cache_key != "ids" and request.picture_hashes is not None:
                hashes = request.picture_hashes[r]
            elif self.kv_cache_key != "ids":  # what the engine embeds: the rows each picture's fake ids read
                hashes = [rows_hash(request.table, request.rows[r][a:b]) for a, b in runs]
            extra = None if request.extra_ids is None else request.extra_ids[r]
            if self.kv_cache_key == "ids" and runs and extra is None:
                warnings.warn(IDS_ONLY.format(r=r), stacklevel=5)  # at the caller of generate
            keys.append(RequestKey.of(self.kv_cache_key, ids, self.vocab_size, extra, hashes))
        return keys

    def _prefill(self, keys, embeds: list, rows: list[range]) -> torch.Tensor:
        """The prefill of a batch, each request's longest chain of kept blocks (keys: its RequestKey, None without
        reuse) first copied into its rows: the last logits [B, V]."""
        lengths, starts = [len(e) for e in embeds], [0] * len(embeds)
        if keys is not None:
            for r, key in enumerate(keys):  # the last id is always computed: its logits give the first token
                slots = self.kv_pool.match(key.block_hashes(self.kv_block_size, (lengths[r] - 1) // self.kv_block_size))
                self.kv_pool.load(slots, self.engine.kv_cache, rows[r])
                starts[r] = len(slots) * self.kv_block_size
        self.last_prefill = PrefillStats(tuple(lengths), tuple(starts))
        new = torch.cat([e[s:] for e, s in zip(embeds, starts)])  # [N, H]: the ids after the reused blocks
        return self.engine.prefill(new, lengths, rows, starts)

    @torch.inference_mode()
    def _keep(self, keys, rows: list[range], lengths: list[int], new_ids=None, fed=None) -> None:
        """Keep each request's full blocks whose keys and values its first cache row holds: its ids, then the first
        fed[r] of its new ids (those the decode steps wrote)."""
        for r, key in enumerate(keys):
            valid = lengths[r]
            if new_ids is not None:
                key, valid = key.followed_by(new_ids[r, : fed[r]].tolist()), valid + fed[r]
            hashes = key.block_hashes(self.kv_block_size, valid // self.kv_block_size)
            self.kv_pool.store(hashes, self.engine.kv_cache, rows[r].start)

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
        embeds = [self._embed(ids, table, request, r) for r, ids in enumerate(requests)]  # [L_r, H] each
        keys = self._request_keys(request) if self.kv_cache_reuse else None
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
            return self._beam_steps(keys, embeds, search)
        generator = None
        if sampling.random_seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.random_seed)

        def pick(logits, seen):
            if seen is not None:
                logits = penalize_repetition(logits, seen, sampling.repetition_penalty)
            return sample_tokens(logits, sampling.temperature, sampling.top_k, sampling.top_p, generator)

        return self._sampling_steps(
            requests,
            keys,
            embeds,
            max_new_tokens,
            sampling.end_id,
            sampling.pad_id,
            pick,
            request.stop_words,
            track_seen=sampling.repetition_penalty != 1.0,
        )

    @torch.inference_mode()
    def prefill_stages(self, batch_input_ids, prompt_table=None, prompt_tasks=None, task_vocab_size=None) -> dict:
        """One request's prompt through the engine, stage by stage (a per-stage dump, `dump.STAGES`): the embeddings it
        looks up "input_embeds" [L, H], each layer's output "layers.i" [L, H], and the "logits" [V] that pick the first
        new token. The request is checked as `generate` checks it."""
        no_decoding = SamplingConfig(end_id=-1, pad_id=0)  # the prompt only: no end or pad id to check
        request = self.check_request(batch_input_ids, prompt_table, prompt_tasks, task_vocab_size, 1, no_decoding)
        if len(request.ids) != 1:
            raise ValueError(f"prefill_stages takes one request, got {len(request.ids)}")
        ids = request.ids[0].to(self.device)
        table = None if request.table is None else request.table.to(self.device)
        stages = {"input_embeds": self._embed(ids, table, request, 0)}  # [L, H]
        self.turn.begin()
        try:
            logits = self.engine.prefill(
                stages["input_embeds"],
                [len(ids)],
                [range(0, 1)],
                observe=lambda i, x: stages.__setitem__(f"layers.{i}", x.clone()),
            )  # [1, V]
        finally:
            self.turn.end()
        stages["logits"] = logits[0]
        return stages

    def _embed(self, ids, table, request, r: int) -> torch.Tensor:
        """Embeddings [L, H] of request r: vocabulary rows, and the prompt-table rows its fake ids read."""
        if table is None:
            return self.engine.embed(ids)
        rows = request.rows[r].to(self.device)[None]  # [1, L]: checked by check_request
        return lookup(ids[None], self.engine.vocab_embedding, table, rows, self.vocab_size)[0]

    @torch.inference_mode()
    def _sampling_steps(  # noqa: PLR0913 — the batch, then the sampling knobs
        self, requests, keys, embeds, max_new_tokens, end_id, pad_id, pick, stop_words=None, track_seen=False
    ):
        """Greedy or sampled decoding: yields (new ids [B, 1, t+1], generated lengths [B, 1]) after every token."""
        lengths, rows = [len(e) for e in embeds], [range(r, r + 1) for r in range(len(embeds))]
        logits = self._prefill(keys, embeds, rows)
        pos = torch.tensor(lengths, device=self.device)  # where each row's next input token goes
        new_ids = torch.full((len(embeds), max_new_tokens), pad_id, dtype=torch.long, device=self.device)
        generated = torch.zeros(len(embeds), dtype=torch.long, device=self.device)
        finished = torch.zeros(len(embeds), dtype=torch.bool, device=self.device)
        stopping = end_id >= 0 or stop_words is not None  # else nothing is checked (no per-token sync)
        seen = None  # [B, V]: the vocabulary ids of each row so far, for the repetition penalty
        if track_seen:
            seen = torch.zeros(len(embeds), self.vocab_size, dtype=torch.bool, device=self.device)
            for r, ids in enumerate(requests):
                seen[r, ids[ids < self.vocab_size]] = True
        batch_rows = torch.arange(len(embeds), device=self.device)
        counts = None if stopping else torch.arange(1, max_new_tokens + 1, device=self.device)  # every row: t + 1
        steps = 0  # decode steps run: new tokens whose keys and values the cache holds
        try:
            for t in range(max_new_tokens):
                tokens = pick(logits, seen)  # [B]
                if stopping:  # rows that ended get pad_id
                    tokens = torch.where(finished, pad_id, tokens)
                    generated += ~finished
                    finished |= tokens == end_id
                else:
                    generated = counts[t].expand(len(embeds))  # a view: no kernel a step
                new_ids[:, t] = tokens
                if stop_words is not None:
                    finished |= self._ends_with_stop_word(new_ids[:, : t + 1], generated, stop_words)
                if seen is not None:
                    seen[batch_rows, tokens] = True
                yield new_ids[:, None, : t + 1], generated[:, None]
                if t + 1 == max_new_tokens or (stopping and bool(finished.all())):
                    return
                logits = self.decoder(tokens, pos, kv_bucket(max(lengths) + t + 1, self.max_seq_len))
                pos += 1
                steps += 1
        finally:  # also when a stream is closed early: what the cache holds so far
            if keys is not None:
                fed = generated.clamp(max=steps).tolist()
                self._keep(keys, rows, lengths, new_ids.cpu(), fed)

    def _ends_with_stop_word(self, new_ids, generated, stop_words) -> torch.Tensor:
        """Rows whose generated tokens (new_ids [B, t], generated [B] of them) end with one of their stop words: [B]."""
        ends = [ends_with_stop_word(new_ids[r, : int(generated[r])].tolist(), w) for r, w in enumerate(stop_words)]
        return torch.tensor(ends, dtype=torch.bool, device=self.device)

    @torch.inference_mode()
    def _beam_steps(self, keys, embeds, search: BeamSearch):
        """Beam search: yields the running beams after every token, then the finished ones ([B, k, T], [B, k])."""
        lengths, k = [len(e) for e in embeds], search.k
        rows = [range(r * k, (r + 1) * k) for r in range(len(lengths))]
        logits = self._prefill(keys, embeds, rows)
        if keys is not None:  # every beam row holds the prompt: its blocks are kept now
            self._keep(keys, rows, lengths)
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
