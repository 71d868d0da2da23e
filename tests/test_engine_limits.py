"""The engine's limits: each request that does not fit the build gets a clear error, before any work is done (the
refusals every runner shares are in tests/test_runners.py)."""

import pytest
import torch

from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine
from qwenvl_lab.infer import generate_for_qwenvl
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_START_ID
from qwenvl_lab.tokenizing import MODEL_VOCAB_SIZE as V

H = 128  # the tiny checkpoint's hidden size


@pytest.fixture(scope="module")
def runner(tiny_checkpoint, tmp_path_factory):
    """Two requests, 300 input ids, 320 in all, one picture per request."""
    config = BuildConfig(max_batch_size=2, max_input_len=300, max_seq_len=320, max_prompt_embedding_table_size=512)
    return ModelRunner.from_dir(build_engine(tiny_checkpoint, tmp_path_factory.mktemp("small"), config))


@pytest.fixture(scope="module")
def text_only(tiny_checkpoint, tmp_path_factory):
    """Built the way article 2's trtllm-build command builds: no prompt-table size."""
    config = BuildConfig(max_batch_size=2, max_input_len=300, max_seq_len=320)
    return ModelRunner.from_dir(build_engine(tiny_checkpoint, tmp_path_factory.mktemp("text-only"), config))


def image_request(first_fake_id=V, text=(1, 2, 3)):
    """[text…, <img>, 256 fake ids, </img>]."""
    return torch.tensor([*text, IMAGE_START_ID, *range(first_fake_id, first_fake_id + 256), IMAGE_END_ID])


LIMITS = [
    ("three requests", dict(batch_input_ids=[torch.tensor([1, 2])] * 3), "3 requests but the engine was built with max_batch_size 2"),
    ("301 ids", dict(batch_input_ids=[torch.tensor([1]), torch.ones(301, dtype=torch.long)]), "request 1 has 301 input ids but the engine's max_input_len is 300"),
    ("290 + 40 ids", dict(batch_input_ids=[torch.ones(290, dtype=torch.long)], max_new_tokens=40), "290 input ids \\+ max_new_tokens 40 exceed the engine's max_seq_len 320; ask for at most 30"),
    ("two beams", dict(num_beams=2), "num_beams 2 is outside 1…1, the engine's max_beam_width"),
    ("768 table rows", dict(batch_input_ids=[image_request()], prompt_table=torch.zeros(3 * 256, H)), "768 rows but the engine holds at most max_prompt_embedding_table_size = 512"),
]  # fmt: skip


@pytest.mark.parametrize("kwargs, match", [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_a_request_past_the_build_limits_is_refused(runner, kwargs, match):
    with pytest.raises(ValueError, match=match):
        runner.generate(**{"batch_input_ids": [torch.tensor([1, 2])], "max_new_tokens": 2, **kwargs})


def test_generate_for_qwenvl_clamps_max_new_tokens_like_run_py(runner):
    with pytest.warns(UserWarning, match="max_new_tokens 40 clamped to 23"):
        out = generate_for_qwenvl(runner, torch.ones(1, 297, dtype=torch.long), 40, end_id=-1, pad_id=0)
    assert out.shape == (1, 1, 320)
    with pytest.raises(ValueError, match="a prompt of 320 ids fills the engine's max_seq_len 320"):
        generate_for_qwenvl(runner, torch.ones(1, 320, dtype=torch.long), 5)


def test_engine_without_table_size_refuses_pictures(text_only):
    """The article-2 mistake is an error here, not a silently ignored picture."""
    with pytest.raises(ValueError, match="max_prompt_embedding_table_size=0, so it has no prompt-table input.*#1300"):
        text_only.generate([image_request()], prompt_table=torch.zeros(256, H), max_new_tokens=2)
    out = text_only.generate([torch.tensor([1, 2, 3])], max_new_tokens=2, end_id=-1, pad_id=0)
    assert out.shape == (1, 1, 5)


def test_text_only_requests_take_tensorrt_llms_placeholder_table(runner):
    """run.py and ModelRunner send a one-row table nobody reads (left uninitialised) and task_vocab_size 0."""
    text = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    placeholder = torch.full((1, H), float("nan"))  # what torch.empty may hold: never read
    out = runner.generate(
        text,
        prompt_table=placeholder,
        prompt_tasks="0,0",
        task_vocab_size=torch.zeros(1, dtype=torch.int32),
        max_new_tokens=3,
    )
    assert torch.equal(out, runner.generate(text, max_new_tokens=3))
    with pytest.raises(ValueError, match=r"prompt_table must be \[rows, 128\]"):  # PR #2470: still the model's width
        runner.generate(text, prompt_table=torch.zeros(1, H // 2), task_vocab_size=0, max_new_tokens=2)


def test_beam_search_takes_neither_a_penalty_nor_stop_words_here(tiny_engine):
    engine = ModelRunner.from_dir(tiny_engine)
    for knob in (dict(repetition_penalty=1.1), dict(stop_words_list=[[[151644]]])):
        with pytest.raises(ValueError, match="apply to greedy and sampled decoding here, not to beam search"):
            engine.generate([torch.tensor([1, 2])], num_beams=2, max_new_tokens=2, **knob)
    assert not engine.busy


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu(tiny_engine):
    with pytest.raises(RuntimeError, match="device='cuda' was asked for but torch sees no CUDA GPU"):
        ModelRunner.from_dir(tiny_engine, device="cuda")
