"""The two articles' claims, in our words: what is known of each, the one kind of evidence that settles it, and its
verdict (docs/articles.md's table, notebook 13's verdicts).

Evidence is exactly one of: "measured: …" on code or hardware this project did not write (PyTorch, transformers,
tiktoken, the CPU or GPU); "source: owner/repo@commit path" for the upstream lines notebook 13 or docs/articles.md
quotes; or "not checkable here: …". The package agreeing with itself is a demonstration, never evidence, and a
definition (float16 takes 2 bytes) is not a measurement.
"""

import re
from dataclasses import dataclass

VERDICTS = ("confirmed", "partly confirmed", "corrected", "not reproduced", "not checkable here")
EVIDENCE_KINDS = ("measured", "source", "not checkable here")
TRTLLM = "NVIDIA/TensorRT-LLM"
QWEN_VL_FILES = "x1ngzai/Qwen-VL-Chat-Int4@1cd721a2"  # a copy of Hugging Face's Qwen/Qwen-VL-Chat-Int4 files
SOURCE_PART = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{8} [\w./-]+(, [\w./-]+)*")


def check_verdict(verdict: str, where: str = "") -> None:
    """Raise unless `verdict` is one of VERDICTS (`where` starts the message)."""
    if verdict not in VERDICTS:
        raise ValueError(f"{where}verdict must be one of {VERDICTS}, got {verdict!r}")


@dataclass(frozen=True)
class Claim:
    """One claim of the two articles, in our words: what is known, the evidence that settles it, and its verdict.

    `evidence` is exactly one of "measured: …" (on code or hardware this project did not write), "source: owner/repo@
    commit path[, path][; owner/repo@commit path]" (upstream lines, quoted in notebook 13 or docs/articles.md) or "not
    checkable here: …".
    """

    id: str  # "C12"
    article: int  # 1 or 2
    section: str  # "§1.2"
    claim: str
    known: str
    evidence: str
    verdict: str

    def __post_init__(self):
        check_verdict(self.verdict, f"{self.id}: ")
        kind, _, detail = self.evidence.partition(": ")
        if kind not in EVIDENCE_KINDS or not detail:
            raise ValueError(
                f"{self.id}: evidence must start with one of {EVIDENCE_KINDS} and ': ', got {self.evidence!r}"
            )
        if kind == "source" and not all(SOURCE_PART.fullmatch(part) for part in detail.split("; ")):
            raise ValueError(f"{self.id}: a source is 'owner/repo@commit path[, path]', '; ' between repositories")
        if (kind == "not checkable here") != (self.verdict == "not checkable here"):
            raise ValueError(f"{self.id}: 'not checkable here' evidence goes with the verdict 'not checkable here'")
        if "|" in self.claim + self.known + self.evidence:
            raise ValueError(f"{self.id}: no '|' in the text (it is a cell of a Markdown table)")

    @property
    def kind(self) -> str:
        """The kind of evidence: "measured", "source" or "not checkable here"."""
        return self.evidence.partition(": ")[0]

    def __str__(self) -> str:
        return (
            f"{self.id} · {self.evidence}"
            if self.kind == "not checkable here"
            else f"{self.id} · {self.verdict} · {self.evidence}"
        )


