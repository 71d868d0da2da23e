"""The engine generates what eager transformers `generate` does: greedy (batch 1, mixed batch of 8) and beam search."""

import pytest
import torch

from qwenvl_lab.checkpoint import load_checkpoint
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_vision_tower
from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.prompt_table import single_table_batch
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, make_context
from qwenvl_lab.toy import TOY_DIR

NEW_TOKENS = 6
QUESTIONS = ["Hi", "What is in the picture?", "Compare the two pictures, please, in detail.", "How many?",
             "图片里是什么？", "Which picture shows more shapes, and what colour are they?", "Describe it.", "Count them"]
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
        engine_dir = build_engine(TOY_DIR, tmp_path_factory.mktemp("toy-engine"), BuildConfig(
            max_batch_size=8, max_input_len=768, max_seq_len=800, max_prompt_embedding_table_size=4096, max_beam_width=3))
    return model, ModelRunner.from_dir(engine_dir), load_vision_tower(engine_dir)


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
    extra = {} if table is None else dict(prompt_table=table, tasks=torch.zeros(1, dtype=torch.int32),
                                          task_vocab_size=256)
    with torch.inference_mode():
        out = model.generate(ids[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=ENDOFTEXT_ID,
                             eos_token_id=None if end_id < 0 else end_id, **extra, **kwargs)
    return out[:, len(ids):]


def engine_rows(output, requests_ids):
    """New tokens of each request's beams from return_dict output: [[[tokens of beam j] for j] for request i]."""
    ids, lengths = output["output_ids"], output["sequence_lengths"]
    return [[ids[i, j, len(r) : int(lengths[i, j])].tolist() for j in range(ids.shape[1])]
            for i, r in enumerate(requests_ids)]


def test_greedy_batch_of_one_equals_eager(case, requests):
    """With numba's one-row kernel (the CPU default) and with the PyTorch ops it replaces."""
    model, runner, _ = case
    assert runner.numba_decode
    torch_ops = ModelRunner.from_dir(runner.engine_dir, numba_decode=False)
    for ids, input_vit in (requests[0], requests[2]):  # text only; two pictures
        fake_ids, table = own_table(ids, input_vit, runner.vocab_size)
        expected = eager(model, fake_ids, table)[0].tolist()
        for engine in (runner, torch_ops):
            out = engine.generate([fake_ids], prompt_table=table, max_new_tokens=NEW_TOKENS, end_id=-1,
                                  pad_id=ENDOFTEXT_ID, return_dict=True)
            assert engine_rows(out, [fake_ids])[0][0] == expected


def test_mixed_batch_of_eight_equals_eager_per_prompt(case, requests):
    """Per-request tables (tasks = slot) and one python-session table give eager's tokens, stopping on end_id."""
    model, runner, _ = case
    V = runner.vocab_size
    own = [own_table(ids, vit, V) for ids, vit in requests]
    free = [eager(model, ids, table)[0].tolist() for ids, table in own]
    end_id = free[1][2]  # a token request 1 really generates: it must stop there
    expected = [eager(model, ids, table, end_id=end_id)[0].tolist() for ids, table in own]
    assert len(expected[1]) <= 3 and expected[1][-1] == end_id

    tables = torch.zeros(8, 512, runner.hidden_size)  # [B, rows, H]: request i's table at slot i
    for i, (_, table) in enumerate(own):
        if table is not None:
            tables[i, : len(table)] = table
    out = runner.generate([ids for ids, _ in own], prompt_table=tables, max_new_tokens=NEW_TOKENS, end_id=end_id,
                          pad_id=ENDOFTEXT_ID, return_dict=True)
    assert [rows[0] for rows in engine_rows(out, [ids for ids, _ in own])] == expected

    # python session: one table, fake ids increasing over every picture of the batch, tasks 0
    vits = [vit for _, vit in requests if vit is not None]
    fake_prompt_id = make_fake_prompt_ids(V, sum(len(v) for v in vits))  # [N, 256]
    batch, first = [], 0
    for ids, vit in requests:
        n = 0 if vit is None else len(vit)
        batch.append(replace_image_spans(ids, locate_img_pos(ids), fake_prompt_id[first : first + n])[0])
        first += n
    out = runner.generate(batch, prompt_table=torch.cat(vits).reshape(-1, runner.hidden_size), prompt_tasks="0," * 7 + "0",
                          task_vocab_size=256, max_new_tokens=NEW_TOKENS, end_id=end_id, pad_id=ENDOFTEXT_ID,
                          return_dict=True)
    assert [rows[0] for rows in engine_rows(out, batch)] == expected


@pytest.mark.parametrize("options", [{}, {"length_penalty": 0.5, "early_stopping": True}])
def test_beam_search_equals_eager_beam_search(case, requests, options):
    """All 3 beams, best first, for two requests at once; end_id taken from eager's own beams so beams finish early."""
    model, runner, _ = case
    own = [own_table(ids, vit, runner.vocab_size) for ids, vit in (requests[3], requests[1])]
    free = eager(model, *own[0], num_beams=3, num_return_sequences=3)
    end_id = int(free[1, 1])  # a token that the second beam emits second
    for end in (-1, end_id):
        out = runner.generate([ids for ids, _ in own], prompt_table=torch.stack(
            [torch.zeros(256, runner.hidden_size), own[1][1]]), max_new_tokens=NEW_TOKENS, end_id=end,
            pad_id=ENDOFTEXT_ID, num_beams=3, return_dict=True, **options)
        rows = engine_rows(out, [ids for ids, _ in own])
        for r, (ids, table) in enumerate(own):
            expected = eager(model, ids, table, end_id=end, num_beams=3, num_return_sequences=3, **options)
            assert rows[r] == [_strip(e, end) for e in expected.tolist()]


def _strip(tokens, end_id):
    """A transformers beam without its padding: up to and including end_id, else whole."""
    return tokens[: tokens.index(end_id) + 1] if end_id in tokens else tokens


def test_cuda_graph_protocol_on_cpu_gives_the_same_tokens(tiny_engine, requests):
    """Static buffers, KV buckets (stale cache entries masked) and beam reordering: same as the plain decode step."""
    plain, graphed = ModelRunner.from_dir(tiny_engine), ModelRunner.from_dir(tiny_engine, cuda_graphs=True)
    batch = [requests[i][0] for i in (0, 3, 7)]  # text only
    for kwargs in ({}, {"num_beams": 3}, {}):  # the last run reads a cache full of the beams' entries
        a = plain.generate(batch, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **kwargs)
        b = graphed.generate(batch, max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0, **kwargs)
        assert torch.equal(a, b)
    shapes = set(graphed.decoder.graphs)  # (rows, KV bucket) served, as CUDA would capture them
    assert {rows for rows, _ in shapes} == {3, 9} and all(bucket % 64 == 0 for _, bucket in shapes)


def test_one_row_on_a_cpu_gives_the_batched_tokens(tiny_engine, requests):
    """One request takes the CPU decode step's one-row path (Python ints, views, no mask); through the CUDA-graph
    buckets its KV length runs past its position, over another prompt's stale entries, which the mask must hide."""
    plain, graphed = ModelRunner.from_dir(tiny_engine, numba_decode=False), ModelRunner.from_dir(
        tiny_engine, cuda_graphs=True, numba_decode=False)  # the PyTorch one-row path (numba's: test_engine_numba)
    prompt, other = requests[3][0], requests[7][0]  # text only
    alone = plain.generate([prompt], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)[0, 0]
    batched = plain.generate([other, prompt], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)[1, 0]  # n = 2
    assert torch.equal(alone, batched[: len(alone)])
    graphed.generate([other], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)  # leaves entries past prompt's end
    assert torch.equal(graphed.generate([prompt], max_new_tokens=NEW_TOKENS, end_id=-1, pad_id=0)[0, 0], alone)
    assert all(bucket > len(prompt) + NEW_TOKENS for _, bucket in graphed.decoder.graphs)  # the masked case ran


@pytest.mark.slow
def test_compiled_decode_layers_give_the_same_tokens(tiny_engine):
    """torch.compile of the decode layers (what CUDA uses by default) traces in one graph and keeps the tokens (CPU)."""
    prompts = [torch.tensor([151644, 8948, 198]), torch.arange(100, 117)]
    plain = ModelRunner.from_dir(tiny_engine).generate(prompts, max_new_tokens=4, end_id=-1, pad_id=0)
    compiled = ModelRunner.from_dir(tiny_engine, cuda_graphs=True, compile_decode=True)
    assert torch.equal(compiled.generate(prompts, max_new_tokens=4, end_id=-1, pad_id=0), plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_engine_norm_and_rope_equal_the_models(dtype):
    """The engine's fused RMS norm gives the eager model's numbers bit for bit, the CPU one-row step's norm (a dot
    product and a Python float) the same up to the last bit; its three-op RoPE (one fused multiply-add) too."""
    from qwenvl_lab.engine.forward import rms_norm, rms_norm_row, rope_
    from qwenvl_lab.modeling import RMSNorm, apply_rope, rope_cos_sin

    torch.manual_seed(0)
    norm = RMSNorm(128, 1e-6).to(dtype)
    norm.weight.data.normal_()
    x = (torch.randn(5, 128) * 3).to(dtype)
    eps = torch.finfo(dtype).eps  # below: differences of the order of one unit in the last place
    with torch.no_grad():
        assert torch.equal(rms_norm(x, norm.weight, 1e-6), norm(x))
        rows = torch.cat([rms_norm_row(row[None], norm.weight, 1e-6) for row in x])
        torch.testing.assert_close(rows, norm(x), atol=4 * eps, rtol=2 * eps)
        assert not torch.equal(rms_norm_row(x[:1], norm.weight, 1.0), norm(x[:1]))  # eps is used
    qk = torch.randn(5, 2, 2, 64).to(dtype)  # [T, q|k, heads, hd]
    cos, sin = (t[0, 0][:, None, None] for t in rope_cos_sin(torch.arange(5)[None] + 40, 64, 10000.0, dtype))  # [T, 1, 1, hd]
    sin_signed = torch.cat([-sin[..., :32], sin[..., 32:]], dim=-1)
    expected = apply_rope(qk, cos, sin)
    rope_(qk, cos, sin_signed)
    torch.testing.assert_close(qk, expected, atol=4 * eps, rtol=2 * eps)  # one rounding instead of two
    assert not torch.equal(qk.flip(-1), expected)  # the halves really are rotated
