"""The engine's limits: each request that does not fit the build gets a clear error, before any work is done."""

import pytest
import torch

from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, generate_for_qwenvl
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID
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


def test_too_many_requests(runner):
    with pytest.raises(ValueError, match="3 requests but the engine was built with max_batch_size 2"):
        runner.generate([torch.tensor([1, 2])] * 3, max_new_tokens=2)


def test_prompt_longer_than_max_input_len(runner):
    with pytest.raises(ValueError, match="request 1 has 301 input ids but the engine's max_input_len is 300"):
        runner.generate([torch.tensor([1]), torch.ones(301, dtype=torch.long)], max_new_tokens=2)


def test_prompt_plus_new_tokens_longer_than_max_seq_len(runner):
    with pytest.raises(
        ValueError, match="290 input ids \\+ max_new_tokens 40 exceed the engine's max_seq_len 320; ask for at most 30"
    ):
        runner.generate([torch.ones(290, dtype=torch.long)], max_new_tokens=40)


def test_generate_for_qwenvl_clamps_max_new_tokens_like_run_py(runner):
    with pytest.warns(UserWarning, match="max_new_tokens 40 clamped to 23"):
        out = generate_for_qwenvl(runner, torch.ones(1, 297, dtype=torch.long), 40, end_id=-1, pad_id=0)
    assert out.shape == (1, 1, 320)
    with pytest.raises(ValueError, match="a prompt of 320 ids fills the engine's max_seq_len 320"):
        generate_for_qwenvl(runner, torch.ones(1, 320, dtype=torch.long), 5)


def test_more_table_rows_than_the_engine_holds(runner):
    table = torch.zeros(3 * 256, H)
    with pytest.raises(ValueError, match="768 rows but the engine holds at most max_prompt_embedding_table_size = 512"):
        runner.generate([image_request()], prompt_table=table, max_new_tokens=2)


def test_table_dtype_and_hidden_size_must_match(runner):
    with pytest.raises(TypeError, match="prompt_table is torch.float16 but the engine runs in torch.float32"):
        runner.generate([image_request()], prompt_table=torch.zeros(256, H, dtype=torch.float16), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prompt_table must be \[rows, 128\].* or \[tables, rows, 128\]"):
        runner.generate([image_request()], prompt_table=torch.zeros(256, 64), max_new_tokens=2)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        runner.generate([image_request()], prompt_table=[[0.0] * H], max_new_tokens=2)


def test_engine_without_table_size_refuses_pictures(text_only):
    """The article-2 mistake is an error here, not a silently ignored picture."""
    with pytest.raises(ValueError, match="max_prompt_embedding_table_size=0, so it has no prompt-table input.*#1300"):
        text_only.generate([image_request()], prompt_table=torch.zeros(256, H), max_new_tokens=2)
    out = text_only.generate([torch.tensor([1, 2, 3])], max_new_tokens=2, end_id=-1, pad_id=0)
    assert out.shape == (1, 1, 5)


def test_fake_ids_and_path_spans_need_a_table(runner):
    with pytest.raises(
        ValueError, match="request 0 holds id 151936 at position 4, past the vocabulary .* needs a prompt_table"
    ):
        runner.generate([image_request()], max_new_tokens=2)
    path_span = torch.tensor([1, IMAGE_START_ID, *b"a.png", *[IMAGE_PAD_ID] * 251, IMAGE_END_ID])
    with pytest.raises(ValueError, match="image span with the picture's path, which only the original model reads"):
        runner.generate([path_span], max_new_tokens=2)


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
    with pytest.raises(
        ValueError, match="task_vocab_size must be >= 1 .* 0 goes only with requests that hold no fake ids"
    ):
        runner.generate([image_request()], prompt_table=torch.zeros(1, H), task_vocab_size=0, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prompt_table must be \[rows, 128\]"):  # PR #2470: still the model's width
        runner.generate(text, prompt_table=torch.zeros(1, H // 2), task_vocab_size=0, max_new_tokens=2)


def test_fake_ids_outside_their_table(runner):
    with pytest.raises(
        ValueError, match=r"id 152192 at position 259 reads prompt-table row 256, but the table has 256 rows"
    ):
        runner.generate([image_request(V + 1)], prompt_table=torch.zeros(256, H), max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_tasks \\[0, 2\\] must each name one of the 2 tables"):
        runner.generate(
            [image_request()] * 2, prompt_table=torch.zeros(2, 256, H), prompt_tasks="0,2", max_new_tokens=2
        )
    with pytest.raises(ValueError, match="1 prompt_tasks for 2 requests"):
        runner.generate([image_request()] * 2, prompt_table=torch.zeros(2, 256, H), prompt_tasks="0", max_new_tokens=2)


def test_bad_generation_settings(runner):
    ids = [torch.tensor([1, 2])]
    for kwargs, match in [
        ({"num_beams": 2}, "num_beams 2 is outside 1…1, the engine's max_beam_width"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1, got 0"),
        ({"end_id": V}, "end_id must be an int in \\[-1, 151935\\]"),
        ({"pad_id": -1}, "pad_id must be an int in \\[0, 151935\\]"),
        ({"temperature": 0.0}, "temperature must be a finite number > 0"),
        ({"top_k": -1}, "top_k must be an int >= 0"),
        ({"early_stopping": "sometimes"}, "early_stopping must be one of True, False, 'never'"),
        ({"top_p": 1.5}, "top_p must be a finite number >= 0 and <= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            runner.generate(ids, **{"max_new_tokens": 2, **kwargs})
    with pytest.raises(ValueError, match="non-empty 1-D tensor of token ids"):
        runner.generate([torch.tensor([], dtype=torch.long)], max_new_tokens=2)


def test_beam_search_does_not_sample(tiny_engine):
    with pytest.raises(ValueError, match="beam search picks the best beams, it does not sample"):
        ModelRunner.from_dir(tiny_engine).generate([torch.tensor([1, 2])], num_beams=2, top_k=5, max_new_tokens=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu(tiny_engine):
    with pytest.raises(RuntimeError, match="device='cuda' was asked for but torch sees no CUDA GPU"):
        ModelRunner.from_dir(tiny_engine, device="cuda")


def test_ids_past_int32_are_refused_not_wrapped(runner):
    """2**40 used to run as id 0, and 2**32 + V + 3 read prompt-table row 3: every id is checked before any cast."""
    with pytest.raises(ValueError, match="request 0 holds id 1099511627776 at position 1, past the vocabulary"):
        runner.generate([torch.tensor([1, 2**40])], max_new_tokens=2)
    wrapped = image_request()
    wrapped[10] = 2**32 + V + 3
    with pytest.raises(ValueError, match=f"id {2**32 + V + 3} at position 10 reads prompt-table row {2**32 + 3}"):
        runner.generate([wrapped], prompt_table=torch.zeros(256, H), max_new_tokens=2)
    with pytest.raises(ValueError, match="request 0 hold 1180591620717411303424, outside int64"):
        runner.generate([[1, 2**70]], max_new_tokens=2)


def test_non_finite_tables_are_refused(runner):
    table = torch.zeros(256, H)
    table[7, 3] = float("nan")
    with pytest.raises(
        ValueError, match=r"request 0: prompt-table row 7 \(read by id 151943 at position 11\) holds NaN or infinite"
    ):
        runner.generate([image_request()], prompt_table=table, max_new_tokens=2)
