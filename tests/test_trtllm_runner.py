"""Tests for step 11: the TensorRT-LLM runner — engine config, request checks made before the GPU, and outputs.

Without tensorrt_llm the runner's one call into it (`ModelRunnerCpp.generate`) is played by `StandInModelRunnerCpp`
(tests marked `standin`): what TensorRT-LLM 1.2.x does for that call (request i gets
`PromptTuningConfig(prompt_table[task_i])`, its fake ids index its own table; outputs padded with end_id to
max_seq_len; streaming yields the outputs after every token), computed by our PyTorch model. These tests check our
side of the call, not TensorRT-LLM.
"""

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from qwenvl_lab.limits import BuildConfig
from qwenvl_lab.prompt_table import per_request_tables, single_table_batch
from qwenvl_lab.tokenizing import IM_END_ID, IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, make_context
from qwenvl_lab.trtllm.gpu import GPUStackError, missing_gpu_stack
from qwenvl_lab.trtllm.pipeline import answer_question
from qwenvl_lab.trtllm.runner import EngineConfig, TRTLLMRunner, read_engine_config

V, H = 151936, 128
IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"
NEEDS = missing_gpu_stack("tensorrt_llm", "cuda")


def write_engine(engine_dir, tp_size=1, dtype="float16", **build):
    """A config.json shaped like trtllm-build 1.2.x writes it, and empty rank engines."""
    build_config = dict(
        max_batch_size=8,
        max_input_len=2048,
        max_seq_len=3072,
        max_beam_width=1,
        max_num_tokens=8192,
        max_prompt_embedding_table_size=2048,
        kv_cache_type="PAGED",
        plugin_config=dict(
            gpt_attention_plugin=dtype,
            gemm_plugin=dtype,
            remove_input_padding=True,
            paged_kv_cache=True,
            tokens_per_block=32,
        ),
    )
    build_config.update(build)
    config = dict(
        version="1.2.1",
        build_config=build_config,
        pretrained_config=dict(
            architecture="QWenLMHeadModel",
            qwen_type="qwen",
            dtype=dtype,
            vocab_size=V,
            hidden_size=H,
            num_hidden_layers=2,
            num_attention_heads=2,
            mapping=dict(world_size=tp_size, tp_size=tp_size, pp_size=1),
            quantization=dict(quant_algo=None, kv_cache_quant_algo=None),
        ),
    )
    engine_dir.mkdir(parents=True, exist_ok=True)
    (engine_dir / "config.json").write_text(json.dumps(config))
    for rank in range(tp_size):
        (engine_dir / f"rank{rank}.engine").write_bytes(b"")
    return engine_dir


def prompt(num_images: int, text=(872, 198)) -> torch.Tensor:
    """Ids of a prompt with `num_images` image spans (path bytes, <imgpad>) between two bits of text."""
    span = [IMAGE_START_ID, *b"a.png", *[IMAGE_PAD_ID] * 251, IMAGE_END_ID]
    return torch.tensor([*text, *span * num_images, *text])


def fake_request(num_images=1, text=(872, 198)):
    """(fake ids, fp16 table [1, rows, H]) of one request in the in-flight convention."""
    ids, table, _, rows = per_request_tables(prompt(num_images, text)[None], torch.randn(num_images, 256, H), V)
    return ids[0], table.view(1, rows, H).half()


@pytest.fixture
def runner(tmp_path):
    return TRTLLMRunner(read_engine_config(write_engine(tmp_path / "engine")), session=None)


def test_engine_config_is_read_from_the_engine_dir(tmp_path):
    config = read_engine_config(write_engine(tmp_path / "e", tp_size=2))
    assert config == EngineConfig(
        vocab_size=V,
        hidden_size=H,
        tp_size=2,
        pp_size=1,
        build=BuildConfig(
            max_batch_size=8,
            max_input_len=2048,
            max_seq_len=3072,
            max_beam_width=1,
            max_prompt_embedding_table_size=2048,
            dtype="float16",
        ),
    )
    assert config.rows_per_request == 256  # the README build: exactly one image per request


