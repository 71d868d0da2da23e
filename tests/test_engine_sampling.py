"""Sampling and the runner's outputs: the filters match transformers', seeds reproduce, streaming shows each step."""

import gc

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from qwenvl_lab.engine import ModelRunner
from qwenvl_lab.engine.sampling import ARGMAX_BLOCK, filter_logits, greedy_tokens, penalize_repetition, sample_tokens
from qwenvl_lab.requests import SamplingConfig

PROMPTS = [torch.tensor([151644, 8948, 198, 2610, 525]), torch.tensor([872, 198, 3838, 374, 304, 279, 6802, 30])]


@pytest.fixture(scope="module")
def runner(tiny_engine):
    return ModelRunner.from_dir(tiny_engine)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 5, 1.0), (0.7, 0, 0.3), (1.3, 50, 0.9), (0.5, 3, 0.5)])
def test_filter_keeps_the_tokens_transformers_keeps(temperature, top_k, top_p):
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(top_k)) * 3
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1.0:
        expected = TopPLogitsWarper(top_p)(None, expected)
    ours = filter_logits(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    assert torch.allclose(ours[~torch.isinf(ours)], expected[~torch.isinf(expected)])


@pytest.mark.parametrize("top_p", [0.25, 0.5, 0.75])
def test_top_p_keeps_the_token_that_reaches_it_and_no_more(top_p):
    logits = torch.zeros(1, 4)  # four tokens of probability 1/4 each, exactly: the mass reaches top_p on a token
    expected = TopPLogitsWarper(top_p)(None, logits.clone())
    ours = filter_logits(logits, 1.0, 0, top_p)
    assert int(torch.isfinite(ours).sum()) == int(torch.isfinite(expected).sum()) == round(top_p * 4)


def test_greedy_knobs():
    greedy = [SamplingConfig(top_k=1).greedy, SamplingConfig(temperature=0.5, top_k=0, top_p=0.0).greedy]
    assert greedy == [True, True]  # TensorRT-LLM: top_k 1, or top_k 0 with top_p 0
    assert not SamplingConfig(top_k=0, top_p=0.3).greedy and not SamplingConfig(top_k=2).greedy
    logits = torch.randn(3, 50)
    assert torch.equal(sample_tokens(logits, 1.0, 1, 0.0), logits.argmax(-1))


@pytest.mark.parametrize("vocab", [151936, 4 * ARGMAX_BLOCK, 1000])
def test_greedy_tokens_are_argmax_ties_included(vocab):
    torch.manual_seed(0)
    logits = torch.randn(6, vocab)
    logits[1, [vocab // 2, 3, vocab - 1]] = 9.0  # a tie across blocks: the first index wins
    logits[2, [ARGMAX_BLOCK + 7, ARGMAX_BLOCK + 5]] = 9.0  # a tie inside one block
    logits[3] = 0.0  # all equal
    logits[4, -1] = float("inf")
    assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
    assert greedy_tokens(logits).tolist()[1:4] == [3, ARGMAX_BLOCK + 5, 0]
    assert torch.equal(greedy_tokens(logits[:, ::2]), logits[:, ::2].argmax(-1))  # a strided view too


@pytest.mark.parametrize("vocab", [151936, 1000])
def test_picking_a_token_reads_nothing_from_another_device(vocab):
    """On a GPU, PyTorch copies a CPU index over with a blocking copy, so the host waits for the queued steps and
    the decode loop can no longer run ahead of the GPU. Logits on the meta device: every operation's tensors must be
    there too."""
    devices = set()

    class Devices(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            leaves = torch.utils._pytree.tree_leaves((args, kwargs or {}))
            devices.update(str(t.device) for t in leaves if isinstance(t, torch.Tensor))
            return func(*args, **(kwargs or {}))

    logits = torch.empty(4, vocab, device="meta")
    with Devices():
        greedy_tokens(logits)
        filter_logits(logits, 0.7, 20, 0.9)
        penalize_repetition(logits, torch.zeros(4, vocab, dtype=torch.bool, device="meta"), 1.3)
    assert devices == {"meta"}


def test_sampling_draws_only_kept_tokens_and_follows_the_seed():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(0))
    draws = torch.cat([sample_tokens(logits, 1.0, 3, 1.0, torch.Generator().manual_seed(s)) for s in range(40)])
    assert set(draws.tolist()) <= set(logits.topk(3).indices[0].tolist()) and len(set(draws.tolist())) > 1
    first = sample_tokens(logits.expand(8, -1), 1.0, 0, 0.9, torch.Generator().manual_seed(1))
    assert torch.equal(first, sample_tokens(logits.expand(8, -1), 1.0, 0, 0.9, torch.Generator().manual_seed(1)))


def test_runner_sampling(runner):
    greedy = runner.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0)
    kept_one = runner.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0, top_k=1, temperature=0.3, top_p=0.9)
    assert torch.equal(greedy, kept_one)  # top_k 1 is greedy whatever the other knobs say
    a, b, c = (
        runner.generate(
            PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0, top_k=0, top_p=1.0, temperature=2.0, random_seed=seed
        )
        for seed in (7, 7, 8)
    )
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_streaming_yields_every_step_then_the_result(runner):
    steps = list(runner.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0, streaming=True, return_dict=True))
    final = runner.generate(PROMPTS, max_new_tokens=4, end_id=-1, pad_id=0, return_dict=True)
    assert len(steps) == 4 and torch.equal(steps[-1]["output_ids"], final["output_ids"])
    assert [s["sequence_lengths"][:, 0].tolist() for s in steps] == [[5 + t, 8 + t] for t in range(1, 5)]
    beams = list(runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0, num_beams=3, streaming=True))
    assert len(beams) == 3 and beams[-1].shape == (2, 3, 11)
    assert torch.equal(beams[-1], runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0, num_beams=3))


