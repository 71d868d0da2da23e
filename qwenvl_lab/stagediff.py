"""`qwenvl-lab diff`: two per-stage dumps compared stage by stage, and the first stage that diverges named.

Each feature stage gets its largest and mean absolute error, its relative error ‖B − A‖ / ‖A‖ and its cosine
similarity, and diverges when the relative error passes a tolerance that follows the dtypes: the unit roundoff u of
the coarser of the two runs' dtypes (float32 2⁻²⁴, float16 2⁻¹¹, bfloat16 2⁻⁸), times the stage's depth (the layers
its numbers went through), times a factor measured on the package's own implementations (docs/diff.md says how). Ids
are compared exactly; the table as the fake ids read it. The first stage that diverges is named with what usually
causes a divergence there and the evidence for it: an issue thread or upstream source, quoted for what it says.
"""

import math
from dataclasses import asdict, dataclass, field

import torch

from .dump import LAYER_NAME, Dump, pipeline_order, stage
from .prompt_table import rows_read

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# a layer's share of the tolerance: STORAGE · u (its results rounded to the run's dtype) + ACCUMULATION · u_float32 ·
# √n (float32 sums of n products in another order); each a few times the largest measured (docs/diff.md)
STORAGE, ACCUMULATION = 4.0, 0.5
QWEN_VL_CHAT_SIZES = {"vision_layers": 48, "lm_layers": 32, "hidden_size": 4096}  # a dump that does not say
# same: bit for bit; within: inside the tolerance; diverges: beyond it (ids: they differ); carried: a stage after the
# first that diverges and not the same: its difference may be the first one's alone, and a second cause behind it
# cannot be told apart until the first is fixed
STATUS = ("same", "within", "diverges", "carried", "only in A", "only in B", "not compared")


@dataclass(frozen=True)
class Evidence:
    """Why a cause is named: an issue thread (`where` "owner/repo#N", its title) or upstream source (`where`
    "owner/repo@commit path"), and what it says, quoted or summarised with its words."""

    where: str
    title: str
    says: str


@dataclass(frozen=True)
class Cause:
    """What usually makes a pipeline step diverge, and the evidence for it."""

    step: str
    usually: str
    evidence: tuple[Evidence, ...]