def test_engine_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="build the engine first"):
        read_engine_config(tmp_path)
    engine = write_engine(tmp_path / "e", tp_size=2)
    (engine / "rank1.engine").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks \['rank1.engine'\]"):
        read_engine_config(engine)
    (engine / "config.json").write_text(json.dumps({"pretrained_config": {}}))
    with pytest.raises(ValueError, match="has no 'build_config'"):
        read_engine_config(engine)


def test_per_request_tables_pass_the_checks(runner):
    ids = torch.nn.utils.rnn.pad_sequence([prompt(1), prompt(1, text=(872, 198, 100))], batch_first=True)
    fake_ids, table, tasks, rows = per_request_tables(ids, torch.randn(2, 256, H), V, runner.config.rows_per_request)
    batch = [fake_ids[0, : len(prompt(1))], fake_ids[1]]
    checked, tables, task_str = runner.check_request(batch, table.view(2, rows, H).half(), "0,1", max_new_tokens=8)
    assert [len(c) for c in checked] == [262, 264] and all(c.dtype == torch.int32 for c in checked)
    assert tables.shape == (2, 256, H) and task_str == "0,1"
    assert int(checked[1].max()) == V + 255  # each request's fake ids restart at vocab_size
    assert runner.check_request(batch, table.view(2, rows, H).half())[2] == "0,1"  # one table per request by default
    flat = runner.check_request(batch, table.half(), "0,1", task_vocab_size=256)[1]  # [2·256, H] + task_vocab_size
    assert torch.equal(flat, tables)


def test_a_table_larger_than_a_request_slot_is_refused_before_tensorrt_llm(runner):
    ids, table = fake_request(num_images=2)
    assert table.shape[1] == 512 and runner.session is None  # generate would fail on the session if it got that far
    with pytest.raises(ValueError, match=r"2048 / 8 = 256 rows per request \(1 image"):
        runner.generate([ids], table, "0")


def test_the_single_table_convention_does_not_fit_in_flight_batching(runner):
    """Python-session ids (V + 256·k + j over the batch, tasks 0) need the whole table per request: refused."""
    ids, table, tasks, tvs = single_table_batch(torch.stack([prompt(1), prompt(1)]), torch.randn(2, 256, H), V)
    with pytest.raises(ValueError, match="a request's table has 512 rows, but this engine allows"):
        runner.check_request(list(ids), table.half(), "0,0", task_vocab_size=tvs)


def test_one_request_in_the_single_table_convention_gets_its_own_table(runner):
    """run.py's ptuning_setup output for one request ([rows, H], tasks 0, task_vocab_size 256) maps to table 0."""
    ids, table, tasks, tvs = single_table_batch(prompt(1)[None], torch.randn(1, 256, H), V)
    checked, tables, task_str = runner.check_request([ids[0]], table.half(), "0", task_vocab_size=tvs)
    assert torch.equal(tables, table.half()[None]) and task_str == "0"
    with pytest.raises(ValueError, match="reads prompt-table row 100, but the table has 100 rows"):
        runner.check_request([ids[0]], table[:100].half(), "0", task_vocab_size=tvs)


def test_fake_ids_past_their_own_table_are_refused(runner):
    ids, table = fake_request()
    with pytest.raises(ValueError, match="restart at vocab_size"):
        runner.check_request([ids + 256], table, "0")  # the Python-session numbering of a second image


