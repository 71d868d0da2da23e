"""The TensorRT-LLM runner: the engine config, what reaches ModelRunnerCpp, and its outputs read back.

Without tensorrt_llm the runner's one call into it (`ModelRunnerCpp.generate`) is played by `ScriptedModelRunnerCpp`
(tests marked `standin`): it records what it is given and answers with the tokens the test scripts, in TensorRT-LLM
1.2.x's layout (each row the request's ids, its new tokens, then end_id up to max_seq_len; streaming yields the outputs
after every token). These tests check our side of the call, not TensorRT-LLM; the checks every runner shares are in
tests/test_runners.py.
"""

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from qwenvl_lab.limits import BuildConfig
from qwenvl_lab.pictures import load_image
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


def test_each_request_reaches_tensorrt_llm_with_its_own_table(tmp_path):
    """In-flight batching: request i's fake ids restart at vocab_size and read table i (prompt_tasks "0,1"), cut to
    the rows it reads, from a [tables, rows, H] table or from run.py's flat [rows, H] with task_vocab_size."""
    session = ScriptedModelRunnerCpp({})
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e")), session)
    ids = torch.nn.utils.rnn.pad_sequence([prompt(1), prompt(1, text=(872, 198, 100))], batch_first=True)
    input_vit = torch.randn(2, 256, H)
    fake_ids, table, _, rows = per_request_tables(ids, input_vit, V, runner.config.rows_per_request)
    batch = [fake_ids[0, : len(prompt(1))], fake_ids[1]]
    for given in (
        dict(prompt_table=table.view(2, rows, H).half()),
        dict(prompt_table=table.half(), task_vocab_size=256),
    ):
        runner.generate(batch, prompt_tasks="0,1", max_new_tokens=2, **given)
        call = session.calls[-1]
        assert call["prompt_tasks"] == "0,1" and torch.equal(call["prompt_table"], input_vit.half())  # [2, 256, H]
        assert [c.dtype for c in call["batch_input_ids"]] == [torch.int32] * 2
        assert int(call["batch_input_ids"][1].max()) == V + 255  # each request's fake ids restart at vocab_size


def test_one_request_in_the_single_table_convention_gets_its_own_table(tmp_path):
    """run.py's ptuning_setup output for one request ([rows, H], tasks 0, task_vocab_size 256) maps to table 0."""
    session = ScriptedModelRunnerCpp({})
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e")), session)
    ids, table, _, tvs = single_table_batch(prompt(1)[None], torch.randn(1, 256, H), V)
    runner.generate([ids[0]], table.half(), "0", task_vocab_size=tvs, max_new_tokens=2)
    assert (
        torch.equal(session.calls[-1]["prompt_table"], table.half()[None]) and session.calls[-1]["prompt_tasks"] == "0"
    )


def test_the_single_table_convention_does_not_fit_in_flight_batching(runner):
    """Python-session ids (V + 256·k + j over the batch, tasks 0) need the whole table per request: refused."""
    ids, table, tasks, tvs = single_table_batch(torch.stack([prompt(1), prompt(1)]), torch.randn(2, 256, H), V)
    with pytest.raises(ValueError, match="a request's pictures need 512 table rows, but each request may hold only"):
        runner.generate(list(ids), table.half(), "0,0", task_vocab_size=tvs)


def test_a_table_larger_than_a_request_slot_is_refused_before_tensorrt_llm(runner):
    ids, table = fake_request(num_images=2)
    assert table.shape[1] == 512 and runner.session is None  # generate would fail on the session if it got that far
    with pytest.raises(ValueError, match=r"max_batch_size = 2048 / 8 = 256 rows"):
        runner.generate([ids], table, "0")


def test_an_engine_without_a_prompt_table_input_is_refused(tmp_path):
    session = ScriptedModelRunnerCpp({})
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e", max_prompt_embedding_table_size=0)), session)
    runner.generate([torch.tensor([1, 2])], max_new_tokens=2)  # text only is fine
    ids, table = fake_request()
    with pytest.raises(ValueError, match="#1300"):
        runner.generate([ids], table, "0")