CLAIMS = (
    Claim(
        "C1",
        1,
        "§1",
        "A 224 × 224 picture becomes 196 patches of 768 dimensions.",
        "A generic ViT-B/16's numbers. Qwen-VL-Chat resizes every picture to 448 × 448 and cuts 14-pixel patches: "
        "1024 patches of width 1664, which the resampler turns into 256 vectors of 4096.",
        f"source: {QWEN_VL_FILES} config.json, visual.py",
        "corrected",
    ),
    Claim(
        "C2",
        1,
        "§2.1",
        "Fake ids start at the vocabulary size, 151643.",
        "151643 is the number of BPE pieces in qwen.tiktoken, so the id of the first special token. run.py starts "
        "the fake ids at config.vocab_size, which Qwen-VL-Chat's config.json sets to 151936.",
        f"source: {TRTLLM}@25b6cdd8 examples/models/core/qwenvl/run.py; {QWEN_VL_FILES} config.json",
        "corrected",
    ),
    Claim(
        "C3",
        1,
        "§2.2",
        "An example sequence [151652, 151653, …, 151848, 13, 456, 789], the patches 151653–151848.",
        "Not Qwen-VL's ids: its <img> is 151857 (config.json's visual.image_start_id) and its fake ids run from "
        "151936. Nor Qwen2-VL's numbering: only the first id plays the same part there (151652, vision_start); "
        "151653, a patch in the article, is Qwen2-VL's vision_end, and Qwen2-VL writes one id, image_pad 151655, at "
        "every image position, where the article gives each patch its own. The 196 ids 151653–151848 are the "
        "article's own 224 × 224 example (C1).",
        "measured: transformers' Qwen2VLConfig() defaults: vision_start_token_id 151652 (the article's first id), "
        "vision_end_token_id 151653 (a patch in the article), image_token_id 151655",
        "corrected",
    ),
    Claim(
        "C4",
        1,
        "§3.1",
        "ptuning_setup builds a lookup table that gradients can update.",
        "In TensorRT-LLM the table is an input of the engine, handed to PromptTuningEmbedding.forward with the ids "
        "on every call; only the vocabulary embedding is a weight. Nothing updates it at inference: 'gradient' "
        "comes from prompt tuning, where such tables are trained.",
        f"source: {TRTLLM}@0f02b7af tensorrt_llm/layers/embedding.py; {TRTLLM}@03ec464e "
        "tensorrt_llm/models/generation_mixin.py",
        "corrected",
    ),
    Claim(
        "C5",
        1,
        "§3.2",
        "The feature lookup is O(1).",
        "It is a gather of one row per fake id: its cost grows with the number of ids, not with the table's size.",
        "measured: PyTorch's gather (torch.nn.functional.embedding) of 256 rows from tables of 256 to 65,536 rows, "
        "timed on this CPU",
        "confirmed",
    ),
    Claim(
        "C6",
        1,
        "§4.2",
        "The prompt table is 1.8× faster than traditional methods.",
        "No method, hardware or measurement is named. A demonstration on the toy model on a CPU: timed like for "
        "like (bare PyTorch ops each), the lookup, Qwen-VL's overwrite and masked_scatter each take well under 1% "
        "of a forward pass.",
        "not checkable here: the article names no method, hardware or measurement",
        "not checkable here",
    ),
    Claim(
        "C7",
        1,
        "§4.2",
        "92% zero-shot accuracy on COCO Captioning.",
        "No run is named, and captions are scored with CIDEr, BLEU or SPICE against reference captions, not with "
        "an accuracy.",
        "not checkable here: no run is named, and captioning has no accuracy to compare",
        "not checkable here",
    ),
    Claim(
        "C8",
        1,
        "§5.2",
        "Batching raises throughput 3–5×.",
        "It depends on the batch and the hardware: a decode step reads every weight once for the whole batch, so "
        "throughput grows nearly with the batch while decoding is bound by memory bandwidth, and 3–5× is one stretch "
        "of that curve. The measurement is of this package's own engine, not TensorRT-LLM, whose scaling is not "
        "measured here.",
        "measured: an NVIDIA H200 running this package's own engine (not TensorRT-LLM) on Qwen-VL-Chat's shapes with "
        "random weights in float16 (data/benchmarks/h200-qwen-vl-chat-fp16.json): 1.91×, 3.71× and 6.93× batch 1's "
        "throughput at batch 2, 4 and 8",
        "partly confirmed",
    ),
    Claim(
        "C9",
        1,
        "§6",
        "Past 500 patches, merging neighbours saves 30% of compute at a 2% loss of accuracy (精度损失2%).",
        "No model, data set or metric is named. Qwen-VL's resampler gives the language model 256 rows per picture "
        "whatever the picture; notebook 13 pools them 2 × 2 on the toy model as a demonstration.",
        "not checkable here: no model, data set or metric is named",
        "not checkable here",
    ),
    Claim(
        "C10",
        1,
        "§5.1",
        "A PromptTable that doubles its capacity when it is full.",
        "An engine's table rows are fixed when it is built: --max_prompt_embedding_table_size (default 0) sets the "
        "optimization profile [1, size / 2, size] of the prompt_embedding_table input; more rows need a new build.",
        f"source: {TRTLLM}@008b2b8d tensorrt_llm/commands/build.py; {TRTLLM}@03ec464e "
        "tensorrt_llm/models/generation_mixin.py",
        "corrected",
    ),
    Claim(
        "C11",
        1,
        "§5.2",
        "One 'unified namespace' of fake ids for a batch's requests, 'batch1' starting at 200000 (如batch1从200000开始).",
        "run.py numbers the fake ids from vocab_size over all pictures of one table; the C++ executor starts every "
        "request at vocab_size and copies its table to row batchIdx × max_prompt_embedding_table_size / "
        "max_batch_size. Neither uses 200000, which would read row 48,064.",
        f"source: {TRTLLM}@25b6cdd8 examples/models/core/qwenvl/run.py; {TRTLLM}@2868d794 "
        "cpp/tensorrt_llm/batch_manager/promptTuningBuffers.cpp",
        "corrected",
    ),
    Claim(
        "C12",
        2,
        "§1.2",
        "image_start_id and image_end_id are set in the model's config.",
        "Qwen-VL-Chat's config.json has visual.image_start_id (151857) and no image_end_id: run.py and Qwen-VL's "
        "own modeling_qwen.py find </img> as image_start_id + 1.",
        f"source: {QWEN_VL_FILES} config.json, modeling_qwen.py; {TRTLLM}@25b6cdd8 examples/models/core/qwenvl/run.py",
        "partly confirmed",
    ),
    Claim(
        "C13",
        2,
        "§3.1",
        "input_vit is [N, 256, 4096].",
        "Correct for Qwen-VL-Chat: the resampler has 256 learned queries (n_queries, a default of visual.py, not "
        "in config.json) and output_dim 4096.",
        f"source: {QWEN_VL_FILES} visual.py, config.json",
        "confirmed",
    ),
    Claim(
        "C14",
        2,
        "§4.1",
        "PyTorch 352 ms, 12.4 GB, 8.2 tokens/s against TensorRT-LLM 187 ms, 9.1 GB, 15.7 tokens/s.",
        "No hardware, batch, lengths, precision or source. TensorRT-LLM's Qwen-VL example once built the language "
        "model in INT4-GPTQ and still titles its run 'INT4 GPTQ weight-only quantization engine'; the language "
        "model alone is 15.4 GB in float16, the Int4 checkpoint 9.73 GB, so which precision the figures mean "
        "cannot be told.",
        "not checkable here: no hardware, precision, batch, lengths or source is named",
        "not checkable here",
    ),
    Claim(
        "C15",
        2,
        "§6.1",
        "The trtllm-build command it gives.",
        "It leaves out --max_prompt_embedding_table_size, whose default 0 builds an engine with no prompt-table "
        "input, and --max_seq_len. run.py's GenerationSession then puts the table among inputs the engine never asks "
        "for, so the picture is dropped without an error (the Python ModelRunner's _prepare_ptuning returns {} "
        "likewise).",
        f"source: {TRTLLM}@008b2b8d tensorrt_llm/commands/build.py; {TRTLLM}@2340c776 "
        f"tensorrt_llm/runtime/generation.py; {TRTLLM}@0243026f tensorrt_llm/runtime/model_runner.py",
        "corrected",
    ),
    Claim(
        "C16",
        2,
        "§6.2",
        "FP16 with loss scaling saves 40% of GPU memory (显存) against FP32.",
        "No model, workload or GPU is named, and a whole-GPU figure includes fixed costs (the CUDA context, "
        "workspaces, a KV cache sized by the build) the article does not give; loss scaling belongs to training. "
        "On a CPU the toy model's weights take about half the resident memory in float16, the whole process far "
        "less than half, since its libraries do not shrink (a demonstration of the principle). For inference, C19's "
        "H200 run held 16.5 GiB at its peak with a float16 engine of Qwen-VL-Chat's shapes and 29.3 GiB in float32, "
        "0.56×, the two engines built for different KV caches: another workload than the article's.",
        "not checkable here: the figure is GPU memory of training with loss scaling, for a model, workload and GPU "
        "the article does not name",
        "not checkable here",
    ),
    Claim(
        "C17",
        2,
        "§5.1",
        "Pad the patch features of a batch to the largest picture.",
        "Every picture is resized to 448 × 448 before the vision tower, so every picture gives the same 256 rows: "
        "there is nothing to pad.",
        f"source: {TRTLLM}@11171a69 examples/models/core/qwenvl/vit_onnx_trt.py; {QWEN_VL_FILES} visual.py",
        "corrected",
    ),
    Claim(
        "C18",
        2,
        "§5.2",
        "For large pictures: torch.cuda.empty_cache(), max_split_size_mb, pin_memory.",
        "They act on PyTorch's CUDA caching allocator and on host copies. An engine's activations are sized when it "
        "is built and its KV cache when it is loaded, and a picture's features are 256 rows whatever its size.",
        f"source: {TRTLLM}@5a211b91 docs/source/reference/memory.md",
        "corrected",
    ),
    Claim(
        "C19",
        2,
        "§6.2",
        "FP32 / FP16 / INT8: memory high / medium / low, quality best / good / acceptable.",
        "No INT8 scheme is named; TensorRT-LLM's Qwen-VL recipe builds the language model weight-only (int8 "
        "matrices with one scale per output channel, float16 activations and KV cache), as this package's engine "
        "does. On one H200, at Qwen-VL-Chat's shapes with random weights, the engine's peak memory at batch 1 orders "
        "as the article says, the INT8 engine holding 0.58× the float16 weights (lm_head and the embedding stay "
        "float16), and INT8 decodes 1.16× float16 at batch 1, not 2×. Quality: the course's toy model answers 500 "
        "held-out questions alike in every precision (0.996, a demonstration); at full size INT8 moves the logits 17 % from float16, "
        "same top token at 61 % of the steps, on random weights (the margins between their best logits were not "
        "recorded). Not checkable here: a "
        "trained Qwen-VL-Chat's benchmark quality in each precision, and TensorRT-LLM's own INT8 kernels.",
        "measured: an NVIDIA H200 running this package's own engine (not TensorRT-LLM) on Qwen-VL-Chat's shapes "
        "with random weights (data/benchmarks/int8/): peak GPU memory at batch 1 of 29.3, 16.5 and 10.7 GiB in "
        "float32, float16 and weight-only INT8 (the float32 engine built for a smaller KV cache: its figure, if "
        "anything, low); the quality column is not checkable here",
        "partly confirmed",
    ),
    Claim(
        "C20a",
        1,
        "§4.1",
        "CLIP fuses early, at the encoder (前融合, 编码器级).",
        "CLIP fuses nothing: its text and image towers run apart, and the only joint quantity is the scaled cosine "
        "of their pooled projections.",
        "measured: transformers' CLIPModel (random weights, a small config): each tower's outputs are bit-identical "
        "whatever the other input, and logits_per_image is logit_scale.exp() × the cosine of the two projections",
        "corrected",
    ),
    Claim(
        "C20b",
        1,
        "§4.1",
        "The prompt table fuses in the middle, at the embeddings (中融合, 嵌入级).",
        "The picture's rows replace the span's embeddings before the first layer: Qwen-VL's forward writes them "
        "into the embedded hidden states, TensorRT-LLM's PromptTuningEmbedding looks them up in place of "
        "vocabulary rows.",
        f"source: {QWEN_VL_FILES} modeling_qwen.py; {TRTLLM}@0f02b7af tensorrt_llm/layers/embedding.py",
        "confirmed",
    ),
    Claim(
        "C21a",
        1,
        "§4.1",
        "CLIP works on global image features (全局图像特征).",
        "What CLIP compares is one pooled, projected vector per picture; its vision tower computes one vector per "
        "patch inside, then pools.",
        "measured: transformers' CLIPModel: image_embeds is [pictures, projection_dim] while the vision tower's "
        "last hidden state is [pictures, 1 + patches, width]",
        "confirmed",
    ),
    Claim(
        "C21b",
        1,
        "§4.1",
        "The prompt table carries fine-grained patch features (细粒度patch特征).",
        "It carries 256 rows made by the resampler's learned queries, each attending over all 1024 patches: finer "
        "than one vector, but not patch features.",
        f"source: {QWEN_VL_FILES} visual.py",
        "corrected",
    ),
    Claim(
        "C22a",
        1,
        "§4.1",
        "CLIP concatenates the features, then processes them (特征拼接后处理).",
        "CLIP concatenates nothing: no layer sees the text and the picture together.",
        "measured: transformers' CLIPModel: each tower's hidden states are unchanged when the other input changes, "
        "and neither tower's sequence is as long as the text and the patches together",
        "corrected",
    ),
    Claim(
        "C22b",
        1,
        "§4.1",
        "The prompt table works by dynamic token replacement (动态token替换).",
        "run.py overwrites the span between <img> and </img> with fake ids: the sequence keeps its length and its "
        "tags.",
        f"source: {TRTLLM}@25b6cdd8 examples/models/core/qwenvl/run.py",
        "confirmed",
    ),
    Claim(
        "C23a",
        1,
        "§4.1",
        "CLIP has a fixed processing pipeline per modality (固定模态处理流程).",
        "A judgement about design: CLIP has one tower per modality, but whether that is 'fixed' is not a property "
        "a run shows.",
        "not checkable here: a judgement about design, not a property a run or a source shows",
        "not checkable here",
    ),
    Claim(
        "C23b",
        1,
        "§4.1",
        "The prompt table extends to new modalities (可扩展新模态).",
        "The lookup takes any [rows, hidden] table at run time, and TensorRT-LLM names the same build option "
        "--max_multimodal_len for other encoders' outputs; a model must still be trained to read a new modality's "
        "rows.",
        f"source: {TRTLLM}@0f02b7af tensorrt_llm/layers/embedding.py; {TRTLLM}@008b2b8d tensorrt_llm/commands/build.py",
        "partly confirmed",
    ),
    Claim(
        "C24",
        1,
        "§3.2",
        "Space efficiency: visual features are stored only when they are needed (空间效率).",
        "A request's table holds only its own pictures' rows (run.py's ptuning_setup), but the C++ runtime reserves "
        "a [max_prompt_embedding_table_size, hidden] buffer on the GPU when it starts and zeroes it every step, "
        "whatever the requests hold.",
        f"source: {TRTLLM}@2868d794 cpp/tensorrt_llm/batch_manager/promptTuningBuffers.cpp; {TRTLLM}@25b6cdd8 "
        "examples/models/core/qwenvl/run.py",
        "partly confirmed",
    ),
    Claim(
        "C25",
        1,
        "§5.1",
        "CUDA unified memory cuts the copies of a growing table (采用CUDA统一内存减少拷贝开销).",
        "An idea to discuss. TensorRT-LLM does not grow the table (C10): it copies each request's table into a fixed "
        "device buffer every step, and its offloading option keeps tables in pinned host memory, not unified memory.",
        "not checkable here: it needs a GPU, and the article gives no implementation or figure",
        "not checkable here",
    ),
    Claim(
        "C26",
        1,
        "§5.2",
        "Masks keep apart the visual features of a batch's samples (使用掩码区分不同样本的视觉特征).",
        "The lookup's one mask (id > vocab_size - 1) separates image ids from text ids. The samples are kept apart "
        "by where their rows are: distinct ids over one table (run.py) or tasks × the block size (C++ executor).",
        f"source: {TRTLLM}@0f02b7af tensorrt_llm/layers/embedding.py",
        "corrected",
    ),
    Claim(
        "C27",
        1,
        "§6",
        "The same mechanism extends to audio and video (跨模态共享).",
        "An idea, partly in use: TensorRT-LLM's Triton backend sends a video model's frames through the same table "
        "(LLaVA OneVision's max_multimodal_len counts video frames); audio is not shown here.",
        "source: triton-inference-server/tensorrtllm_backend@05ceae03 docs/multimodal.md",
        "partly confirmed",
    ),
    Claim(
        "C28",
        1,
        "§6",
        "Online updates of the visual vocabulary learn new concepts (动态词表更新).",
        "An idea. Every request already brings its own table, built from its pictures; learning new concepts needs "
        "training, which no inference engine does.",
        "not checkable here: a proposal with no method or experiment",
        "not checkable here",
    ),
    Claim(
        "C29",
        1,
        "§6",
        "Hierarchical prompts from local patches to global meaning (分层prompt).",
        "An idea; its one figure is C9's.",
        "not checkable here: a proposal with no method or experiment",
        "not checkable here",
    ),
    Claim(
        "C30",
        1,
        "§4.2",
        "TensorRT-LLM's kernel fusion speeds up the feature lookup (kernel融合优化特征查询).",
        "The lookup is built from where, embedding and where operations; which of them TensorRT fuses is decided "
        "when the engine is built, and shows only in a build log or a profile on a GPU.",
        "not checkable here: it needs TensorRT on a GPU",
        "not checkable here",
    ),
    Claim(
        "C31",
        2,
        "§4.1",
        "generate_for_qwenvl returns output_ids and infer_time.",
        "It does, and infer_time is the mean of 10 whole generations (setup and decode, timed by run.py's "
        "profiler): run.py generates every answer ten times.",
        f"source: {TRTLLM}@25b6cdd8 examples/models/core/qwenvl/run.py",
        "confirmed",
    ),
    Claim(
        "C32",
        2,
        "§5.1",
        "Masks mark the valid features, and dynamic bucketing groups pictures by size (掩码机制, 动态分桶).",
        "Not needed for Qwen-VL: every picture is resized to the same square and gives 256 rows (C17), so there is "
        "nothing to mask or bucket.",
        f"source: {TRTLLM}@11171a69 examples/models/core/qwenvl/vit_onnx_trt.py",
        "corrected",
    ),
)
RECORDED = {c.id: c for c in CLAIMS}


