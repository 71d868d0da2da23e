"""One runner interface: the same bad request gets the same exception and message from the engine's ModelRunner,
TRTLLMRunner (its session never reached) and ModelAsRunner, and from generate_for_qwenvl over each; and the
interface's outputs layout, sampling settings and output slicing."""

import json

import pytest
import torch

from qwenvl_lab.chat import ModelAsRunner
from qwenvl_lab.engine import ModelRunner
from qwenvl_lab.infer import generate_for_qwenvl
from qwenvl_lab.requests import SamplingConfig, build_outputs, new_tokens
from qwenvl_lab.tokenizing import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID
from qwenvl_lab.trtllm.runner import TRTLLMRunner, read_engine_config

V, H = 151936, 128  # the tiny checkpoint's vocabulary and hidden sizes


class NoSession:
    """A ModelRunnerCpp that must never be reached: every request here is refused before it."""

    def generate(self, *args, **kwargs):
        raise AssertionError("a bad request reached TensorRT-LLM")


def trtllm_engine_dir(folder):
    """config.json of a TensorRT-LLM engine with the tiny engine's limits (float32) and an empty rank engine."""
    build = dict(max_batch_size=8, max_input_len=768, max_seq_len=800, max_beam_width=3)
    build["max_prompt_embedding_table_size"] = 256 * 2 * 8
    pretrained = dict(dtype="float32", vocab_size=V, hidden_size=H, mapping=dict(world_size=1, tp_size=1, pp_size=1))
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(build_config=build, pretrained_config=pretrained)))
    (folder / "rank0.engine").write_bytes(b"")
    return folder


@pytest.fixture(scope="module")
def runners(tiny_engine, tiny_model, tmp_path_factory):
    """The three runners over the tiny checkpoint: the package's engine, TensorRT-LLM's (no session), the model."""
    trtllm = TRTLLMRunner(read_engine_config(trtllm_engine_dir(tmp_path_factory.mktemp("trt") / "e")), NoSession())
    return {"engine": ModelRunner.from_dir(tiny_engine), "trtllm": trtllm, "model": ModelAsRunner(tiny_model)}


def image_request(first=V):
    """[text…, <img>, 256 fake ids from `first`, </img>]."""
    return torch.tensor([1, 2, 3, IMAGE_START_ID, *range(first, first + 256), IMAGE_END_ID])


def table_with(value=0.0, row=7, rows=256, dtype=torch.float32):
    table = torch.zeros(rows, H, dtype=dtype)
    table[row, 3] = value
    return table