TRTLLM = "NVIDIA/TensorRT-LLM"
RUN_PY = Evidence(
    f"{TRTLLM}@25b6cdd8d6ab4b78fd92263b7a9d8e8206cfaca9 examples/models/core/qwenvl/run.py",
    "run.py, QWenInfer",
    'reads generation_config.json\'s knobs, `top_k = gen_config["top_k"]`, `top_p = gen_config["top_p"]`, into '
    "`SamplingConfig(end_id=eos_token_id, pad_id=pad_token_id, num_beams=self.num_beams, top_k=top_k, top_p=top_p, "
    "temperature=1.0)`: Qwen-VL-Chat's file says top_k 0, top_p 0.3, so run.py samples",
)
VIT_ONNX_TRT = f"{TRTLLM}@11171a69f99333a514abf93edacab8c695b2a3c6 examples/models/core/qwenvl/vit_onnx_trt.py"
EMBEDDING_PY = f"{TRTLLM}@0f02b7afe1ccee149d2b85e503fda25288a938f0 tensorrt_llm/layers/embedding.py"
ISSUE_1483 = Evidence(
    f"{TRTLLM}#1483",
    "Qwen-VL-Chat vit embedding diff",
    "the vision plan's embeddings differed from the PyTorch model's for the same picture; the maintainer: \"If the ViT "
    'engine and the input are same, the results are expected the same", and "the fp32 accuracy of it on TRT9.3 is '
    'alined with Pytorch … the fp16 accuracy of it on TRT10.x is fine"; a user on TensorRT 10.0.1: "got the same diff"',
)
CAUSES = {
    "preprocessing": Cause(
        "preprocessing",
        "the pictures were resized or normalised differently: Qwen-VL resizes to the tower's size (448 × 448) with "
        "bicubic interpolation, the aspect ratio not kept, and normalises with CLIP's mean and std; another "
        "interpolation or library, a kept aspect ratio, pixels left in 0–255 or other mean/std change every pixel",
        (
            Evidence(
                VIT_ONNX_TRT,
                "Preprocss",
                "TensorRT-LLM's Qwen-VL example preprocesses with `transforms.Resize((image_size, image_size), "
                "interpolation=InterpolationMode.BICUBIC)`, `transforms.ToTensor()`, `transforms.Normalize(mean=mean, "
                "std=std)`, mean (0.48145466, 0.4578275, 0.40821073), std (0.26862954, 0.26130258, 0.27577711)",
            ),
            ISSUE_1483,
        ),
    ),
    "vision": Cause(
        "vision",
        "the vision tower's arithmetic: a float16 plan or graph where float32 was meant (TensorRT's FP16 flag may run "
        "any layer in float16, normalisations included), TF32 convolutions in a float32 run on a GPU (PyTorch's "
        "torch.backends.cudnn.allow_tf32 is on by default), another TensorRT version, or other tower weights",
        (
            ISSUE_1483,
            Evidence(
                f"{TRTLLM}#3223",
                "Qwen2.5-vl vit accuracy when convert onnx to tensorrt",
                "a user, for Qwen2.5-VL-3B's tower (TensorRT 10.16, RTX 4090): output cosine against PyTorch 0.14 with "
                '`--fp16`, 0.9997 built `--strongly-typed`, which "obeys the dtypes already encoded in the ONNX '
                "graph\" (a user's report, for Qwen2.5-VL)",
            ),
            Evidence(VIT_ONNX_TRT, "ONNX_TRT", "builds the plan with `config.set_flag(trt.BuilderFlag.FP16)`"),
        ),
    ),
    "prompt": Cause(
        "prompt",
        "the prompt: another chat template or system prompt, other picture paths in the spans, or the image "
        "placeholders placed elsewhere in the text",
        (
            Evidence(
                f"{TRTLLM}#16792",
                "TensorRT-LLM PyTorch backend Qwen3.5-VL parity issue: HF/vLLM greedy output matches, TRT-LLM repeats "
                "to max tokens",
                'the reporter, after logging the prompt: "TensorRT-LLM was not preserving the OpenAI multimodal '
                'content order for this request shape" — every image placeholder before the user text, where '
                "Hugging Face and vLLM interleave them (open, for Qwen3.5-VL)",
            ),
        ),
    ),
    "fake ids": Cause(
        "fake ids",
        "the fake ids: they start at the model's vocab_size (151936 for Qwen-VL-Chat); ids below it — from 151643, "
        "the tokenizer's <|endoftext|>, where article 1 starts them — are vocabulary ids and read the vocabulary, "
        "not the prompt table",
        (
            Evidence(
                RUN_PY.where,
                "run.py, qwen_infer",
                "`vocab_size = self.config.vocab_size`, `fake_prompt_id = torch.arange(vocab_size, vocab_size + "
                "input_vit.shape[0] * input_vit.shape[1], …)`",
            ),
            Evidence(
                EMBEDDING_PY,
                "PromptTuningEmbedding.forward",
                "`prompt_tokens_mask = tokens > (self.vocab_size - 1)`: only ids from vocab_size on read the table",
            ),
        ),
    ),
    "table": Cause(
        "table",
        "the prompt table: its pictures' rows in another order than the image spans, a wrong task_vocab_size or "
        "tasks (the fake ids then read another block), or rows cut or padded differently",
        (
            Evidence(
                EMBEDDING_PY,
                "PromptTuningEmbedding.forward",
                "`prompt_tokens = where(prompt_tokens_mask, tokens - self.vocab_size, 0)`, `tasks = tasks * "
                "task_vocab_size`, `prompt_tokens = prompt_tokens + tasks`: the row a fake id reads",
            ),
            Evidence(
                RUN_PY.where,
                "run.py, ptuning_setup",
                "`task_vocab_size = torch.tensor([prompt_table.shape[1]], …)`, the table `prompt_table.view("
                "(prompt_table.shape[0] * prompt_table.shape[1], prompt_table.shape[2]))`: the pictures' rows in the "
                "order of input_vit, which must be the spans' order",
            ),
        ),
    ),
    "embeddings": Cause(
        "embeddings",
        "the lookup that merges text and pictures: fake ids below vocab_size read vocabulary rows, another vocabulary "
        "embedding, or the rows written at other positions",
        (
            Evidence(
                EMBEDDING_PY,
                "PromptTuningEmbedding.forward",
                "`normal_tokens = where(prompt_tokens_mask, self.vocab_size - 1, tokens)` … `return "
                "where(unsqueeze(prompt_tokens_mask, -1), prompt_embeddings, normal_embeddings)`",
            ),
        ),
    ),
    "layers": Cause(
        "layers",
        "the weight mapping: Qwen's MLP is c_proj(w1(x) · silu(w2(x))) and TensorRT-LLM's GatedMLP SiLU(FC(x)) · "
        "Gate(x), so w2 must become fc and w1 gate — swapped, every layer's output changes; likewise the split of "
        "c_attn into q, k, v, the RoPE style or the norms' epsilon. Drift that grows layer by layer without a jump is "
        "precision, not mapping",
        (
            Evidence(
                f"{TRTLLM}@04a2cacbfd3b9ac76191bd8498ad871607b63a04 tensorrt_llm/layers/mlp.py",
                "GatedMLP.fc_gate",
                "the comment `SiLU(FC(x)) * Gate(x)`: fc is the input of the activation, gate the factor",
            ),
        ),
    ),
    "logits": Cause(
        "logits",
        "the output layer: lm_head (Qwen-VL-Chat's is untied: tying it to the embedding, or padding the vocabulary, "
        "changes the logits), the final norm ln_f, or the logits' dtype",
        (
            Evidence(
                f"{TRTLLM}@0428c18828880e7c60c13cc5cc0794bbbc05c0a3 tensorrt_llm/models/qwen/convert.py",
                "convert_hf_qwen",
                "`if hf_config.tie_word_embeddings: lm_head_weights = v.clone()` `else: lm_head_weights = "
                "get_weight(model_params, 'lm_head', dtype)`, then pads the vocabulary to a multiple of tp_size",
            ),
        ),
    ),
    "decoding": Cause(
        "decoding",
        "the decoding settings: sampling (Qwen-VL-Chat's generation_config.json: top_p 0.3) where greedy was meant, "
        "another seed, repetition penalty or stop ids; with first logits that agree, also a near-tie between the two "
        "best tokens that normal drift tips",
        (
            RUN_PY,
            Evidence(
                f"{TRTLLM}#3235",
                "Qwen2-VL output diff b/w huggingface and Tensorrt-LLM",
                'a maintainer: "Even with the same weights, minor differences can occur due to differences in default '
                'configs (e.g., sampling config)." (open)',
            ),
            Evidence(
                f"{TRTLLM}#2241",
                "The accuracy of trt-llm-qwen-vl-chat is low.",
                "boxes from run_chat.py, (539,512),(588,600), against Hugging Face's (536,509),(588,602); the Hugging "
                "Face script calls `torch.manual_seed(1234)` and loads Qwen-VL-Chat's GenerationConfig, which samples "
                "(#2206, fp16 and fp32 engines both differing from Qwen-VL, was closed as its duplicate)",
            ),
        ),
    ),
}