@pytest.mark.parametrize(
    "table, task_vocab_size",
    [
        (torch.empty(1, H, dtype=torch.float16), torch.zeros(1, dtype=torch.int32)),  # run.py's ptuning_setup(None)
        (torch.empty(0, H, dtype=torch.float16), None),
        (torch.empty(2, 0, H, dtype=torch.float16), None),
        (fake_request()[1].expand(2, -1, -1), None),  # a table no request reads
    ],
)
def test_a_table_no_request_reads_reaches_tensorrt_llm_as_no_table(tmp_path, table, task_vocab_size):
    """ModelRunnerCpp gives every request PromptTuningConfig(table[task]): an [H] row (refused by its 2-D check) or a
    table of 0 rows. The runner sends no table instead."""
    session = ScriptedModelRunnerCpp({})
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e")), session)
    runner.generate([torch.tensor([1, 2])] * 2, table, "0,0", task_vocab_size=task_vocab_size, max_new_tokens=2)
    assert session.calls[-1]["prompt_table"] is None and session.calls[-1]["prompt_tasks"] is None


@pytest.mark.skipif(not NEEDS, reason="tensorrt_llm and a GPU are present: from_dir is exercised by the GPU tests")
def test_from_dir_without_tensorrt_llm_says_what_is_missing(tmp_path):
    with pytest.raises(GPUStackError, match="TRTLLMRunner.from_dir needs .*" + NEEDS[0].split(" ")[0]):
        TRTLLMRunner.from_dir(write_engine(tmp_path / "e"))


# generate, with ModelRunnerCpp.generate scripted