TEXT = [torch.tensor([1, 2, 3])]
BAD_REQUESTS = [
    ("no requests", dict(batch_input_ids=[]), ValueError, "non-empty list of 1-D token-id tensors"),
    ("float ids", dict(batch_input_ids=[torch.tensor([1.5])]), TypeError, "request 0 must hold integers"),
    ("2-D request", dict(batch_input_ids=[torch.ones(2, 2, dtype=torch.long)]), ValueError, "non-empty 1-D tensor"),
    ("negative id", dict(batch_input_ids=[torch.tensor([1, -1])]), ValueError, "request 0: token ids must be non-negative"),
    ("id past int32", dict(batch_input_ids=[torch.tensor([1, 2**40])]), ValueError, "holds id 1099511627776 at position 1, past the vocabulary"),
    ("id past int64", dict(batch_input_ids=[[1, 2**70]]), ValueError, "outside int64"),
    ("fake ids, no table", dict(batch_input_ids=[image_request()]), ValueError, "needs a prompt_table"),
    ("max_new_tokens 0", dict(max_new_tokens=0), ValueError, "max_new_tokens must be an int >= 1, got 0"),
    ("max_new_tokens a str", dict(max_new_tokens="8"), TypeError, "max_new_tokens must be an int, got str"),
    ("max_new_tokens True", dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int, got bool"),
    ("end_id past the vocabulary", dict(end_id=V), ValueError, r"end_id must be an int in \[-1, 151935\]"),
    ("pad_id -1", dict(pad_id=-1), ValueError, r"pad_id must be an int in \[0, 151935\]"),
    ("num_beams 0", dict(num_beams=0), ValueError, "num_beams must be an int >= 1"),
    ("beams that sample", dict(num_beams=2, top_k=5), ValueError, "beam search picks the best beams, it does not sample"),
    ("temperature 0", dict(temperature=0.0), ValueError, "temperature must be a finite number > 0"),
    ("temperature nan", dict(temperature=float("nan")), ValueError, "temperature must be a finite number"),
    ("top_k -1", dict(top_k=-1), ValueError, "top_k must be an int >= 0"),
    ("top_k 1.0", dict(top_k=1.0), TypeError, "top_k must be an int, got float"),
    ("top_p 1.5", dict(top_p=1.5), ValueError, "top_p must be a finite number >= 0 and <= 1"),
    ("early_stopping sometimes", dict(early_stopping="sometimes"), ValueError, "early_stopping must be one of True, False, 'never'"),
    ("early_stopping 1", dict(early_stopping=1), ValueError, "early_stopping must be one of"),
    ("negative seed", dict(random_seed=-1), ValueError, "random_seed must be an int in"),
    ("seed a float", dict(random_seed=1.0), TypeError, "random_seed must be an int, got float"),
    ("repetition_penalty 0", dict(repetition_penalty=0.0), ValueError, "repetition_penalty must be a finite number > 0"),
    ("stop words for two", dict(stop_words_list=[[[1]], [[2]]]), ValueError, r"one list of stop sequences per request \(1\)"),
    ("stop words flat", dict(stop_words_list=[151644]), ValueError, r"stop_words_list\[0\] must be a list of non-empty"),
    ("stop word past the vocabulary", dict(stop_words_list=[[[V]]]), ValueError, r"stop_words_list\[0\] must be a list"),
    ("tasks, no table", dict(prompt_tasks="0"), ValueError, "prompt_tasks / task_vocab_size were given without a prompt_table"),
    ("table a list", dict(batch_input_ids=[image_request()], prompt_table=[[0.0] * H]), TypeError, "prompt_table must be a floating-point torch.Tensor"),
    ("table float16", dict(batch_input_ids=[image_request()], prompt_table=table_with(dtype=torch.float16)), TypeError, "prompt_table is torch.float16 but the model runs in torch.float32"),
    ("table 64 wide", dict(batch_input_ids=[image_request()], prompt_table=torch.zeros(256, 64)), ValueError, r"prompt_table must be \[rows, 128\]"),
    ("NaN row read", dict(batch_input_ids=[image_request()], prompt_table=table_with(float("nan"))), ValueError, r"request 0: prompt-table row 7 \(read by id 151943 at position 11\) holds NaN"),
    ("inf row read", dict(batch_input_ids=[image_request()], prompt_table=table_with(float("inf"), row=0)), ValueError, "request 0: prompt-table row 0 .* holds NaN or infinite"),
    ("row past the table", dict(batch_input_ids=[image_request(V + 1)], prompt_table=table_with()), ValueError, "id 152192 at position 259 reads prompt-table row 256, but the table has 256 rows"),
    ("row past int32", dict(batch_input_ids=[torch.tensor([1, 2**32 + V + 3])], prompt_table=table_with()), ValueError, f"reads prompt-table row {2**32 + 3}"),
    ("task past the tables", dict(batch_input_ids=[image_request()] * 2, prompt_table=torch.zeros(2, 256, H), prompt_tasks="0,2"), ValueError, r"prompt_tasks \[0, 2\] must each name one of the 2 tables"),
    ("one task, two requests", dict(batch_input_ids=[image_request()] * 2, prompt_table=torch.zeros(2, 256, H), prompt_tasks="0"), ValueError, "1 prompt_tasks for 2 requests"),
    ("tasks not numbers", dict(batch_input_ids=[image_request()], prompt_table=table_with(), prompt_tasks="a"), ValueError, "comma-separated list of integers"),
    ("tasks floats", dict(batch_input_ids=[image_request()], prompt_table=table_with(), prompt_tasks=[0.5]), TypeError, "prompt_tasks must hold integers"),
    ("three tables, two requests", dict(batch_input_ids=[image_request()] * 2, prompt_table=torch.zeros(3, 256, H)), ValueError, "3 tables for 2 requests"),
    ("past its own table", dict(batch_input_ids=[image_request(V + 256)], prompt_table=torch.zeros(1, 256, H)), ValueError, "its own table .* restart at vocab_size"),
    ("task_vocab_size 0 with fake ids", dict(batch_input_ids=[image_request()], prompt_table=torch.zeros(1, H), task_vocab_size=0), ValueError, "task_vocab_size must be >= 1"),
    ("task_vocab_size a float", dict(batch_input_ids=[image_request()], prompt_table=table_with(), task_vocab_size=2.5), TypeError, "task_vocab_size must be an int, got float"),
    ("task_vocab_size disagrees", dict(batch_input_ids=[image_request()], prompt_table=torch.zeros(1, 256, H), task_vocab_size=128), ValueError, "task_vocab_size 128 disagrees"),
    ("extra ids for two", dict(input_token_extra_ids=[[0, 0, 0]] * 2), ValueError, r"one list of extra ids per request \(1\)"),
    ("extra ids a tensor", dict(input_token_extra_ids=torch.zeros(1, 3)), ValueError, r"one list of extra ids per request \(1\)"),
    ("extra ids too few", dict(input_token_extra_ids=[[0, 0]]), ValueError, r"input_token_extra_ids\[0\] must hold one extra id per input id \(3\)"),
    ("extra id negative", dict(input_token_extra_ids=[[0, -1, 0]]), ValueError, r"input_token_extra_ids\[0\] holds -1: extra ids are ints in \[0, 2\*\*64\)"),
    ("extra id a float", dict(input_token_extra_ids=[[0, 0.5, 0]]), ValueError, r"input_token_extra_ids\[0\] holds 0.5"),
    ("extra id past uint64", dict(input_token_extra_ids=[[0, 2**64, 0]]), ValueError, "holds 18446744073709551616"),
    ("extra id True", dict(input_token_extra_ids=[[0, True, 0]]), ValueError, "holds True"),
    ("hashes for two", dict(multimodal_hashes=[[], []]), ValueError, r"one list of picture hashes per request \(1\)"),
    ("a hash, no picture", dict(multimodal_hashes=[["red.png"]]), ValueError, r"multimodal_hashes\[0\] must hold one hash per picture of request 0 .*: 0\)"),
    ("an empty hash", dict(batch_input_ids=[image_request()], prompt_table=table_with(), multimodal_hashes=[[""]]), ValueError, r"multimodal_hashes\[0\]\[0\] must be a picture's hash"),
    ("a hash a float", dict(batch_input_ids=[image_request()], prompt_table=table_with(), multimodal_hashes=[[0.5]]), ValueError, r"multimodal_hashes\[0\]\[0\] must be a picture's hash"),
    ("a negative hash", dict(batch_input_ids=[image_request()], prompt_table=table_with(), multimodal_hashes=[[-1]]), ValueError, r"must be a picture's hash: non-empty bytes or str, or an int >= 0"),
]  # fmt: skip


@pytest.mark.parametrize("kind", ["engine", "trtllm", "model"])
@pytest.mark.parametrize("kwargs, error, match", [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_every_runner_refuses_a_bad_request_alike(runners, kind, kwargs, error, match):
    runner = runners[kind]
    with pytest.raises(error, match=match):
        runner.generate(**{"batch_input_ids": TEXT, "max_new_tokens": 4, **kwargs})
    assert not runner.busy  # the refusal freed the runner


@pytest.mark.parametrize("kind", ["engine", "trtllm", "model"])
@pytest.mark.parametrize(
    "max_new_tokens, error", [(0, ValueError), (-3, ValueError), ("8", TypeError), (2.5, TypeError), (True, TypeError)]
)
def test_generate_for_qwenvl_refuses_as_the_runner_does(runners, kind, max_new_tokens, error):
    with pytest.raises(error) as direct:
        runners[kind].generate(TEXT, max_new_tokens=max_new_tokens)
    with pytest.raises(error) as through:
        generate_for_qwenvl(runners[kind], TEXT, max_new_tokens)
    assert str(through.value) == str(direct.value)


def test_a_picture_path_in_a_span_is_read_by_the_model_only(runners):
    path_span = [torch.tensor([1, IMAGE_START_ID, *b"a.png", *[IMAGE_PAD_ID] * 251, IMAGE_END_ID])]
    for kind in ("engine", "trtllm"):
        with pytest.raises(ValueError, match="image span with the picture's path, which only the original model reads"):
            runners[kind].generate(path_span, max_new_tokens=2)


def test_outputs_hold_each_request_then_its_new_tokens_then_padding():
    ids = [torch.tensor([5, 6, 7]), torch.tensor([8])]
    new = torch.tensor([[[11, 12, 13]], [[21, 22, 0]]])  # [B, beams, t]
    out = build_outputs(ids, new, torch.tensor([[3], [1]]), pad_id=99, max_new_tokens=4, return_dict=True)
    assert out["output_ids"].tolist() == [[[5, 6, 7, 11, 12, 13, 99]], [[8, 21, 99, 99, 99, 99, 99]]]
    assert out["sequence_lengths"].tolist() == [[6], [2]] and out["output_ids"].dtype == torch.int32
    assert new_tokens(out, 0, 3) == [11, 12, 13] and new_tokens(out, 1, 1) == [21]
    assert torch.equal(build_outputs(ids, new, torch.tensor([[3], [1]]), 99, 4, False), out["output_ids"])


def test_the_sampling_settings_are_tensorrt_llms():
    assert SamplingConfig().greedy and SamplingConfig(top_k=0, top_p=0.0).greedy
    assert not SamplingConfig(top_k=0, top_p=0.3).greedy and not SamplingConfig(top_k=2).greedy
    assert SamplingConfig(num_beams=3, early_stopping="never").num_beams == 3


def edge_settings():
    """Every sampling setting at its edges: the smallest positive floats (float64's, float32's), the largest, and
    what float32 cannot hold; each knob tried greedy and sampling."""
    tiny = [5e-324, 1e-300, 1e-45, 1.2e-38, 1e-10]
    huge = [1e10, 1e38, 1e39, 1e300, 1.7976931348623157e308]
    cases = [dict(temperature=t, top_k=k, top_p=p) for t in tiny + huge for k, p in ((0, 1.0), (5, 0.0), (0, 0.5))]
    cases += [dict(top_k=0, top_p=p) for p in [*tiny, 0.5, 1.0]]
    cases += [dict(top_k=k, top_p=0.9) for k in (2, V - 1, V, V + 1, 2**31 - 1, 2**63 - 1, 2**70)]
    cases += [dict(repetition_penalty=r, top_k=k) for r in tiny + huge for k in (1, 0)]
    cases += [dict(num_beams=2, length_penalty=lp) for lp in (-1.7976931348623157e308, -1e300, -30.0, 0.0, 30.0, 1e300)]
    cases += [dict(random_seed=s, top_k=0, top_p=1.0) for s in (0, 2**63 - 1)]
    return cases


@pytest.mark.parametrize("kind", ["engine", "model"])
def test_every_sampling_setting_at_its_edges_gives_tokens_or_a_clear_refusal(runners, kind):
    """A temperature, top_p or repetition penalty that float32 rounds to 0 or to infinity, a top_k past the
    vocabulary, a length penalty that overflows a beam's score: each gives tokens of the vocabulary, or a ValueError
    that names the setting — never a torch error from inside (top_p=1e-300 was "probability tensor contains either
    inf, nan or element < 0")."""
    wrong = []
    for settings in edge_settings():
        try:
            out = runners[kind].generate(TEXT, max_new_tokens=3, return_dict=True, **settings)
        except ValueError as err:
            if not any(name in str(err) for name in settings):
                wrong.append(f"{settings}: {err}")
            continue
        except Exception as err:  # noqa: BLE001 — what the test looks for
            wrong.append(f"{settings}: {type(err).__name__}: {err}")
            continue
        ids = out["output_ids"]
        if not bool(((ids >= 0) & (ids < V)).all()):
            wrong.append(f"{settings}: ids outside the vocabulary {ids.tolist()}")
    assert not wrong, "\n".join(wrong)
