"""Notebook 06 — the engine's runner: TensorRT-LLM's ModelRunner in PyTorch, each request checked, then generated."""

import json
import os
import warnings
from collections import deque
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..checks.values import check_model_limits
from ..layout import to_trtllm_names
from ..limits import BuildConfig
from ..prompt_table import lookup
from ..requests import GenerationStream, OneGeneration, check_request, check_sampling, check_stop_words
from ..tokenizing import IM_END_ID
from ..unified_checkpoint import trtllm_config
from .beam_search import BeamSearch
from .build import TUNING_FILE, load_engine_config, load_engine_weights
from .cuda_graphs import DecodeGraphs
from .decode import choose_backend, make_decode_step
from .forward import LanguageModelEngine
from .sampling import penalize_repetition, sample_tokens


class ModelRunner:
    """An engine ready to generate: its limits, its weights on one device, a KV cache sized by the build, and one
    decode back end (`engine.decode`: "auto", "torch", "compiled", "triton" or "numba")."""

    def __init__(
        self,
        build_config: BuildConfig,
        pretrained_config: dict,
        weights: dict,
        device="cpu",
        decode_backend: str = "auto",
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
        rows = build_config.max_batch_size * build_config.max_beam_width
        self.decode_backend = choose_backend(decode_backend, device, self.dtype, rows)
        self.engine = LanguageModelEngine(build_config, pretrained_config, weights, device)
        self.decode_step = make_decode_step(self.decode_backend, self.engine)
        # on CUDA every decode step is a CUDA-graph replay (one graph per batch size and KV-length bucket)
        self.decoder = (
            DecodeGraphs(self.decode_step, rows, build_config.max_seq_len, device)
            if device.type == "cuda"
            else self.decode_step
        )
        self.turn = OneGeneration()  # one generation at a time holds the KV cache
        self.tuning_file = None if tuning_file is None else Path(tuning_file)
        self._load_choices()

    @classmethod
    def from_dir(
        cls, engine_dir, device="cpu", decode_backend: str = "auto", warm_up=None, verify: str = "full"
    ) -> "ModelRunner":
        """Load an engine directory written by build_engine onto `device`, every file checked against its manifest
        (`verify`: "full" reads every byte, "quick" samples large files, "none" checks sizes; see verify_engine);
        warm_up (default: on CUDA) does the decode step's first run now rather than in the first question."""
        build_config, pretrained = load_engine_config(engine_dir, verify)
        runner = cls(
            build_config,
            pretrained,
            load_engine_weights(engine_dir),
            device,
            decode_backend,
            engine_dir,
            Path(engine_dir) / TUNING_FILE,
        )
        if runner.device.type == "cuda" if warm_up is None else warm_up:
            runner.warm_up()
        return runner

    @classmethod
    def from_model(
        cls, model, build_config: BuildConfig, device=None, decode_backend: str = "auto", tuning_file=None
    ) -> "ModelRunner":
        """Build the engine in memory from a QWenLMHeadModel (no files; used by the benchmark at full size)."""
        device = next(model.parameters()).device if device is None else device
        pretrained = trtllm_config(model.config, build_config.dtype)
        return cls(
            build_config,
            pretrained,
            to_trtllm_names(model.state_dict()),
            device,
            decode_backend,
            tuning_file=tuning_file,
        )

    @property
    def busy(self) -> bool:
        """True while a generation runs or a streaming generation is open."""
        return self.turn.busy

    def warm_up(self, progress: bool = True) -> None:
        """Do now what the first question would otherwise wait for: a prefill, and the decode step's first run for one
        row — Triton's autotuning, numba's or torch.compile's compilation, the first CUDA graph. The Triton kernels'
        tuned choices are saved beside the engine (tuning.json) and reused by the next process that loads it."""
        ids = torch.zeros(1, dtype=torch.long, device=self.device)
        stages = {
            "prefill": lambda: self.engine.prefill(self.engine.embed(ids), [1], [range(0, 1)]),
            "decode step": lambda: self.decoder(ids, ids, 1),
        }
        self.turn.begin()
        try:
            with torch.inference_mode():
                for name in tqdm(stages, desc="warming up", disable=not progress):
                    stages[name]()
        finally:
            self.turn.end()
        self._save_choices()

    def _tuning(self) -> dict:
        """tuning.json's entries ({tuning key: choices}), {} when there is none or it cannot be read."""
        try:
            entries = json.loads(self.tuning_file.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def _load_choices(self) -> None:
        """Hand the decode back end the choices tuned for this GPU earlier, if it tunes and they were saved."""
        if self.tuning_file is None or self.device.type != "cuda" or not hasattr(self.decode_step, "use_choices"):
            return
        choices = self._tuning().get(self.decode_step.tuning_key())
        if isinstance(choices, list):
            self.decode_step.use_choices(choices)

    def _save_choices(self) -> None:
        """Write the back end's tuned choices for this GPU into tuning.json (a read-only engine is left as it is)."""
        if self.tuning_file is None or self.device.type != "cuda" or not hasattr(self.decode_step, "choices"):
            return
        entries = self._tuning()
        key, choices = self.decode_step.tuning_key(), self.decode_step.choices()
        if entries.get(key) == choices:
            return
        entries[key] = choices
        try:
            staging = self.tuning_file.with_suffix(".json.tmp")
            staging.write_text(json.dumps(entries, indent=1) + "\n")
            os.replace(staging, self.tuning_file)
        except OSError as err:
            warnings.warn(
                f"could not save the tuned kernel choices to {self.tuning_file} ({err}); the next process "
                "will tune them again",
                stacklevel=2,
            )

    def __repr__(self):
        b = self.build_config
        return (
            f"ModelRunner(device={str(self.device)!r}, dtype={b.dtype}, max_batch_size={b.max_batch_size}, "
            f"max_input_len={b.max_input_len}, max_seq_len={b.max_seq_len}, "
            f"max_prompt_embedding_table_size={b.max_prompt_embedding_table_size}, max_beam_width={b.max_beam_width}, "
            f"decode_backend={self.decode_backend!r})"
        )

    @torch.inference_mode()
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
        """Generate for a batch of requests (list of 1-D ids); output_ids [B, beams, max input + max_new_tokens].

        Each row holds the request's ids, then its new tokens (the end_id or stop word that stopped it included), then
        pad_id. prompt_table, as TensorRT-LLM's Python ModelRunner takes it: [rows, H] (with prompt_tasks "0,0,…" and
        task_vocab_size) or [tables, rows, H] (task_vocab_size = rows; tasks default to table r for request r, or
        table 0 when there is one); no block size is fixed at build, unlike the C++ executor's. Greedy is
        top_k=1 (or top_k=0, top_p=0); otherwise temperature, top_k (0 = off) and top_p sample; repetition_penalty
        (transformers' rule, over the request's vocabulary ids and its new tokens) applies to both. num_beams > 1 is
        beam search with transformers' semantics. end_id=-1 never stops; stop_words_list (one list of token-id
        sequences per request, as TensorRT-LLM takes it) stops a request once its new tokens end with one of them.
        streaming=True returns a GenerationStream of the same outputs after every step. return_dict=True gives
        {"output_ids", "sequence_lengths"}. Threads may share the runner: a call waits for the generation running
        (one at a time holds the KV cache), and is refused while a streaming generation is open.
        """
        greedy = check_sampling(
            temperature, top_k, top_p, length_penalty, random_seed, repetition_penalty, early_stopping
        )
        request = check_request(
            self.build_config,
            self.vocab_size,
            self.hidden_size,
            batch_input_ids,
            prompt_table,
            prompt_tasks,
            task_vocab_size,
            max_new_tokens,
            num_beams,
            end_id,
            pad_id,
        )
        stop_words = check_stop_words(stop_words_list, len(request.ids), self.vocab_size)
        if num_beams > 1 and not greedy:
            raise ValueError("beam search picks the best beams, it does not sample: leave top_k=1 with num_beams > 1")
        if num_beams > 1 and (repetition_penalty != 1.0 or stop_words is not None):
            raise ValueError(
                "repetition_penalty and stop_words_list apply to greedy and sampled decoding here, not to "
                "beam search: leave them out with num_beams > 1"
            )
        self.turn.begin(streaming)
        stream = None
        try:
            requests = [ids.to(self.device) for ids in request.ids]
            table = None if request.table is None else request.table.to(self.device)
            embeds = [self._embed(ids, table, request, r) for r, ids in enumerate(requests)]
            if num_beams > 1:
                search = BeamSearch(
                    len(requests),
                    num_beams,
                    max_new_tokens,
                    end_id,
                    pad_id,
                    length_penalty,
                    early_stopping,
                    self.device,
                )
                steps = self._beam_steps(requests, embeds, search)
            else:
                generator = None
                if random_seed is not None:
                    generator = torch.Generator(device=self.device).manual_seed(random_seed)

                def pick(logits, seen):
                    if repetition_penalty != 1.0:
                        logits = penalize_repetition(logits, seen, repetition_penalty)
                    return sample_tokens(logits, temperature, top_k, top_p, generator)

                steps = self._sampling_steps(
                    requests,
                    embeds,
                    max_new_tokens,
                    end_id,
                    pad_id,
                    pick,
                    stop_words,
                    track_seen=repetition_penalty != 1.0,
                )
            if streaming:
                stream = GenerationStream(
                    steps, lambda step: self._outputs(requests, *step, pad_id, max_new_tokens, return_dict), self.turn
                )
                return stream
            last = deque(steps, maxlen=1)[0]  # run every step, keep the last one's outputs
            return self._outputs(requests, *last, pad_id, max_new_tokens, return_dict)
        finally:
            if stream is None:  # else the stream frees the runner when it ends
                self.turn.end()

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
        for t in range(max_new_tokens):
            tokens = pick(logits, seen)  # [B]
            if stopping:  # rows that ended get pad_id
                tokens = torch.where(finished, pad_id, tokens)
                generated += ~finished
                finished |= tokens == end_id
            else:
                generated += 1
            new_ids[:, t] = tokens
            if stop_words is not None:
                finished |= self._ends_with_stop_word(new_ids[:, : t + 1], generated, stop_words)
            if seen is not None:
                seen[rows, tokens] = True
            yield new_ids[:, None, : t + 1], generated[:, None]
            if t + 1 == max_new_tokens or (stopping and bool(finished.all())):
                return
            logits = self.decoder(tokens, pos, max(lengths) + t + 1)
            pos += 1

    def _ends_with_stop_word(self, new_ids, generated, stop_words) -> torch.Tensor:
        """Rows whose generated tokens (new_ids [B, t], generated [B] of them) end with one of their stop words: [B]."""
        ends = torch.zeros(new_ids.shape[0], dtype=torch.bool, device=self.device)
        for r, words in enumerate(stop_words):
            tail = new_ids[r, : int(generated[r])].tolist()
            ends[r] = any(len(w) <= len(tail) and tuple(tail[len(tail) - len(w) :]) == w for w in words)
        return ends

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