def test_image_spans_still_holding_a_path_are_refused(runner):
    with pytest.raises(ValueError, match="image span with the picture's path"):
        runner.check_request([prompt(1)])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(batch_input_ids=[]), ValueError, "non-empty list"),
        (dict(batch_input_ids=[torch.tensor([1.5])]), TypeError, "request 0 must hold integers"),
        (dict(batch_input_ids=[torch.tensor([-1, 2])]), ValueError, "non-negative"),
        (
            dict(batch_input_ids=[torch.tensor([1])] * 9),
            ValueError,
            "9 requests but the engine was built with max_batch_size 8",
        ),
        (dict(batch_input_ids=[torch.ones(2049, dtype=torch.long)]), ValueError, "max_input_len is 2048"),
        (
            dict(batch_input_ids=[torch.ones(2048, dtype=torch.long)], max_new_tokens=1025),
            ValueError,
            "max_seq_len 3072",
        ),
        (
            dict(batch_input_ids=[torch.tensor([1])], max_new_tokens=0),
            ValueError,
            "max_new_tokens must be an int >= 1",
        ),
        (dict(batch_input_ids=[torch.tensor([1])], num_beams=2), ValueError, "max_beam_width"),
        (dict(batch_input_ids=[torch.tensor([1, V])]), ValueError, "needs a prompt_table"),
        (dict(batch_input_ids=[torch.tensor([1])], prompt_tasks="0"), ValueError, "without a prompt_table"),
        (
            dict(batch_input_ids=[torch.tensor([1, V])], prompt_table=torch.randn(1, 256, 64).half()),
            ValueError,
            r"\[tables, rows, 128\]",
        ),
        (
            dict(batch_input_ids=[torch.tensor([1, V])], prompt_table=torch.randn(1, 256, H)),
            TypeError,
            "runs in torch.float16",
        ),
        (dict(batch_input_ids=[torch.tensor([1, V])], prompt_table=[[0.0]]), TypeError, "torch.Tensor"),
        (
            dict(
                batch_input_ids=[torch.tensor([1, V])], prompt_table=torch.randn(1, 256, H).half(), prompt_tasks="0,1"
            ),
            ValueError,
            "2 prompt_tasks for 1 requests",
        ),
        (
            dict(batch_input_ids=[torch.tensor([1, V])], prompt_table=torch.randn(1, 256, H).half(), prompt_tasks="1"),
            ValueError,
            r"one of the 1 tables",
        ),
        (
            dict(batch_input_ids=[torch.tensor([1, V])], prompt_table=torch.randn(1, 256, H).half(), prompt_tasks="a"),
            ValueError,
            "comma-separated list of integers",
        ),
        (
            dict(batch_input_ids=[torch.tensor([1, V])] * 2, prompt_table=torch.randn(3, 256, H).half()),
            ValueError,
            "3 tables for 2 requests",
        ),
    ],
)
def test_bad_requests_get_clear_errors_before_tensorrt_llm(runner, kwargs, error, message):
    with pytest.raises(error, match=message):
        runner.check_request(**kwargs)


def test_an_engine_without_a_prompt_table_input_is_refused(tmp_path):
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e", max_prompt_embedding_table_size=0)), None)
    assert runner.check_request([torch.tensor([1, 2])])[1] is None  # text only is fine
    ids, table = fake_request()
    with pytest.raises(ValueError, match="#1300"):
        runner.check_request([ids], table, "0")


@pytest.mark.parametrize(
    "table, task_vocab_size",
    [
        (torch.empty(1, H, dtype=torch.float16), torch.zeros(1, dtype=torch.int32)),  # run.py's ptuning_setup(None)
        (torch.empty(0, H, dtype=torch.float16), None),
        (torch.empty(2, 0, H, dtype=torch.float16), None),
    ],
)
def test_an_empty_table_reaches_tensorrt_llm_as_no_table(runner, table, task_vocab_size):
    """ModelRunnerCpp gives every request PromptTuningConfig(table[task]): an [H] row (refused by its 2-D check) or a
    table of 0 rows. The runner sends no table instead, and refuses fake ids that would need one."""
    ids, tables, tasks = runner.check_request([torch.tensor([1, 2])] * 2, table, "0,0", task_vocab_size=task_vocab_size)
    assert tables is None and tasks is None and [i.tolist() for i in ids] == [[1, 2]] * 2
    with pytest.raises(ValueError, match="the prompt_table holds no image rows .*, so request 0 holds id 151936"):
        runner.check_request([torch.tensor([1, V])], table, task_vocab_size=task_vocab_size)