def recorded(claim_id: str) -> Claim:
    """The recorded claim `claim_id` ("C12")."""
    if claim_id not in RECORDED:
        raise KeyError(f"no claim {claim_id!r}; the claims are {', '.join(RECORDED)}")
    return RECORDED[claim_id]


def claims_table() -> str:
    """docs/articles.md's table of the claims (Markdown), one row per claim, from CLAIMS."""
    rows = ["| # | the claim (article, section) | what is known | evidence | verdict |", "|---|---|---|---|---|"]
    for c in CLAIMS:
        claim, known, evidence = (text.replace("<", "&lt;") for text in (c.claim, c.known, c.evidence))  # <img> is text
        rows.append(f"| {c.id} | {claim} *(article {c.article}, {c.section})* | {known} | {evidence} | {c.verdict} |")
    return "\n".join(rows)


def verdict_counts() -> dict:
    """How many claims have each verdict: {verdict: count}, in the order of VERDICTS, zero counts left out."""
    counts = {v: sum(c.verdict == v for c in CLAIMS) for v in VERDICTS}
    return {v: n for v, n in counts.items() if n}


def verdict_summary() -> str:
    """One sentence: how many claims there are and how many have each verdict."""
    counts = ", ".join(f"{n} {v}" for v, n in verdict_counts().items())
    return f"{len(CLAIMS)} claims: {counts}."
