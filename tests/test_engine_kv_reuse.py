"""KV-cache block reuse in the engine (issue #42): keyed by ids alone, a second picture asked about with the same words
is answered with the first one's keys and values; TensorRT-LLM's extra ids, SGLang's pad values and a picture hash in
the block key (vLLM, TensorRT-LLM's PyTorch backend) each give the right answers; reuse on and off give the same tokens
wherever the prefixes truly match, on every back end and batch shape; the pool is bounded and evicts least recently
used leaves."""

import warnings

import pytest
import torch

from qwenvl_lab.chat import Conversation, GenerationSettings, engine_inputs, picture_key
from qwenvl_lab.checkpoint import TINY_CONFIG
from qwenvl_lab.engine import BuildConfig, ModelRunner
from qwenvl_lab.engine.block_reuse import BlockPool, PrefillStats, RequestKey, pad_value
from qwenvl_lab.engine.decode import BACKENDS, backend_class
from qwenvl_lab.fake_ids import fake_id_runs
from qwenvl_lab.modeling import QWenLMHeadModel, QWenVLConfig
from qwenvl_lab.pictures import load_image
from qwenvl_lab.resources import images_dir
from qwenvl_lab.tokenizing import IM_END_ID, IMAGE_END_ID, IMAGE_START_ID, load_tokenizer
from qwenvl_lab.toy import TOY_DIR, load_course_model

QUESTION = "What is in the picture?"
RED, BLUE, YELLOW = (images_dir() / name for name in ("red_circle.png", "blue_square.png", "yellow_circle.png"))
BUILD = BuildConfig(  # three requests of a picture each, or a chat about two pictures
    max_batch_size=3, max_input_len=704, max_seq_len=768, max_prompt_embedding_table_size=1536, max_beam_width=2
)
BLOCK = 16


@pytest.fixture(scope="module")
def toy():
    """(the shipped toy model in float32, its vision tower, the tokenizer)."""
    if not (TOY_DIR / "config.json").is_file():
        pytest.skip(f"the toy model is not trained yet ({TOY_DIR})")
    model = load_course_model(TOY_DIR)
    return model, model.transformer.visual, load_tokenizer()


def ask(runner, toy, pictures, **keys):
    """One generate call, one request per picture, each asked QUESTION: the answers (greedy, up to <|im_end|>)."""
    _, vision, tokenizer = toy
    inputs = engine_inputs(runner, vision, tokenizer, [([p], QUESTION) for p in pictures])
    out = runner.generate(
        **inputs._asdict(), max_new_tokens=12, end_id=IM_END_ID, pad_id=IM_END_ID, return_dict=True, **keys
    )
    lengths = out["sequence_lengths"][:, 0].tolist()
    return [
        tokenizer.decode([i for i in out["output_ids"][r, 0, len(ids) : lengths[r]].tolist() if i != IM_END_ID])
        for r, ids in enumerate(inputs.batch_input_ids)
    ]


def extra_ids(runner, toy, pictures):
    """TensorRT-LLM's input_token_extra_ids of a call: 0 for text, one id > 0 per distinct picture."""
    _, vision, tokenizer = toy
    inputs = engine_inputs(runner, vision, tokenizer, [([p], QUESTION) for p in pictures])
    return [
        torch.where(ids >= runner.vocab_size, 1 + sorted(map(str, (RED, BLUE, YELLOW))).index(str(p)), 0).tolist()
        for ids, p in zip(inputs.batch_input_ids, pictures)
    ]


@pytest.fixture(scope="module")
def reference(toy):
    """Each picture's answer without reuse."""
    runner = ModelRunner.from_model(toy[0], BUILD)
    return dict(zip((RED, BLUE, YELLOW), ask(runner, toy, [RED, BLUE, YELLOW])))


