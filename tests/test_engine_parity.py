"""The engine generates what eager transformers `generate` does: greedy (batch 1, mixed batch of 8) and beam search."""

import importlib.util

import pytest
import torch

from qwenvl_lab.checkpoint import TINY_CONFIG, load_checkpoint
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_engine_vision_tower
from qwenvl_lab.engine.decode import BACKENDS, backend_class
from qwenvl_lab.engine.forward import LanguageModelEngine
from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.layout import to_trtllm_names
from qwenvl_lab.modeling import QWenLMHeadModel, QWenVLConfig
from qwenvl_lab.prompt_table import single_table_batch
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, make_context
from qwenvl_lab.toy import TOY_DIR
from qwenvl_lab.unified_checkpoint import trtllm_config, weight_only_quantize

NEW_TOKENS = 6
QUESTIONS = [
    "Hi",
    "What is in the picture?",
    "Compare the two pictures, please, in detail.",
    "How many?",
    "图片里是什么？",
    "Which picture shows more shapes, and what colour are they?",
    "Describe it.",
    "Count them",
]
PICTURES = [[], ["red"], ["noise", "gradient"], [], ["gradient"], ["red", "noise"], ["noise"], []]  # 0–2 per request


@pytest.fixture(scope="module", params=["tiny", "toy"])
def case(request, tiny_model, tiny_engine, tmp_path_factory):
    """(eager model, engine runner, vision tower) for the tiny random checkpoint and the shipped toy model."""
    if request.param == "tiny":
        model, engine_dir = tiny_model, tiny_engine
    else:
        if not (TOY_DIR / "config.json").is_file():
            pytest.skip(f"the toy model is not trained yet ({TOY_DIR})")
        model = load_checkpoint(TOY_DIR, dtype="float32").requires_grad_(False)  # stored in bfloat16
        engine_dir = build_engine(
            TOY_DIR,
            tmp_path_factory.mktemp("toy-engine"),
            BuildConfig(
                max_batch_size=8,
                max_input_len=768,
                max_seq_len=800,
                max_prompt_embedding_table_size=4096,
                max_beam_width=3,
            ),
        )
    return model, engine_dir, load_engine_vision_tower(engine_dir)


def runnable_here() -> list[str]:
    """The decode back ends this machine's CPU runs for a float32 engine (Triton: through its interpreter)."""
    here = []
    for name in BACKENDS:
        try:
            backend_class(name, "cpu", torch.float32)
            here.append(name)
        except ValueError:
            pass
    return here


def backends_here() -> list[str]:
    """runnable_here but Triton, whose interpreter is too slow for a 151936-id vocabulary (tests/test_engine_triton.py
    checks it on a small one, and on a GPU)."""
    return [name for name in runnable_here() if name != "triton"]


@pytest.fixture(scope="module", params=backends_here())
def runner(request, case):
    """The case's engine with each decode back end this machine runs."""
    return ModelRunner.from_dir(case[1], backend=request.param)


@pytest.fixture(scope="module")
def requests(case, tokenizer, image_files):
    """Eight chat prompts of different lengths with 0–2 pictures: [(ids [L] with path spans, input_vit or None)]."""
    _, _, vision = case
    out = []
    for question, names in zip(QUESTIONS, PICTURES):
        query = tokenizer.from_list_format([*({"image": str(image_files[n])} for n in names), {"text": question}])
        ids = torch.tensor(make_context(tokenizer, query)[1])
        with torch.inference_mode():
            out.append((ids, vision.encode([image_files[n] for n in names]) if names else None))
    return out


def own_table(ids, input_vit, vocab_size):
    """One request alone, run.py's way: (ids with fake ids from vocab_size, table [n·256, H] or None)."""
    if input_vit is None:
        return ids, None
    fake_ids, table, _, _ = single_table_batch(ids, input_vit, vocab_size)
    return fake_ids[0], table


def eager(model, ids, table, end_id=-1, **kwargs):
    """transformers generate on one request: its new tokens (the end id included, no padding)."""
    extra = (
        {} if table is None else dict(prompt_table=table, tasks=torch.zeros(1, dtype=torch.int32), task_vocab_size=256)
    )
    with torch.inference_mode():
        out = model.generate(
            ids[None],
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=ENDOFTEXT_ID,
            eos_token_id=None if end_id < 0 else end_id,
            **extra,
            **kwargs,
        )
    return out[:, len(ids) :]


def engine_rows(output, requests_ids):
    """New tokens of each request's beams from return_dict output: [[[tokens of beam j] for j] for request i]."""
    ids, lengths = output["output_ids"], output["sequence_lengths"]
    return [
        [ids[i, j, len(r) : int(lengths[i, j])].tolist() for j in range(ids.shape[1])]
        for i, r in enumerate(requests_ids)
    ]