def test_a_table_no_request_reads_is_not_sent(runner):
    _, table = fake_request()
    assert runner.check_request([torch.tensor([1, 2])], table, "0")[1:] == (None, None)


@pytest.mark.skipif(not NEEDS, reason="tensorrt_llm and a GPU are present: from_dir is exercised by the GPU tests")
def test_from_dir_without_tensorrt_llm_says_what_is_missing(tmp_path):
    with pytest.raises(GPUStackError, match="TRTLLMRunner.from_dir needs .*" + NEEDS[0].split(" ")[0]):
        TRTLLMRunner.from_dir(write_engine(tmp_path / "e"))


# generate, with ModelRunnerCpp.generate emulated on the CPU


class StandInModelRunnerCpp:
    """A stand-in for ModelRunnerCpp (tests only): generate's contract in TensorRT-LLM 1.2.x, keyword names included,
    computed by our model."""

    def __init__(self, model, max_seq_len):
        self.model, self.max_seq_len, self.calls = model, max_seq_len, []

    def generate(
        self,
        batch_input_ids,
        *,
        prompt_table=None,
        prompt_tasks=None,
        max_new_tokens=1,
        end_id=None,
        pad_id=None,
        streaming=False,
        return_dict=False,
        output_sequence_lengths=False,
        num_beams=1,
        temperature=1.0,
        top_k=1,
        top_p=0.0,
        length_penalty=1.0,
        early_stopping=1,
        random_seed=None,
        repetition_penalty=1.0,
        stop_words_list=None,
    ):
        self.calls.append(
            dict(
                prompt_table=prompt_table,
                prompt_tasks=prompt_tasks,
                batch_input_ids=batch_input_ids,
                repetition_penalty=repetition_penalty,
                stop_words_list=stop_words_list,
            )
        )
        assert return_dict and output_sequence_lengths and num_beams == 1 and top_k == 1  # what the runner asks for
        tasks = [0] * len(batch_input_ids) if prompt_tasks is None else [int(t) for t in prompt_tasks.split(",")]
        sequences = []
        for ids, task in zip(batch_input_ids, tasks):
            table = (
                {}
                if prompt_table is None
                else dict(  # the request's own table: PromptTuningConfig(table[task])
                    prompt_table=prompt_table[task].to(self.model.dtype),
                    tasks=torch.zeros(1, dtype=torch.int32),
                    task_vocab_size=prompt_table.shape[1],
                )
            )
            sequences.append(greedy(self.model, ids, max_new_tokens, end_id, **table))

        def outputs(step):
            """The outputs once every request has `step` new tokens (fewer where it ended)."""
            output_ids = torch.full((len(batch_input_ids), 1, self.max_seq_len), end_id, dtype=torch.int32)
            lengths = torch.zeros(len(batch_input_ids), 1, dtype=torch.int32)
            for i, (ids, seq) in enumerate(zip(batch_input_ids, sequences)):
                n = min(len(seq), len(ids) + step)
                output_ids[i, 0, :n], lengths[i, 0] = seq[:n], n
            return {"output_ids": output_ids, "sequence_lengths": lengths}

        steps = max(len(seq) - len(ids) for ids, seq in zip(batch_input_ids, sequences))
        return (outputs(t) for t in range(1, steps + 1)) if streaming else outputs(steps)


def greedy(model, ids, max_new_tokens, end_id, **table) -> torch.Tensor:
    """Prompt + greedy answer (its end_id included) from our PyTorch model."""
    ids = torch.as_tensor(ids).long()[None]
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=end_id,
            pad_token_id=end_id,
            **table,
        )[0].int()


@pytest.fixture(scope="module")
def tiny(tiny_model, tokenizer, tmp_path_factory):
    """(model, tokenizer, TRTLLMRunner over an fp32 engine config of 2 requests × 1 image, emulated ModelRunnerCpp)."""
    engine = write_engine(
        tmp_path_factory.mktemp("runner") / "engine",
        dtype="float32",
        max_batch_size=2,
        max_input_len=512,
        max_seq_len=600,
        max_prompt_embedding_table_size=512,
    )
    return tiny_model, tokenizer, TRTLLMRunner(read_engine_config(engine), StandInModelRunnerCpp(tiny_model, 600))


