"""The engine generates what eager transformers `generate` does: greedy (batch 1, mixed batch of 8) and beam search."""

import importlib.util

import pytest
import torch

from qwenvl_lab.checkpoint import load_checkpoint
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_engine_vision_tower
from qwenvl_lab.engine.cuda_graphs import DecodeGraphs
from qwenvl_lab.engine.decode import BACKENDS, choose_backend
from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.prompt_table import single_table_batch
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, make_context
from qwenvl_lab.toy import TOY_DIR

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


def backends_here(rows: int) -> list[str]:
    """The decode back ends this machine runs for an engine of `rows` cache rows ("compiled" has a test of its own)."""
    here = []
    for name in BACKENDS:
        try:
            here.append(choose_backend(name, "cpu", torch.float32, rows))
        except ValueError:
            pass
    return [name for name in here if name != "compiled"]


@pytest.fixture(scope="module", params=backends_here(8 * 3))
def runner(request, case):
    """The case's engine with each decode back end this machine runs."""
    return ModelRunner.from_dir(case[1], decode_backend=request.param)


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


def test_cuda_graph_protocol_on_cpu_gives_the_same_tokens(tiny_engine, requests):
    """Static buffers, KV buckets (stale cache entries masked) and beam reordering: same as the plain decode step."""
    plain, graphed = (ModelRunner.from_dir(tiny_engine, decode_backend="torch") for _ in range(2))
    graphed.decoder = DecodeGraphs(graphed.decode_step, 24, graphed.max_seq_len, "cpu")  # CUDA's protocol, no capture
    batch = [requests[i][0] for i in (0, 3, 7)]  # text only
    for kwargs in ({}, {"num_beams": 3}, {}):  # the last run reads a cache full of the beams' entries
        a = plain.generate(batch, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **kwargs)
        b = graphed.generate(batch, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(a, b)
    shapes = set(graphed.decoder.graphs)  # (rows, KV bucket) served, as CUDA would capture them
    assert {rows for rows, _ in shapes} == {3, 9} and all(bucket % 64 == 0 for _, bucket in shapes)


@pytest.mark.slow
def test_compiled_decode_layers_give_the_same_tokens(tiny_engine):
    """torch.compile of the decode layers traces in one graph and keeps the tokens (CPU)."""
    prompts = [torch.tensor([151644, 8948, 198]), torch.arange(100, 117)]
    plain = ModelRunner.from_dir(tiny_engine, decode_backend="torch").generate(
        prompts, max_new_tokens=4, end_id=-1, pad_id=0
    )
    compiled = ModelRunner.from_dir(tiny_engine, decode_backend="compiled")
    assert torch.equal(compiled.generate(prompts, max_new_tokens=4, end_id=-1, pad_id=0), plain)


def test_auto_picks_numba_for_float32_on_a_cpu_that_has_it(tiny_engine):
    expected = "numba" if importlib.util.find_spec("numba") else "torch"
    assert ModelRunner.from_dir(tiny_engine).decode_backend == expected
    with pytest.raises(ValueError, match=r'decode_backend must be "auto" or one of .*got .fast.'):
        ModelRunner.from_dir(tiny_engine, decode_backend="fast")