@dataclass
class StageResult:
    """One stage of the comparison: its status (STATUS), sizes, errors and the tolerance it was held to."""

    name: str
    step: str
    status: str
    shape_a: list | None = None
    shape_b: list | None = None
    max_abs: float | None = None
    mean_abs: float | None = None
    rel: float | None = None
    cosine: float | None = None
    tolerance: float | None = None
    dtype: str | None = None  # whose unit roundoff the tolerance uses
    depth: int | None = None  # the layers the stage's numbers went through (`stage_depth`)
    detail: str = ""

    @property
    def diverges(self) -> bool:
        """True when this stage is beyond its tolerance (or its ids differ)."""
        return self.status == "diverges"


@dataclass
class Comparison:
    """Two dumps compared: every stage's result in pipeline order, the first that diverges, and why it usually does."""

    a: Dump
    b: Dump
    results: list[StageResult]
    header_differences: dict = field(default_factory=dict)
    diagnosis: list[str] = field(default_factory=list)

    @property
    def first(self) -> StageResult | None:
        """The first stage in pipeline order that diverges, or None."""
        return next((r for r in self.results if r.diverges), None)

    @property
    def cause(self) -> Cause | None:
        """What usually causes a divergence at the first diverging stage."""
        return None if self.first is None else CAUSES[self.first.step]

    def to_json(self) -> dict:
        """The comparison as JSON-ready data."""
        first, cause = self.first, self.cause
        return {
            "a": {"path": str(self.a.path), **self.a.header},
            "b": {"path": str(self.b.path), **self.b.header},
            "stages": [{k: _json_number(v) for k, v in asdict(r).items()} for r in self.results],
            "first_diverging_stage": None if first is None else first.name,
            "step": None if first is None else first.step,
            "usually": None if cause is None else cause.usually,
            "evidence": [] if cause is None else [asdict(e) for e in cause.evidence],
            "diagnosis": self.diagnosis,
            "header_differences": self.header_differences,
            "tolerance_rule": TOLERANCE_RULE,
        }