def chat_ids(tokenizer, image, question):
    query = tokenizer.from_list_format([{"image": str(image)}, {"text": question}])
    return torch.tensor(make_context(tokenizer, query)[1])


@pytest.mark.standin
def test_generate_answers_like_the_original_model(tiny):
    """Two requests, each with its own picture as its own table, give what Qwen-VL's own path gives for each."""
    model, tokenizer, runner = tiny
    pictures = [IMAGES / "blue_square.png", IMAGES / "green_triangle.png"]
    requests = [
        chat_ids(tokenizer, pictures[0], "What is in the picture?"),
        chat_ids(tokenizer, pictures[1], "图片里是什么？"),
    ]
    batch = torch.nn.utils.rnn.pad_sequence(requests, batch_first=True, padding_value=IM_END_ID)
    with torch.no_grad():
        input_vit = model.transformer.visual.encode(pictures)  # [2, 256, H]
    ids, table, tasks, rows = per_request_tables(batch, input_vit, V, runner.config.rows_per_request)
    out = runner.generate(
        [ids[r, : len(request)] for r, request in enumerate(requests)],
        prompt_table=table.view(2, rows, H),
        prompt_tasks="0,1",
        max_new_tokens=6,
        return_dict=True,
    )
    assert runner.session.calls[-1]["prompt_tasks"] == "0,1"
    assert out["output_ids"].shape == (2, 1, max(map(len, requests)) + 6)
    for r, request in enumerate(requests):
        expected = greedy(model, request, 6, IM_END_ID)  # the original path: the model reads the picture itself
        n, prompt_len = int(out["sequence_lengths"][r, 0]), len(request)
        assert torch.equal(out["output_ids"][r, 0, :prompt_len], ids[r, :prompt_len].int())  # the fake-id prompt
        assert n == len(expected) and torch.equal(out["output_ids"][r, 0, prompt_len:n], expected[prompt_len:])
        assert (out["output_ids"][r, 0, n:] == IM_END_ID).all()  # then pad_id


@pytest.mark.standin
def test_streaming_gives_every_step_in_the_same_layout(tiny):
    model, tokenizer, runner = tiny
    ids, table = fake_request()
    ids, table = ids.int(), table.float()
    steps = list(runner.generate([ids], prompt_table=table, max_new_tokens=3, streaming=True, return_dict=True))
    assert len(steps) == 3 and all(s["output_ids"].shape == (1, 1, len(ids) + 3) for s in steps)
    assert [int(s["sequence_lengths"][0, 0]) for s in steps] == [len(ids) + 1, len(ids) + 2, len(ids) + 3]
    for t, s in enumerate(steps, 1):  # each step: the prompt, t new tokens, then pad_id
        assert (s["output_ids"][0, 0, len(ids) + t :] == IM_END_ID).all()
    final = runner.generate([ids], prompt_table=table, max_new_tokens=3)
    assert torch.equal(steps[-1]["output_ids"], final) and torch.equal(
        steps[0]["output_ids"][0, 0, : len(ids) + 1], final[0, 0, : len(ids) + 1]
    )


@pytest.mark.standin
def test_answer_question_decodes_what_the_original_model_says(tiny):
    model, tokenizer, runner = tiny
    picture = IMAGES / "blue_square.png"
    expected = greedy(model, chat_ids(tokenizer, picture, "图片里是什么？"), 6, IM_END_ID)
    n = len(chat_ids(tokenizer, picture, "图片里是什么？"))
    answer = answer_question(runner, model.transformer.visual, tokenizer, picture, "图片里是什么？", max_new_tokens=6)
    assert answer == tokenizer.decode(expected[n:].tolist(), skip_special_tokens=True)


class OtherRankModelRunnerCpp:
    """A stand-in for ModelRunnerCpp on a rank that does not enqueue requests (tp_size > 1): generate returns []."""

    def generate(self, batch_input_ids, **kwargs):
        return []