def test_ids_only_keys_answer_about_the_first_picture(toy, reference):
    """The bug: the same question about red, then blue — fake ids from vocab_size in each — under keys of ids alone."""
    assert reference[RED] != reference[BLUE]
    runner = ModelRunner.from_model(toy[0], BUILD, kv_cache_reuse=True, kv_cache_key="ids", kv_block_size=BLOCK)
    with pytest.warns(UserWarning, match="keyed by ids alone"):
        assert ask(runner, toy, [RED]) == [reference[RED]]
    with pytest.warns(UserWarning, match="request 0 holds fake prompt ids but no input_token_extra_ids"):
        assert ask(runner, toy, [BLUE]) == [reference[RED]]  # blue's question, red's answer
    start, end = fake_id_runs(engine_inputs(runner, toy[1], toy[2], [([BLUE], QUESTION)])[0][0], runner.vocab_size)[0]
    assert runner.last_prefill.reused_ids[0] >= end // BLOCK * BLOCK > start  # red's picture blocks, reused for blue


def pixel_hashes(pictures):
    return [[picture_key(load_image(p))] for p in pictures]


FIXES = {
    "TensorRT-LLM's input_token_extra_ids": ("ids", lambda runner, toy, pictures: {"input_token_extra_ids": extra_ids(runner, toy, pictures)}),
    "SGLang's pad values": ("pad_value", lambda runner, toy, pictures: {}),
    "a picture hash in the key, of the table rows": ("mm_hash", lambda runner, toy, pictures: {}),
    "a picture hash in the key, of the pixels": ("mm_hash", lambda runner, toy, pictures: {"multimodal_hashes": pixel_hashes(pictures)}),
}  # fmt: skip
CALLS = [[RED], [BLUE], [RED, BLUE], [YELLOW, BLUE, RED]]