TOLERANCE_RULE = (
    "a feature stage diverges when its relative error ‖B − A‖ / ‖A‖ passes the relative error of the feature stage "
    f"before it plus, for each layer between them, {STORAGE:g} · u + {ACCUMULATION:g} · u_float32 · √n: u the unit "
    "roundoff of the coarser dtype of the two runs (float32 2^-24, float16 2^-11, bfloat16 2^-8), n the length of the "
    "layer's sums (the hidden size; 1 for the pixels, the table and the embeddings, which are rounded, not summed); "
    "the layers: the tower's + 2 from the pixels to input_vit, 1 for each decoder layer and for the logits; ids "
    "diverge when they differ"
)


def sizes_of(a: Dump, b: Dump) -> dict[str, int]:
    """The vision tower's and the language model's layer counts and the hidden size: the dumps' headers', else what
    their tensors show, else Qwen-VL-Chat's."""
    found = dict(QWEN_VL_CHAT_SIZES)
    for key in found:
        values = [int(d.header[key]) for d in (a, b) if str(d.header.get(key, "")).isdigit()]
        if values:
            found[key] = max(values)
    if not any(str(d.header.get("lm_layers", "")).isdigit() for d in (a, b)):
        layers = [int(LAYER_NAME.fullmatch(n)[1]) + 1 for d in (a, b) for n in d.tensors if LAYER_NAME.fullmatch(n)]
        found["lm_layers"] = max(layers, default=found["lm_layers"])
    names = ("input_embeds", "layers.0", "prompt_table", "input_vit")
    widths = [d.tensors[n].shape[-1] for d in (a, b) for n in names if n in d.tensors]
    if widths and not any(str(d.header.get("hidden_size", "")).isdigit() for d in (a, b)):
        found["hidden_size"] = widths[0]
    return found


def layer_share(dtype: str, sums: int) -> float:
    """One layer's share of a tolerance: STORAGE · u(dtype) + ACCUMULATION · u_float32 · √sums."""
    return STORAGE * UNIT_ROUNDOFF[dtype] + ACCUMULATION * UNIT_ROUNDOFF["float32"] * math.sqrt(sums)


def stage_sums(name: str, sizes: dict[str, int]) -> int:
    """The length of the sums a layer of stage `name` computes: the hidden size, or 1 where values are only rounded."""
    return 1 if name in ("pixels", "prompt_table", "input_embeds") else sizes["hidden_size"]


def stage_depth(name: str, sizes: dict[str, int]) -> int:
    """The layers stage `name`'s numbers went through (pixels 1, the features the tower's layers + 2, …)."""
    features = sizes["vision_layers"] + 2  # the blocks, the resampler, the projection
    found = LAYER_NAME.fullmatch(name)
    if name == "pixels":
        return 1
    if found:
        return features + int(found[1]) + 1
    if name == "logits":
        return features + sizes["lm_layers"] + 1
    return features


def coarser(*dtypes: str) -> str:
    """The dtype with the largest unit roundoff."""
    return max(dtypes, key=lambda d: UNIT_ROUNDOFF.get(d, UNIT_ROUNDOFF["float32"]))