@pytest.mark.standin
@pytest.mark.parametrize("streaming", [False, True])
def test_ranks_other_than_the_first_get_no_outputs(tmp_path, streaming):
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e", tp_size=2)), OtherRankModelRunnerCpp())
    assert runner.generate([torch.tensor([1, 2])], max_new_tokens=4, streaming=streaming) is None


def test_generate_checks_its_own_arguments(tiny):
    _, _, runner = tiny
    calls = len(runner.session.calls)
    with pytest.raises(ValueError, match=r"end_id must be an int in \[-1, 151935\]"):
        runner.generate([torch.tensor([1, 2])], end_id=V)
    with pytest.raises(ValueError, match="early_stopping must be one of True, False, 'never'"):
        runner.generate([torch.tensor([1, 2])], early_stopping="sometimes")
    assert len(runner.session.calls) == calls  # nothing reached TensorRT-LLM


def test_ids_past_int32_are_refused_before_the_cast(runner):
    """The ids TensorRT-LLM gets are int32: 2**32 + V + 3 would wrap to a fake id reading row 3."""
    ids, table = fake_request()
    ids[5] = 2**32 + V + 3
    with pytest.raises(ValueError, match=f"id {2**32 + V + 3} at position 5 reads prompt-table row {2**32 + 3}"):
        runner.check_request([ids], table, "0")
    with pytest.raises(ValueError, match="holds id 1099511627776 at position 1, past the vocabulary"):
        runner.check_request([torch.tensor([1, 2**40])])


@pytest.mark.standin
def test_penalty_and_stop_words_reach_tensorrt_llm_in_its_form(tiny):
    _, _, runner = tiny
    runner.generate([torch.tensor([1, 2])], max_new_tokens=2, repetition_penalty=1.1, stop_words_list=[[[151644]]])
    assert runner.session.calls[-1]["repetition_penalty"] == 1.1
    assert runner.session.calls[-1]["stop_words_list"] == [[[151644]]]
    with pytest.raises(ValueError, match="one list of stop sequences per request"):
        runner.generate([torch.tensor([1, 2])], max_new_tokens=2, stop_words_list=[[151644]] * 2)


class OneRequestAtATime:
    """A session that, like a KV cache, holds one batch while it works: a second caller meanwhile would overwrite it."""

    def __init__(self):
        self.current = None

    def generate(self, batch_input_ids, *, max_new_tokens, end_id, streaming=False, **kwargs):
        self.current = batch_input_ids
        time.sleep(0.05)  # the work; a call from another thread now changes self.current
        ids = self.current[0]
        width = len(ids) + max_new_tokens
        output_ids = torch.full((1, 1, width), end_id, dtype=torch.int32)
        output_ids[0, 0, : len(ids)] = ids
        output_ids[0, 0, len(ids) :] = ids[-1]  # the "answer" repeats the request's last id
        out = {"output_ids": output_ids, "sequence_lengths": torch.tensor([[width]], dtype=torch.int32)}
        return iter([out, out]) if streaming else out


@pytest.mark.standin
def test_threads_sharing_a_trtllm_runner_each_get_their_own_answer(tmp_path):
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e")), OneRequestAtATime())
    start, answers = threading.Barrier(4), {}

    def ask(last_id):
        start.wait()
        answers[last_id] = int(runner.generate([torch.tensor([872, 198, last_id])], max_new_tokens=2)[0, 0, -1])

    threads = [threading.Thread(target=ask, args=(i,)) for i in (11, 12, 13, 14)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == {11: 11, 12: 12, 13: 13, 14: 14}
    stream = runner.generate([torch.tensor([872, 198, 15])], max_new_tokens=2, streaming=True)
    next(stream)
    with pytest.raises(RuntimeError, match="a streaming generation still holds this runner"):
        runner.generate([torch.tensor([872, 198, 16])], max_new_tokens=2)
    stream.close()
    assert int(runner.generate([torch.tensor([872, 198, 16])], max_new_tokens=2)[0, 0, -1]) == 16