@pytest.mark.parametrize("fix", FIXES)
def test_each_fix_answers_about_each_picture_and_reuses_the_same_picture(toy, reference, fix):
    key, given = FIXES[fix]
    runner = ModelRunner.from_model(toy[0], BUILD, kv_cache_reuse=True, kv_cache_key=key, kv_block_size=BLOCK)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call, pictures in enumerate(CALLS):
            assert ask(runner, toy, pictures, **given(runner, toy, pictures)) == [reference[p] for p in pictures]
            inputs = engine_inputs(runner, toy[1], toy[2], [([p], QUESTION) for p in pictures])
            for r, picture in enumerate(pictures):
                end = fake_id_runs(inputs.batch_input_ids[r], runner.vocab_size)[0][1]
                seen = any(picture in earlier for earlier in CALLS[:call])
                reused = runner.last_prefill.reused_ids[r]
                assert (reused >= end // BLOCK * BLOCK) if seen else (reused < end // BLOCK * BLOCK), (call, r)
    assert not [w for w in caught if "keyed by ids alone" in str(w.message)]


# Reuse on and off give the same tokens where prefixes truly match: a table of prefix kinds × batch shapes × back ends.
SMALL = dict(TINY_CONFIG, vocab_size=1000)  # Triton's interpreter runs every program in Python: a small vocabulary


def small_model():
    torch.manual_seed(0)
    return QWenLMHeadModel(QWenVLConfig(**SMALL)).eval().requires_grad_(False)


def random_ids(generator, n, vocab):
    return torch.randint(0, vocab - 1, (n,), generator=generator)


def picture_span(vocab, first, n):
    """n fake ids from vocab + first between two text ids (the small vocabulary has no <img>)."""
    return torch.cat([torch.tensor([1]), torch.arange(vocab + first, vocab + first + n), torch.tensor([2])])


def prefix_cases(vocab, block, span):
    """{name: calls}: each call a batch of requests [(ids, rows of the table its fake ids read)], run in order on one
    runner; `answer` in a request stands for the previous call's first answer (a chat's history)."""
    g = torch.Generator().manual_seed(1)
    system = random_ids(g, block + 3, vocab)
    pic = picture_span(vocab, 0, span)
    q = [random_ids(g, 5 + k, vocab) for k in range(6)]
    prompt = torch.cat([system, pic, q[0]])
    exact = torch.cat([prompt, random_ids(g, -len(prompt) % block, vocab)])  # a whole number of blocks
    return {
        "the same prompt twice": [[prompt], [prompt]],
        "a whole number of blocks, twice": [[exact], [exact]],
        "one id past whole blocks, twice": [[exact[:-block + 1]], [exact[:-block + 1]]],
        "shorter than a block": [[system[:block - 2]], [system[:block - 2]]],
        "the same picture, other questions, batched": [[prompt], [torch.cat([system, pic, q[1]]), torch.cat([system, pic, q[2]]), q[3]]],
        "a chat: the history, its answer and a new question": [[prompt], [[prompt, "answer", q[4]]], [[prompt, "answer", q[5]]]],
        "text only, then with a picture": [[system], [torch.cat([system, pic, q[1]])]],
    }  # fmt: skip


TRITON_CASES = ("the same picture, other questions, batched", "a chat: the history, its answer and a new question")


def runnable_here():
    here = []
    for name in BACKENDS:
        try:
            backend_class(name, "cpu", torch.float32)
            here.append(name)
        except ValueError:
            pass
    return here


def run_calls(runner, calls, table, vocab, answers=None, **options):
    """The calls' output ids, in order, a chat's "answer" taken from `answers` (else from this run)."""
    outputs, last = [], None
    for call in calls:
        batch = []
        for request in call:
            if isinstance(request, torch.Tensor):
                batch.append(request)
            else:  # a chat turn: the first call's answer in the history
                parts = [(answers or outputs)[0] if part == "answer" else part for part in request]
                batch.append(torch.cat(parts))
        out = runner.generate(
            batch,
            prompt_table=table,
            prompt_tasks=",".join("0" * len(batch)),
            task_vocab_size=table.shape[0],
            max_new_tokens=4,
            end_id=-1,
            pad_id=0,
            **options,
        )
        last = [out[r, 0, len(ids) :] for r, ids in enumerate(batch)]
        outputs.append(last[0])
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("backend", runnable_here())
@pytest.mark.parametrize("beams", [1, 2])
def test_reuse_on_and_off_give_the_same_tokens_where_prefixes_match(backend, beams):
    """Every prefix kind, with batches of one to three requests, greedy and beam search: the same tokens (Triton, whose
    interpreter runs a decode step in seconds: greedy, on the kinds that reuse pictures and a chat's answers)."""
    if backend == "triton" and beams > 1:
        pytest.skip("Triton's interpreter: greedy only (beam rows are read by the same kernel)")
    model, block, span = small_model(), 16, 256
    vocab = SMALL["vocab_size"]
    table = torch.randn(span, SMALL["hidden_size"], generator=torch.Generator().manual_seed(2)) * 0.05
    build = BuildConfig(max_batch_size=3, max_input_len=320, max_seq_len=336, max_prompt_embedding_table_size=span * 3, max_beam_width=2)  # fmt: skip
    plain = ModelRunner.from_model(model, build, backend=backend)
    reusing = ModelRunner.from_model(model, build, backend=backend, kv_cache_reuse=True, kv_block_size=block)
    options = {"num_beams": beams}
    cases = prefix_cases(vocab, block, span)
    if backend == "triton":
        cases = {name: cases[name] for name in TRITON_CASES}
    for name, calls in cases.items():
        expected = run_calls(plain, calls, table, vocab, **options)
        reusing.kv_pool.clear()
        got = run_calls(reusing, calls, table, vocab, answers=expected, **options)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), name
        if len(calls[0][0]) > block:  # the last call found blocks an earlier one kept
            assert max(reusing.last_prefill.reused_ids) > 0, name


def test_a_stream_closed_early_keeps_only_the_blocks_it_computed():
    """Keys and values of tokens never fed to a decode step are not kept: the next request answers as without."""
    model = small_model()
    build = BuildConfig(max_batch_size=1, max_input_len=64, max_seq_len=96)
    plain = ModelRunner.from_model(model, build)
    reusing = ModelRunner.from_model(model, build, kv_cache_reuse=True, kv_block_size=4)
    prompt = torch.arange(1, 14)  # 13 ids
    stream = reusing.generate([prompt], max_new_tokens=20, end_id=-1, pad_id=0, streaming=True)
    for _ in range(3):
        answer = next(stream)[0, 0, len(prompt) :].tolist()
    stream.close()  # three tokens picked, the first two fed to decode steps: 15 ids cached, 3 whole blocks
    follow = torch.cat([prompt, torch.tensor(answer[:3]), torch.arange(20, 27)])
    expected = plain.generate([follow], max_new_tokens=5, end_id=-1, pad_id=0)
    assert torch.equal(reusing.generate([follow], max_new_tokens=5, end_id=-1, pad_id=0), expected)
    assert reusing.last_prefill == PrefillStats((len(follow),), (12,))  # not 16: position 15 was never computed