def test_greedy_batch_of_one_equals_eager(case, runner, requests):
    model = case[0]
    for ids, input_vit in (requests[0], requests[2]):  # text only; two pictures
        fake_ids, table = own_table(ids, input_vit, runner.vocab_size)
        expected = eager(model, fake_ids, table)[0].tolist()
        out = runner.generate(
            [fake_ids], prompt_table=table, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=ENDOFTEXT_ID, return_dict=True
        )
        assert engine_rows(out, [fake_ids])[0][0] == expected


def test_mixed_batch_of_eight_equals_eager_per_prompt(case, runner, requests):
    """Per-request tables (tasks = position in the batch) and one python-session table give eager's tokens, stopping on end_id."""
    model = case[0]
    V = runner.vocab_size
    own = [own_table(ids, vit, V) for ids, vit in requests]
    free = [eager(model, ids, table)[0].tolist() for ids, table in own]
    end_id = free[1][2]  # a token request 1 really generates: it must stop there
    expected = [eager(model, ids, table, end_id=end_id)[0].tolist() for ids, table in own]
    assert len(expected[1]) <= 3 and expected[1][-1] == end_id

    tables = torch.zeros(8, 512, runner.hidden_size)  # [B, rows, H]: request i's table at block i
    for i, (_, table) in enumerate(own):
        if table is not None:
            tables[i, : len(table)] = table
    out = runner.generate(
        [ids for ids, _ in own],
        prompt_table=tables,
        max_new_tokens=NEW_TOKENS,
        end_id=end_id,
        pad_id=ENDOFTEXT_ID,
        return_dict=True,
    )
    assert [rows[0] for rows in engine_rows(out, [ids for ids, _ in own])] == expected

    # python session: one table, fake ids increasing over every picture of the batch, tasks 0
    vits = [vit for _, vit in requests if vit is not None]
    fake_prompt_id = make_fake_prompt_ids(V, sum(len(v) for v in vits))  # [N, 256]
    batch, first = [], 0
    for ids, vit in requests:
        n = 0 if vit is None else len(vit)
        batch.append(replace_image_spans(ids, locate_img_pos(ids), fake_prompt_id[first : first + n])[0])
        first += n
    out = runner.generate(
        batch,
        prompt_table=torch.cat(vits).reshape(-1, runner.hidden_size),
        prompt_tasks="0," * 7 + "0",
        task_vocab_size=256,
        max_new_tokens=NEW_TOKENS,
        end_id=end_id,
        pad_id=ENDOFTEXT_ID,
        return_dict=True,
    )
    assert [rows[0] for rows in engine_rows(out, batch)] == expected


@pytest.mark.parametrize("options", [{}, {"length_penalty": 0.5, "early_stopping": True}])
def test_beam_search_equals_eager_beam_search(case, runner, requests, options):
    """All 3 beams, best first, for two requests at once; end_id taken from eager's own beams so beams finish early."""
    model = case[0]
    own = [own_table(ids, vit, runner.vocab_size) for ids, vit in (requests[3], requests[1])]
    free = eager(model, *own[0], num_beams=3, num_return_sequences=3)
    end_id = int(free[1, 1])  # a token that the second beam emits second
    for end in (-1, end_id):
        out = runner.generate(
            [ids for ids, _ in own],
            prompt_table=torch.stack([torch.zeros(256, runner.hidden_size), own[1][1]]),
            max_new_tokens=NEW_TOKENS,
            end_id=end,
            pad_id=ENDOFTEXT_ID,
            num_beams=3,
            return_dict=True,
            **options,
        )
        rows = engine_rows(out, [ids for ids, _ in own])
        for r, (ids, table) in enumerate(own):
            expected = eager(model, ids, table, end_id=end, num_beams=3, num_return_sequences=3, **options)
            assert rows[r] == [_strip(e, end) for e in expected.tolist()]


def _strip(tokens, end_id):
    """A transformers beam without its padding: up to and including end_id, else whole."""
    return tokens[: tokens.index(end_id) + 1] if end_id in tokens else tokens


@pytest.mark.parametrize("backend", backends_here())
def test_stale_cache_entries_inside_a_kv_bucket_change_nothing(tiny_engine, tokenizer, backend):
    """Every decode step attends to a whole KV bucket (64 keys), so past each row's position it reads noise or another
    prompt's entries, which the position masks: the tokens of a fresh engine, greedy and with beams."""
    fresh, used = (ModelRunner.from_dir(tiny_engine, backend=backend, warm_up=False) for _ in range(2))
    batch = [torch.tensor(tokenizer.encode(q)) for q in QUESTIONS[:3]]
    for options in ({}, {"num_beams": 3}):
        expected = fresh.generate(batch, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **options)
        used.engine.kv_cache.normal_()
        assert torch.equal(used.generate(batch, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **options), expected)