class ScriptedModelRunnerCpp:
    """A stand-in for ModelRunnerCpp (tests only): records its keywords (TensorRT-LLM 1.2.x's names) and answers request
    i with `answers[last id of request i]`, laid out as TensorRT-LLM lays its outputs out."""

    def __init__(self, answers, max_seq_len=3072):
        self.answers, self.max_seq_len, self.calls = answers, max_seq_len, []

    def generate(  # noqa: PLR0913 — the signature of what it stands in for
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
        self.calls.append({k: v for k, v in locals().items() if k not in ("self", "answers")})
        assert return_dict and output_sequence_lengths  # what the runner asks for
        answers = [self.answers.get(int(ids[-1]), [end_id])[:max_new_tokens] for ids in batch_input_ids]

        def outputs(step):
            """The outputs once every request has `step` new tokens (fewer where its answer ended)."""
            output_ids = torch.full((len(batch_input_ids), num_beams, self.max_seq_len), end_id, dtype=torch.int32)
            lengths = torch.zeros(len(batch_input_ids), num_beams, dtype=torch.int32)
            for i, (ids, answer) in enumerate(zip(batch_input_ids, answers)):
                seq = [*ids.tolist(), *answer[:step]]
                output_ids[i, :, : len(seq)], lengths[i] = torch.tensor(seq), len(seq)
            return {"output_ids": output_ids, "sequence_lengths": lengths}

        steps = max(map(len, answers))
        return (outputs(t) for t in range(1, steps + 1)) if streaming else outputs(steps)


@pytest.fixture
def scripted(tmp_path):
    """A TRTLLMRunner (float32, 2 requests of one picture) whose session answers [7, 8, 9, end] to a request ending
    in id 11 and [5, end] to one ending in 12."""
    engine = write_engine(tmp_path / "e", dtype="float32", max_batch_size=2, max_input_len=512, max_seq_len=600)
    session = ScriptedModelRunnerCpp({11: [7, 8, 9, IM_END_ID], 12: [5, IM_END_ID]}, max_seq_len=600)
    return TRTLLMRunner(read_engine_config(engine), session)


@pytest.mark.standin
def test_outputs_read_back_in_the_runners_layout(scripted):
    requests = [torch.tensor([872, 198, 11]), torch.tensor([872, 12])]
    out = scripted.generate(requests, max_new_tokens=6, return_dict=True)
    assert out["output_ids"].tolist() == [
        [[872, 198, 11, 7, 8, 9, IM_END_ID, IM_END_ID, IM_END_ID]],
        [[872, 12, 5, IM_END_ID, IM_END_ID, IM_END_ID, IM_END_ID, IM_END_ID, IM_END_ID]],
    ]  # [B, beams, max input + max_new_tokens]: the prompt, the answer (its end id kept), then pad_id
    assert out["sequence_lengths"].tolist() == [[7], [4]]
    short = scripted.generate(requests, max_new_tokens=2, pad_id=0, return_dict=True)
    assert short["output_ids"][0, 0].tolist() == [872, 198, 11, 7, 8] and short["sequence_lengths"].tolist() == [
        [5],
        [4],
    ]
    assert short["output_ids"][1, 0].tolist() == [872, 12, 5, IM_END_ID, 0]


@pytest.mark.standin
def test_streaming_gives_every_step_in_the_same_layout(scripted):
    ids = torch.tensor([872, 198, 11])
    steps = list(scripted.generate([ids], max_new_tokens=4, streaming=True, return_dict=True))
    assert [int(s["sequence_lengths"][0, 0]) for s in steps] == [4, 5, 6, 7]
    assert all(s["output_ids"].shape == (1, 1, 7) for s in steps)
    assert steps[1]["output_ids"][0, 0].tolist() == [872, 198, 11, 7, 8, IM_END_ID, IM_END_ID]  # then pad_id
    assert torch.equal(steps[-1]["output_ids"], scripted.generate([ids], max_new_tokens=4)) and not scripted.busy


@pytest.mark.standin
def test_the_sampling_settings_reach_tensorrt_llm_in_its_form(scripted):
    scripted.generate(
        [torch.tensor([1, 2])],
        max_new_tokens=2,
        repetition_penalty=1.1,
        stop_words_list=[[[151644]]],
        random_seed=7,
        top_k=0,
        top_p=0.3,
    )
    call = scripted.session.calls[-1]
    assert (call["repetition_penalty"], call["stop_words_list"], call["random_seed"]) == (1.1, [[[151644]]], 7)
    assert (call["top_k"], call["top_p"], call["early_stopping"]) == (0, 0.3, 0)
    for given, sent in ((True, 1), (False, 0), ("never", 2)):  # TensorRT-LLM's int early_stopping
        scripted.generate([torch.tensor([1, 2])], max_new_tokens=2, early_stopping=given)
        assert scripted.session.calls[-1]["early_stopping"] == sent


@pytest.mark.standin
def test_answer_question_sends_the_pictures_features_and_decodes_the_answer(tmp_path, tokenizer):
    class Tower:  # a vision encoder whose features name the picture (its mean grey): input_vit [N, 256, H]
        def encode(self, pictures):
            grey = [float(load_image(p).convert("L").resize((1, 1)).getpixel((0, 0))) for p in pictures]
            return torch.stack([torch.full((256, H), g) for g in grey])

    answer_ids = [*tokenizer.encode("A blue square."), IM_END_ID]
    picture = IMAGES / "blue_square.png"
    ids = torch.tensor(make_context(tokenizer, tokenizer.from_list_format([{"image": str(picture)}, {"text": "?"}]))[1])
    engine = write_engine(tmp_path / "e", dtype="float32")
    runner = TRTLLMRunner(read_engine_config(engine), ScriptedModelRunnerCpp({int(ids[-1]): answer_ids}))
    assert answer_question(runner, Tower(), tokenizer, picture, "?", max_new_tokens=8) == "A blue square."
    call = runner.session.calls[-1]
    assert torch.equal(call["prompt_table"], Tower().encode([picture])) and call["prompt_tasks"] == "0"
    fake = call["batch_input_ids"][0] >= V
    assert int(fake.sum()) == 256 and call["batch_input_ids"][0][fake].tolist() == list(range(V, V + 256))


class OtherRankModelRunnerCpp:
    """A stand-in for ModelRunnerCpp on a rank that does not enqueue requests (tp_size > 1): generate returns []."""

    def generate(self, batch_input_ids, **kwargs):
        return []


@pytest.mark.standin
@pytest.mark.parametrize("streaming", [False, True])
def test_ranks_other_than_the_first_get_no_outputs(tmp_path, streaming):
    runner = TRTLLMRunner(read_engine_config(write_engine(tmp_path / "e", tp_size=2)), OtherRankModelRunnerCpp())
    assert runner.generate([torch.tensor([1, 2])], max_new_tokens=4, streaming=streaming) is None
    assert not runner.busy


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