def test_a_chat_keys_pictures_by_their_pixels_and_reuses_each_turns_history(toy):
    """Conversation passes each picture's pixel hash; turn 2 on reuses the history, with the answers of no reuse."""
    model, vision, tokenizer = toy
    talks = [
        Conversation(ModelRunner.from_model(model, BUILD, **reuse), vision, tokenizer, settings=GenerationSettings(max_new_tokens=16))
        for reuse in ({}, {"kv_cache_reuse": True})
    ]  # fmt: skip
    turns = [("What is in the picture?", [RED]), ("How many shapes are there?", []), ("And this one?", [BLUE])]
    for k, (question, pictures) in enumerate(turns):
        assert talks[1].ask(question, pictures) == talks[0].ask(question, pictures)
        stats = talks[1].runner.last_prefill
        assert (stats.reused_ids[0] > 256) if k else stats.reused_ids == (0,)
    assert talks[1].runner.kv_cache_key == "mm_hash"


# The pool: bounded, least recently used leaves evicted first, a kept block's prefix always kept.


def cache_with_values(blocks, block):
    """A KV cache [1, 2, 1 row, 1 head, blocks · block, 2] whose block j holds the value j + 1 everywhere."""
    values = torch.arange(1, blocks + 1, dtype=torch.float32).repeat_interleave(block)  # [S]
    return values[None, None, None, None, :, None].expand(1, 2, 1, 1, blocks * block, 2).clone()


def chain(name, n):
    return [f"{name}{j}".encode() for j in range(n)]


def test_the_pool_keeps_blocks_and_gives_them_back():
    cache = cache_with_values(3, 4)
    pool = BlockPool(cache, block_size=4, capacity=8)
    assert pool.store(chain("a", 3), cache, 0) == 3 and len(pool) == 3
    assert pool.store(chain("a", 3), cache, 0) == 0  # kept already
    assert (
        pool.match(chain("a", 2) + chain("b", 1)) == pool.match(chain("a", 2)) and len(pool.match(chain("b", 3))) == 0
    )
    target = torch.zeros(1, 2, 2, 1, 12, 2)
    pool.load(pool.match(chain("a", 3)), target, range(0, 2))
    assert torch.equal(target[:, :, 0], cache[:, :, 0]) and torch.equal(target[:, :, 1], cache[:, :, 0])
    assert pool.nbytes == 1 * 2 * 8 * 1 * 4 * 2 * 4
    pool.clear()
    assert len(pool) == 0 and pool.match(chain("a", 1)) == []


def test_a_full_pool_evicts_the_least_recently_used_leaf():
    cache = cache_with_values(4, 2)
    pool = BlockPool(cache, block_size=2, capacity=4)
    pool.store(chain("a", 2), cache, 0)
    pool.store(chain("b", 2), cache, 0)  # full: a0 a1 b0 b1
    pool.match(chain("a", 2))  # a is used again: b is now the least recently used
    pool.store(chain("c", 1), cache, 0)  # evicts b1, a leaf (b0 is not: b1 continues it)
    assert len(pool.match(chain("b", 2))) == 1 and len(pool.match(chain("a", 2))) == 2 and len(pool) == 4
    pool.store(chain("d", 2), cache, 0)  # evicts c0 then b0 (the oldest leaves), never a parent before its child
    assert pool.match(chain("b", 1)) == [] and pool.match(chain("c", 1)) == [] and len(pool.match(chain("d", 2))) == 2
    assert all(pool.parent[h] is None or pool.parent[h] in pool.slots for h in pool.slots)  # prefixes kept