def engine_tensors(engine) -> dict:
    """Every tensor the engine holds but its KV cache, by where it is held: the engine, its stacks, its layers."""
    held = {name: t for name, t in vars(engine).items() if isinstance(t, torch.Tensor) and name != "kv_cache"}
    held |= {f"stacks.{name}": t for name, t in engine.stacks.items()}
    layers = {f"layers.{i}.{name}": t for i, layer in enumerate(engine.layers) for name, t in vars(layer).items()}
    return held | {name: t for name, t in layers.items() if t is not None}  # a float engine's layers have no scales


@pytest.mark.parametrize(
    "backend, weight_only",
    [(b, None) for b in runnable_here()] + [(b, "int8") for b in runnable_here() if b != "numba"],
)
def test_no_back_end_rewrites_the_engines_tensors(backend, weight_only):
    """A back end reads the engine's weights as the engine laid them out (a weight-only engine's int8 matrices and
    scales too) and writes only the KV cache."""
    torch.manual_seed(0)
    model = QWenLMHeadModel(QWenVLConfig(**{**TINY_CONFIG, "vocab_size": 1000})).eval()  # small for the interpreter
    config = BuildConfig(max_batch_size=2, max_input_len=32, max_seq_len=64, weight_only=weight_only)
    step_class = backend_class(backend, "cpu", torch.float32, weight_only=weight_only)
    weights = to_trtllm_names(model.state_dict())
    if weight_only:
        weights = weight_only_quantize(weights, "float32")
    engine = LanguageModelEngine(
        config, trtllm_config(model.config, "float32", weight_only=weight_only), weights, "cpu", step_class.layout
    )
    before = {name: (t, t.clone()) for name, t in engine_tensors(engine).items()}
    step = step_class(engine)
    with torch.inference_mode():
        step(torch.tensor([5, 6]), torch.tensor([3, 9]), 64)
    after = engine_tensors(engine)
    assert after.keys() == before.keys()
    assert ("layers.0.qkv_s" in before) == (weight_only is not None)
    for name, (tensor, values) in before.items():
        assert after[name] is tensor and torch.equal(tensor, values), name
    assert engine.kv_cache[:, :, :2, :, [3, 9]].any()  # the step did write its keys and values


def _without(package):
    """A find_spec that does not find `package`."""
    find_spec = importlib.util.find_spec
    return lambda name, *a: None if name == package else find_spec(name, *a)


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton installed")


@pytest.mark.parametrize(
    "name, device, dtype, cuda_graphs, setup, message",
    [
        ("fast", "cpu", torch.float32, False, None, r"backend must be one of 'torch', 'numba', 'triton', got 'fast'$"),
        ("torch", "cuda", torch.float32, 1, None, r"cuda_graphs must be one of False, True, got 1$"),
        ("torch", "cpu", torch.float32, True, None, r"CUDA graphs need device='cuda', not 'cpu': leave cuda_graphs=False"),
        ("numba", "cpu", torch.bfloat16, False, None, r'float32 engines on a CPU, not torch.bfloat16 on cpu.*backend="torch"$'),
        ("numba", "cuda", torch.float16, True, None, r'not torch.float16 on cuda.*on an NVIDIA GPU, backend="triton"'),
        ("numba", "cpu", torch.float32, False, "numba", r'backend="numba" needs numba \(pip install numba\); choose backend="torch"'),
        ("triton", "cpu", torch.float32, False, "triton", r'backend="triton" needs triton .*choose backend="torch"'),
        pytest.param(
            "triton", "cpu", torch.float32, False, "no interpreter",
            r'run on an NVIDIA GPU, not on cpu.*TRITON_INTERPRET=1.*Choose backend="numba" or "torch"',
            marks=needs_triton,
        ),
    ],
)  # fmt: skip
def test_a_back_end_that_cannot_run_here_is_refused_with_what_to_choose(
    monkeypatch, name, device, dtype, cuda_graphs, setup, message
):
    if setup == "no interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    elif setup is not None:
        monkeypatch.setattr(importlib.util, "find_spec", _without(setup))
    with pytest.raises(ValueError, match=message):
        backend_class(name, device, dtype, cuda_graphs)


def test_the_runner_refuses_before_it_builds_the_engine(tiny_engine, monkeypatch):
    monkeypatch.setattr(LanguageModelEngine, "__init__", lambda *a: pytest.fail("the engine was built"))
    with pytest.raises(ValueError, match="CUDA graphs need device='cuda'"):
        ModelRunner.from_dir(tiny_engine, cuda_graphs=True)