def stored_dtype(tensor: torch.Tensor) -> str:
    """A feature tensor's dtype name (float64 counts as float32: no tolerance finer than float32's is used)."""
    return {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(tensor.dtype, "float32")


def errors(a: torch.Tensor, b: torch.Tensor) -> dict:
    """max_abs, mean_abs, rel (‖b − a‖ / ‖a‖) and cosine of two tensors of one shape, in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    diff = (b - a).abs()
    norm_a, norm_b = float(a.norm()), float(b.norm())
    rel = float((b - a).norm()) / norm_a if norm_a > 0 else (0.0 if norm_b == 0 else math.inf)
    cosine = float(a @ b) / (norm_a * norm_b) if norm_a > 0 and norm_b > 0 else float(norm_a == norm_b)
    return {
        "max_abs": float(diff.max()) if diff.numel() else 0.0,
        "mean_abs": float(diff.mean()) if diff.numel() else 0.0,
        "rel": rel,
        "cosine": cosine,
    }


def compare_features(name: str, a: torch.Tensor, b: torch.Tensor, tolerance: float, dtype: str) -> StageResult:
    """A feature stage: errors against the tolerance; shapes that differ, or values that are not finite, diverge."""
    result = StageResult(name, stage(name).step, "same", list(a.shape), list(b.shape), dtype=dtype)
    if a.shape != b.shape:
        result.status, result.detail = "diverges", f"shapes differ: {list(a.shape)} against {list(b.shape)}"
        return result
    finite_a, finite_b = bool(torch.isfinite(a).all()), bool(torch.isfinite(b).all())
    if not finite_b or not finite_a:
        result.status = "diverges"
        result.detail = f"{'B' if finite_a else 'A'} holds NaN or infinite values"
        return result
    result.tolerance = tolerance
    if torch.equal(a.float(), b.float()):
        result.max_abs = result.mean_abs = result.rel = 0.0
        result.cosine = 1.0
        return result
    for key, value in errors(a, b).items():
        setattr(result, key, value)
    result.status = "within" if result.rel <= tolerance else "diverges"
    return result


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two id sequences first differ, in words."""
    n = min(len(a), len(b))
    unequal = torch.nonzero(a[:n] != b[:n])
    if len(unequal):
        k = int(unequal[0])
        return f"first differ at position {k}: {int(a[k])} against {int(b[k])}"
    return f"lengths differ: {len(a)} against {len(b)} (the shorter is the start of the longer)"


def compare_ids(name: str, a: torch.Tensor, b: torch.Tensor) -> StageResult:
    """An id stage: equal, or diverges with where the ids first differ."""
    result = StageResult(name, stage(name).step, "same", list(a.shape), list(b.shape))
    if a.shape == b.shape and torch.equal(a, b):
        return result
    result.status = "diverges"
    result.detail = first_difference(a.flatten(), b.flatten()) if a.dim() <= 1 else "values differ"
    if a.dim() > 1 and a.shape != b.shape:
        result.detail = f"shapes differ: {list(a.shape)} against {list(b.shape)}"
    return result


def compare_input_ids(a: Dump, b: Dump) -> StageResult:
    """The ids with fake ids: the vocabulary ids equal, fake ids (>= vocab_size) at the same positions. Their numbers
    may differ (run.py numbers them on across a batch, the executor from vocab_size in every request): what they read
    is compared at the table."""
    ids_a, ids_b = a.tensors["input_ids"], b.tensors["input_ids"]
    va, vb = a.vocab_size, b.vocab_size
    if va is None or vb is None or ids_a.shape != ids_b.shape:
        return compare_ids("input_ids", ids_a, ids_b)
    result = StageResult("input_ids", "fake ids", "same", list(ids_a.shape), list(ids_b.shape))
    fake_a, fake_b = ids_a >= va, ids_b >= vb
    if not torch.equal(fake_a, fake_b):
        k = int(torch.nonzero(fake_a != fake_b)[0])
        which, other = ("A", "B") if bool(fake_a[k]) else ("B", "A")
        value_a, value_b = int(ids_a[k]), int(ids_b[k])
        result.status = "diverges"
        result.detail = (
            f"position {k} holds a fake id in {which} but a vocabulary id in {other} ({value_a} against {value_b}; "
            f"vocab_size {va} and {vb})"
        )
        return result
    if not torch.equal(ids_a[~fake_a], ids_b[~fake_b]):
        result.status = "diverges"
        result.detail = "vocabulary ids " + first_difference(ids_a, ids_b)
        return result
    if not torch.equal(ids_a, ids_b):
        result.status = "within"
        result.detail = "the fake ids are numbered differently; what they read is compared at prompt_table"
    return result


def rows_each_reads(d: Dump):
    """(positions of fake ids [L] bool, the table row each reads [M]) of one dump, or None without what it takes."""
    needed = ("input_ids", "prompt_table", "tasks", "task_vocab_size")
    if d.vocab_size is None or any(n not in d.tensors for n in needed):
        return None
    ids = d.tensors["input_ids"]
    task = d.tensors["tasks"][:1]
    rows = rows_read(ids[None], task, int(d.tensors["task_vocab_size"].flatten()[0]), d.vocab_size)[0]
    fake = ids >= d.vocab_size
    return fake, rows


def compare_table(a: Dump, b: Dump, tolerance: float, dtype: str) -> StageResult:
    """The prompt table as the fake ids read it: at every position where both runs hold a fake id, the row it reads
    (tasks and task_vocab_size included); without ids and tasks, the tables themselves."""
    reads_a, reads_b = rows_each_reads(a), rows_each_reads(b)
    table_a, table_b = a.tensors["prompt_table"], b.tensors["prompt_table"]
    if reads_a is None or reads_b is None:
        return compare_features("prompt_table", table_a, table_b, tolerance, dtype)
    (fake_a, rows_a), (fake_b, rows_b) = reads_a, reads_b
    if fake_a.shape != fake_b.shape:
        return compare_features("prompt_table", table_a, table_b, tolerance, dtype)
    both = fake_a & fake_b
    if not bool(both.any()):
        result = StageResult("prompt_table", "table", "not compared", list(table_a.shape), list(table_b.shape))
        result.detail = "no position holds a fake id in both runs: no row is read by both"
        return result
    for who, rows, table in (("A", rows_a, table_a), ("B", rows_b, table_b)):
        outside = both & ((rows < 0) | (rows >= len(table)))
        if bool(outside.any()):
            k = int(torch.nonzero(outside)[0])
            result = StageResult("prompt_table", "table", "diverges", list(table_a.shape), list(table_b.shape))
            result.detail = (
                f"{who}'s fake id at position {k} reads row {int(rows[k])} of a {len(table)}-row table: past its end "
                "(tasks × task_vocab_size too large?)"
            )
            return result
    result = compare_features("prompt_table", table_a[rows_a[both]], table_b[rows_b[both]], tolerance, dtype)
    result.shape_a, result.shape_b = list(table_a.shape), list(table_b.shape)
    result.detail = f"compared as read: the {int(both.sum())} rows the fake ids read, in the ids' order"
    return result


def header_differences(a: Dump, b: Dump) -> dict:
    """The header fields whose values differ between the dumps: {field: [A's, B's]}."""
    keys = sorted(set(a.header) | set(b.header))
    return {k: [a.header.get(k), b.header.get(k)] for k in keys if a.header.get(k) != b.header.get(k)}


def compare(a: Dump, b: Dump) -> Comparison:
    """Compare dump B against dump A (the reference), stage by stage in pipeline order.

    A feature stage's tolerance adds to the relative error of the feature stage before it (the error it inherits)
    a `layer_share` for each layer between them (`stage_depth`). After the first stage that diverges, every stage that
    is not the same is "carried": the first divergence is the one to fix, and a second behind it shows only then."""
    sizes = sizes_of(a, b)
    run = coarser(a.dtype, b.dtype)
    results, before = [], None  # before: the last feature stage compared
    for name in pipeline_order(set(a.tensors) | set(b.tensors)):
        spec = stage(name)
        if name not in b.tensors or name not in a.tensors:
            results.append(StageResult(name, spec.step, "only in A" if name in a.tensors else "only in B"))
            continue
        if spec.ids:
            results.append(_compare_id_stage(name, a, b))
            continue
        ta, tb = a.tensors[name], b.tensors[name]
        dtype = coarser(stored_dtype(ta), stored_dtype(tb), *(() if name == "pixels" else (run,)))
        inherited, start = (0.0, 0) if before is None or before.rel is None else (before.rel, before.depth)
        depth = stage_depth(name, sizes)
        tolerance = inherited + layer_share(dtype, stage_sums(name, sizes)) * max(depth - start, 1)
        if name == "prompt_table":
            result = compare_table(a, b, tolerance, dtype)
        else:
            result = compare_features(name, ta, tb, tolerance, dtype)
        result.depth = depth
        if result.rel is not None or result.diverges:
            before = result
        results.append(result)
    first = next((k for k, r in enumerate(results) if r.diverges), len(results))
    for r in results[first + 1 :]:
        if r.status in ("within", "diverges"):
            r.status = "carried"
    comparison = Comparison(a, b, results, header_differences(a, b))
    comparison.diagnosis = diagnose(comparison)
    return comparison


def _compare_id_stage(name: str, a: Dump, b: Dump) -> StageResult:
    """An id stage: input_ids as `compare_input_ids`; tasks and task_vocab_size only through what the fake ids read."""
    if name == "input_ids":
        return compare_input_ids(a, b)
    result = compare_ids(name, a.tensors[name], b.tensors[name])
    table = "prompt_table" in a.tensors and "prompt_table" in b.tensors
    if name in ("tasks", "task_vocab_size") and table and result.diverges:
        result.status = "not compared"
        result.detail = "differs; what the fake ids read with it is compared at prompt_table"
    return result


def diagnose(comparison: Comparison) -> list[str]:
    """What the dumps themselves say about the first divergence (beyond its usual causes)."""
    first = comparison.first
    if first is None:
        return []
    a, b = comparison.a, comparison.b
    notes = []
    inputs = [key for key in ("pictures", "question") if key in comparison.header_differences]
    if inputs:
        notes.append(f"the runs were given different {' and '.join(inputs)}: compare two runs of the same input")
    later = [
        r
        for r in comparison.results
        if r.status == "same" and _after(r.name, first.name) and (not stage(r.name).ids or r.name == "output_ids")
    ]
    if later:
        notes.append(f"later stages that are still the same: {', '.join(r.name for r in later)}")
    if first.name == "pixels":
        notes.append(_ranges(a.tensors["pixels"], b.tensors["pixels"]))
    if first.step == "vision":
        for key in ("vision",):
            if a.header.get(key) != b.header.get(key):
                notes.append(
                    f"the runs' vision parts: A {a.header.get(key, 'not said')}; B {b.header.get(key, 'not said')}"
                )
    if first.name == "input_ids" and b.vocab_size is not None:
        notes.extend(_fake_id_starts(a, b))
    if first.name == "prompt_table":
        notes.extend(_swapped_pictures(a, b))
    if first.step == "layers":
        notes.append(_layer_jump(comparison, first))
    if first.step == "decoding":
        notes.extend(_decoding(comparison))
    return [n for n in notes if n]


def _after(name: str, first: str) -> bool:
    order = pipeline_order([name, first])
    return name != first and order[0] == first


def _ranges(pa: torch.Tensor, pb: torch.Tensor) -> str:
    return (
        f"pixel values: A in [{float(pa.min()):.3g}, {float(pa.max()):.3g}], B in [{float(pb.min()):.3g}, "
        f"{float(pb.max()):.3g}] (normalised CLIP pixels lie in about [-1.8, 2.2])"
    )


def _fake_id_starts(a: Dump, b: Dump) -> list[str]:
    notes = []
    if "img_pos" not in a.tensors:
        return notes
    for who, d in (("A", a), ("B", b)):
        ids = d.tensors["input_ids"]
        spans = [ids[int(s) + 1 : int(e)] for _, s, e in d.tensors.get("img_pos", a.tensors["img_pos"]).tolist()]
        if spans and all(len(s) for s in spans):
            start = min(int(s.min()) for s in spans)
            where = "the prompt table" if start >= d.vocab_size else "the vocabulary, being below it"
            notes.append(f"{who}'s image spans hold ids from {start} (vocab_size {d.vocab_size}): they read {where}")
    return notes


def _swapped_pictures(a: Dump, b: Dump) -> list[str]:
    """Which of A's pictures each of B's table blocks holds, when B's pictures are A's in another order."""
    if "input_vit" not in a.tensors or rows_each_reads(b) is None:
        return []
    fake, rows = rows_each_reads(b)
    read = b.tensors["prompt_table"][rows[fake]].double()  # [M, H]
    blocks = a.tensors["input_vit"].double()  # [N, 256, H]
    n, span = blocks.shape[0], blocks.shape[1]
    if n < 2 or read.shape[0] != n * span:
        return []
    match = []
    for k in range(n):
        got = read[k * span : (k + 1) * span]
        errors_k = [float((got - blocks[j]).norm() / blocks[j].norm()) for j in range(n)]
        match.append(min(range(n), key=errors_k.__getitem__))
    if match != list(range(n)) and sorted(match) == list(range(n)):
        pairs = ", ".join(
            f"picture {k + 1}'s span reads picture {j + 1}'s features" for k, j in enumerate(match) if k != j
        )
        return [f"in B, {pairs}: the table's pictures are in another order than the spans"]
    return []


def _layer_jump(comparison: Comparison, first: StageResult) -> str:
    embeds = next((r for r in comparison.results if r.name == "input_embeds"), None)
    before = "the input embeddings agree" if embeds is not None and not embeds.diverges else "no input embeddings"
    size = "" if first.rel is None else f" (relative error {first.rel:.2g}"
    size += "" if first.rel is None or not first.tolerance else f", {first.rel / first.tolerance:.2g}× its tolerance)"
    size += ")" if first.rel is not None and not first.tolerance else ""
    return f"{before}, and {first.name} is the first layer beyond its tolerance{size}: that layer's own weights or arithmetic"


def decoding_words(sampling: dict | None) -> str:
    """A dump's decoding settings in words: "greedy", or the sampling knobs it used."""
    if sampling is None:
        return "did not say how it decoded"
    if sampling.get("greedy"):
        return "greedy"
    knobs = ("top_k", "top_p", "temperature", "random_seed", "repetition_penalty")
    return "sampled with " + ", ".join(f"{k} {sampling[k]}" for k in knobs if sampling.get(k) is not None)


def _decoding(comparison: Comparison) -> list[str]:
    a, b = comparison.a, comparison.b
    notes = [f"decoding: A {decoding_words(a.sampling)}; B {decoding_words(b.sampling)}"]
    for who, d in (("A", a), ("B", b)):
        if "logits" in d.tensors and len(d.tensors["output_ids"]) and (d.sampling or {}).get("greedy") is not False:
            best = int(d.tensors["logits"].argmax())
            first_id = int(d.tensors["output_ids"][0])
            if best != first_id:
                notes.append(
                    f"{who}'s first new id {first_id} is not its logits' largest ({best}): it did not decode greedily"
                )
    logits = next((r for r in comparison.results if r.name == "logits"), None)
    if logits is not None and logits.status in ("same", "within"):
        top = a.tensors["logits"].double().topk(2).values
        margin = float(top[0] - top[1])
        notes.append(
            f"the first logits agree (max abs error {logits.max_abs:.2g}); A's two best differ by {margin:.2g}: where "
            "the ids part, a near-tie tipped by normal drift, or the decoding settings"
        )
    return notes


def report(comparison: Comparison) -> str:
    """The comparison as text: who is compared, a row per stage, the verdict, its usual causes and evidence."""
    a, b = comparison.a, comparison.b
    lines = [f"A: {a.path}  {a.describe()}", f"B: {b.path}  {b.describe()}", ""]
    header = f"{'stage':<16} {'shape (A)':<18} {'max_abs':>9} {'mean_abs':>9} {'rel':>9} {'cosine':>9} {'tolerance':>9}  verdict"
    lines += [header, "-" * len(header)]
    for r in comparison.results:
        shape = "" if r.shape_a is None else "[" + ", ".join(map(str, r.shape_a)) + "]"
        lines.append(
            f"{r.name:<16} {shape:<18} {_num(r.max_abs):>9} {_num(r.mean_abs):>9} {_num(r.rel):>9} "
            f"{_cos(r.cosine):>9} {_num(r.tolerance):>9}  {r.status}{' — ' + r.detail if r.detail else ''}"
        )
    lines.append("")
    first, cause = comparison.first, comparison.cause
    if first is None:
        lines.append("no divergence: every stage both dumps hold agrees within its tolerance")
    else:
        lines.append(f"first diverging stage: {first.name} ({first.step})")
        lines.append(f"what usually causes it: {cause.usually}")
        lines += [f"  - {note}" for note in comparison.diagnosis]
        lines.append("evidence:")
        lines += [f"  - {e.where} ({e.title}): {e.says}" for e in cause.evidence]
    if comparison.header_differences:
        lines.append("the runs differ in: " + ", ".join(sorted(comparison.header_differences)))
    lines.append(f"tolerances: {TOLERANCE_RULE}")
    return "\n".join(lines)


def _json_number(value):
    """A value for JSON: a float that is not finite as its name ("inf", "nan"), anything else as it is."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _num(value) -> str:
    return "" if value is None else "0" if value == 0 else f"{value:.1e}"


def _cos(value) -> str:
    return "" if value is None else f"{value:.6f}"