def test_a_chain_longer_than_the_pool_is_kept_as_far_as_it_fits():
    cache = cache_with_values(6, 2)
    pool = BlockPool(cache, block_size=2, capacity=4)
    assert pool.store(chain("a", 6), cache, 0) == 4  # its own blocks are never evicted for its own later ones
    assert len(pool.match(chain("a", 6))) == 4


def test_the_pool_is_sized_and_said():
    model = small_model()
    build = BuildConfig(max_batch_size=2, max_input_len=64, max_seq_len=100, max_beam_width=2)
    runner = ModelRunner.from_model(model, build, kv_cache_reuse=True, kv_block_size=16)
    layers, heads, head_dim = SMALL["num_hidden_layers"], SMALL["num_attention_heads"], SMALL["kv_channels"]
    assert runner.kv_pool.capacity == 2 * 2 * 7  # as many tokens as the cache rows: 4 rows × ⌈100 / 16⌉ blocks
    assert runner.kv_pool.nbytes == layers * 2 * 28 * heads * 16 * head_dim * 4
    assert f"kv_pool_blocks=28 ({runner.kv_pool.nbytes / 2**20:.1f} MiB)" in repr(runner)
    small = ModelRunner.from_model(model, build, kv_cache_reuse=True, kv_pool_blocks=3)
    assert small.kv_pool.capacity == 3 and "kv_cache_reuse" not in repr(ModelRunner.from_model(model, build))


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"kv_cache_key": "prefix"}, ValueError, "kv_cache_key must be one of 'ids', 'pad_value', 'mm_hash'"),
        ({"kv_block_size": 0}, ValueError, r"kv_block_size must be an int in \[1, 100\], got 0"),
        ({"kv_block_size": 101}, ValueError, r"kv_block_size must be an int in \[1, 100\], got 101"),
        ({"kv_block_size": 2.5}, TypeError, "kv_block_size must be an int, got float"),
        ({"kv_block_size": "16"}, TypeError, "kv_block_size must be an int, got str"),
        ({"kv_pool_blocks": 0}, ValueError, "kv_pool_blocks must be an int >= 1, got 0"),
        ({"kv_pool_blocks": -3}, ValueError, "kv_pool_blocks must be an int >= 1"),
    ],
)
def test_bad_reuse_options_are_refused(options, error, match):
    build = BuildConfig(max_batch_size=1, max_input_len=64, max_seq_len=100)
    with pytest.raises(error, match=match):
        ModelRunner.from_model(small_model(), build, kv_cache_reuse=True, **options)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_kv_cache_reuse_is_true_or_false(value):
    build = BuildConfig(max_batch_size=1, max_input_len=64, max_seq_len=100)
    with pytest.raises(ValueError, match=f"kv_cache_reuse must be one of False, True, got {value!r}"):
        ModelRunner.from_model(small_model(), build, kv_cache_reuse=value)


def test_the_default_block_needs_no_room_without_reuse():
    """An engine shorter than a default block runs as before; with reuse its block must fit."""
    build = BuildConfig(max_batch_size=1, max_input_len=8, max_seq_len=16)
    assert ModelRunner.from_model(small_model(), build).kv_pool is None
    with pytest.raises(ValueError, match=r"kv_block_size must be an int in \[1, 16\], got 32"):
        ModelRunner.from_model(small_model(), build, kv_cache_reuse=True)
    assert ModelRunner.from_model(small_model(), build, kv_cache_reuse=True, kv_block_size=8).kv_pool.capacity == 2


def test_reuse_switched_on_needs_a_pool():
    runner = ModelRunner.from_model(small_model(), BuildConfig(max_batch_size=1, max_input_len=64, max_seq_len=100))
    with pytest.raises(ValueError, match="no block pool: build it with ModelRunner"):
        runner.kv_cache_reuse = True
    runner.kv_cache_reuse = False


# The block keys


def test_a_blocks_key_stands_for_its_whole_prefix():
    ids = torch.arange(100, 124)
    keys = RequestKey.of("ids", ids, 1000).block_hashes(8, 3)
    changed = ids.clone()
    changed[9] = 7  # in block 1
    other = RequestKey.of("ids", changed, 1000).block_hashes(8, 3)
    assert keys[0] == other[0] and keys[1] != other[1] and keys[2] != other[2]
    assert RequestKey.of("ids", ids, 1000).block_hashes(8, 2) == keys[:2]
    extra = RequestKey.of("ids", ids, 1000, extra_ids=[0] * 24).block_hashes(8, 3)
    assert extra[0] != keys[0]  # extra ids given (even all 0) make other keys, as TensorRT-LLM's usesExtraIds