def test_output_layout(runner):
    """Each row: its ids, its new tokens (end_id included), then pad_id; sequence_lengths count ids + new tokens."""
    free = runner.generate(PROMPTS, max_new_tokens=5, end_id=-1, pad_id=0, return_dict=True)
    end_id = int(free["output_ids"][1, 0, 8 + 1])  # the second new token of request 1
    out = runner.generate(PROMPTS, max_new_tokens=5, end_id=end_id, pad_id=7, return_dict=True)
    ids, lengths = out["output_ids"], out["sequence_lengths"]
    assert ids.shape == (2, 1, 13) and ids.dtype == torch.int32
    stop = int(lengths[1, 0])
    assert stop <= 10 and int(ids[1, 0, stop - 1]) == end_id and (ids[1, 0, stop:] == 7).all()
    assert torch.equal(ids[0, 0, :5], PROMPTS[0].int()) and (ids[0, 0, 5 + 5 :] == 7).all()


def test_one_generation_at_a_time(runner):
    stream = runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0, streaming=True)
    next(stream)
    with pytest.raises(RuntimeError, match="a streaming generation still holds this runner's KV cache"):
        runner.generate(PROMPTS, max_new_tokens=3)
    stream.close()
    assert runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0).shape == (2, 1, 11)


def test_a_closed_stream_frees_the_runner_without_the_garbage_collector(runner):
    """close(), a `with` block and a `for` loop broken out of each free the KV cache at once (no gc needed)."""
    gc.disable()
    try:
        stream = runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0, streaming=True)
        next(stream)
        stream.close()
        assert runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0).shape == (2, 1, 11)
        with pytest.raises(StopIteration):
            next(stream)  # a closed stream stays closed
        with runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0, streaming=True) as stream:
            next(stream)
        assert not runner.busy
        for step in runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0, streaming=True):
            break
        assert not runner.busy and step.shape == (2, 1, 11)
    finally:
        gc.enable()


def test_a_stream_abandoned_inside_a_function_frees_the_runner(runner):
    def first_step():
        stream = runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0, streaming=True)
        return next(stream)  # the stream is dropped when the function returns

    gc.disable()
    try:
        assert first_step().shape == (2, 1, 11)
        assert not runner.busy
        assert runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0).shape == (2, 1, 11)
    finally:
        gc.enable()


def test_repetition_penalty_is_transformers_rule():

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 4
    history = torch.tensor([[1, 2, 2, 49], [7, 0, 3, 3], [10, 11, 12, 13]])
    seen = torch.zeros(3, 50, dtype=torch.bool).scatter(1, history, True)
    for penalty in (1.3, 0.7):
        expected = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
        assert torch.equal(penalize_repetition(logits, seen, penalty), expected)


def test_engine_repetition_penalty_gives_eager_tokens(runner, tiny_model):
    """Greedy with a penalty over the prompt's ids and the new tokens: the tokens transformers' generate picks."""
    prompt = torch.tensor([151644, 8948, 198, 2610, 525, 2610, 525])
    plain = runner.generate([prompt], max_new_tokens=8, end_id=-1, pad_id=0)[0, 0]
    changed = []
    for penalty in (1.5, 0.05):  # 0.05 < 1 favours the ids already seen
        with torch.inference_mode():
            eager = tiny_model.generate(
                prompt[None],
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=8,
                do_sample=False,
                repetition_penalty=penalty,
                pad_token_id=0,
            )[0, len(prompt) :]
        ours = runner.generate([prompt], max_new_tokens=8, end_id=-1, pad_id=0, repetition_penalty=penalty)[0, 0]
        assert ours[len(prompt) :].tolist() == eager.tolist()
        changed.append(not torch.equal(ours, plain))
    assert any(changed)  # the penalty really changed the tokens


def test_stop_words_end_a_request_with_the_word_included(runner):
    free = runner.generate(PROMPTS, max_new_tokens=6, end_id=-1, pad_id=0, return_dict=True)
    new = [free["output_ids"][r, 0, len(p) :].tolist() for r, p in enumerate(PROMPTS)]
    words = [[[new[0][2]]], [new[1][1:3], [999999 % 151936]]]  # one token for request 0, two in a row for request 1
    out = runner.generate(PROMPTS, max_new_tokens=6, end_id=-1, pad_id=0, return_dict=True, stop_words_list=words)
    lengths = out["sequence_lengths"][:, 0].tolist()
    assert lengths[0] - len(PROMPTS[0]) == new[0].index(new[0][2]) + 1
    assert (
        lengths[1] - len(PROMPTS[1]) <= 3
        and out["output_ids"][1, 0, lengths[1] - 2 : lengths[1]].tolist() == new[1][1:3]
    )
    with pytest.raises(ValueError, match=r"stop_words_list\[1\] must be a list of non-empty sequences"):
        runner.generate(PROMPTS, max_new_tokens=2, stop_words_list=[[[1]], [[]]])


def test_warm_up_runs_the_first_steps_before_the_first_question(tiny_engine):
    runner = ModelRunner.from_dir(tiny_engine, warm_up=True)
    assert not (tiny_engine / "tuning.json").exists()  # nothing is tuned on a CPU
    assert runner.generate(PROMPTS, max_new_tokens=3, end_id=-1, pad_id=0).shape == (2, 1, 11)