def test_each_key_tells_two_pictures_with_the_same_fake_ids_apart():
    ids = torch.cat([torch.arange(1, 9), torch.arange(1000, 1016), torch.arange(9, 17)])  # text, a picture, text
    red, blue = b"red", b"blue"
    for key in ("pad_value", "mm_hash"):
        a = RequestKey.of(key, ids, 1000, picture_hashes=[red]).block_hashes(8, 4)
        b = RequestKey.of(key, ids, 1000, picture_hashes=[blue]).block_hashes(8, 4)
        assert a[0] == b[0] and a[1] != b[1], key  # the text before the picture is shared, the picture is not
    same = RequestKey.of("ids", ids, 1000).block_hashes(8, 4)
    assert same == RequestKey.of("ids", ids, 1000, picture_hashes=[blue]).block_hashes(8, 4)  # ids alone: the bug
    padded = RequestKey.of("pad_value", ids, 1000, picture_hashes=[red])
    assert padded.ids[8:24].tolist() == [pad_value(red)] * 16 and 0 <= pad_value(red) < 2**30
    assert padded.ids[:8].tolist() == ids[:8].tolist()
    hashed = RequestKey.of("mm_hash", ids, 1000, picture_hashes=[red])
    assert hashed.pictures == ((8, 24, red),) and hashed.followed_by([5, 6]).ids.tolist()[-2:] == [5, 6]


def test_fake_id_runs_are_the_pictures():
    V = 151936
    ids = torch.tensor([1, IMAGE_START_ID, V, V + 1, IMAGE_END_ID, 2, IMAGE_START_ID, V + 2, IMAGE_END_ID])
    assert fake_id_runs(ids, V) == [(2, 4), (7, 8)]
    assert fake_id_runs(torch.tensor([5, 6]), V) == [] and fake_id_runs(torch.tensor([V]), V) == [(0, 1)]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_on_a_gpu_the_bug_and_each_fix_in_cuda_graphs(toy, backend):
    """The toy engine on CUDA, float32, in CUDA graphs: ids alone give blue red's answer; each fix gives each picture's
    answer without reuse; reuse on and off give the same chat."""
    model = load_course_model(TOY_DIR, device="cuda")
    toy_gpu = (model, model.transformer.visual, toy[2])
    graphs = dict(device="cuda", backend=backend, cuda_graphs=True)
    plain = ModelRunner.from_model(model, BUILD, **graphs)
    reference = dict(zip((RED, BLUE, YELLOW), ask(plain, toy_gpu, [RED, BLUE, YELLOW])))
    assert reference[RED] != reference[BLUE]
    options = dict(graphs, kv_cache_reuse=True, kv_block_size=BLOCK)
    runner = ModelRunner.from_model(model, BUILD, kv_cache_key="ids", **options)
    with pytest.warns(UserWarning, match="keyed by ids alone"):
        assert ask(runner, toy_gpu, [RED]) + ask(runner, toy_gpu, [BLUE]) == [reference[RED]] * 2
    for fix, (key, given) in FIXES.items():
        runner = ModelRunner.from_model(model, BUILD, kv_cache_key=key, **options)
        for pictures in CALLS:
            answers = ask(runner, toy_gpu, pictures, **given(runner, toy_gpu, pictures))
            assert answers == [reference[p] for p in pictures], fix
    settings = GenerationSettings(max_new_tokens=16)
    talks = [Conversation(r, model.transformer.visual, toy[2], settings=settings) for r in (plain, runner)]
    for question, pictures in [("What is in the picture?", [RED]), ("How many shapes are there?", []), ("And this one?", [BLUE])]:  # fmt: skip
        assert talks[1].ask(question, pictures) == talks[0].ask(question, pictures)
    assert runner.last_prefill.reused_ids[0] > 256
