"""The benchmark runs end to end on the tiny model and reports a table and JSON of sane numbers (no speed asserted)."""

import json
import re

import pytest
import torch

from qwenvl_lab import bench
from qwenvl_lab.engine.layers import weight_bytes_per_token
from qwenvl_lab.tokenizing import load_tokenizer, make_context


@pytest.mark.slow
def test_tiny_benchmark_json(tmp_path, capsys):
    pytest.importorskip("numba", reason="the benchmark's default on a CPU is the numba back end")
    path = tmp_path / "out" / "bench.json"
    path.parent.mkdir()
    report = bench.main(
        ["--model", "tiny", "--batch", "2", "1", "--new-tokens", "24", "--repeats", "2", "--json", path]
    )
    saved = json.loads(path.read_text())
    assert saved["command"] == (
        f"python -m qwenvl_lab.bench --model tiny --batch 2 1 --new-tokens 24 --repeats 2 --json {path}"
    )
    assert saved["results"] == json.loads(json.dumps(report["results"]))
    assert {"cpu", "torch", "transformers"} <= saved["hardware"].keys()
    model, bw = saved["model"], saved["bandwidth"]
    assert model["hidden_size"] == 128 and model["layers"] == 2 and model["dtype"] == "float32"
    assert bw["bytes"] == 151936 * 128 * 4 and bw["gb_per_s"] > 0
    assert bw["products_per_run"] == 23  # timed like the 23 decode steps of a 24-token run
    assert bw["peak_gb_per_s"] >= max(bw["probes_gb_per_s"]) == bw["gb_per_s"]  # a single product beats a run's mean
    assert saved["settings"]["build_config"]["max_prompt_embedding_table_size"] == 512  # 256 × 1 picture × batch 2
    order = [(r["method"], r["batch"]) for r in saved["results"]]
    assert order == [("eager", 1), ("eager", 2), ("engine", 1), ("engine", 2)]
    for r in saved["results"]:
        assert r["ttft_ms"] > 0 and r["total_ms"] > r["ttft_ms"] and r["peak_mem_mb"] >= 0
        if r["method"] == "engine":
            assert r["same_tokens_as_eager"] == r["batch"]  # fp32 on the CPU: the same greedy tokens
    assert saved["results"][2]["throughput_vs_batch1"] == 1.0
    assert saved["products_alone"]["ms"] > 0
    table = capsys.readouterr().out
    assert "decode tok/s" in table and "% of limit" in table and "CUDA graphs off" in table
    assert saved["settings"]["backend"] == "numba" and "decode back end 'numba'" in table  # the CPU's fast path
    assert "matrix products alone" in table
    assert sum(line.startswith(("eager ", "engine ")) for line in table.splitlines()) == 4


def test_weight_bytes_count_one_embedding_row():
    weights = {
        "transformer.vocab_embedding.weight": torch.zeros(10, 4),
        "lm_head.weight": torch.zeros(10, 4),
        "transformer.ln_f.weight": torch.zeros(4, dtype=torch.float16),
    }
    assert weight_bytes_per_token(weights) == 4 * 4 + 10 * 4 * 4 + 4 * 2


def test_bandwidth_probe_reads_the_matrix():
    probe = bench.bandwidth_probe(torch.randn(256, 64), runs=3, length=4)
    assert probe["bytes"] == 256 * 64 * 4 and probe["seconds"] > 0 and "[256, 64]" in probe["matrix"]
    assert probe["products_per_run"] == 4 and set(probe["gb_per_s_by_layout"]) == {"[out, in]", "[in, out]"}
    assert probe["gb_per_s"] == max(probe["gb_per_s_by_layout"].values()) <= probe["peak_gb_per_s"]


def test_timed_runs_time_runs_of_calls_like_decode_steps(monkeypatch):
    """runs × length calls; a run's mean counts its slow calls, the single best does not (on a clock the calls move:
    no time is measured here)."""
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    durations = iter([1.0, 1.0, 7.0, 2.0, 2.0, 2.0])  # seconds of each call: run 1 mean 3, run 2 mean 2

    def call():
        clock[0] += next(durations)

    assert bench.timed_runs(call, runs=2, length=3, device=torch.device("cpu")) == (2.0, 1.0)


def test_bad_options(tmp_path):
    for argv in (["--new-tokens", "1"], ["--device", "tpu"], ["--model", "qwen-vl-chat", "--device", "cpu"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    with pytest.raises(SystemExit):  # a folder without config.json: refused as the options are read
        bench.main(["--checkpoint", str(tmp_path), "--new-tokens", "2"])


@pytest.mark.slow
def test_first_answers_are_timed_in_fresh_processes(tmp_path):
    report = bench.main(
        [
            "--model",
            "tiny",
            "--batch",
            "1",
            "--new-tokens",
            "8",
            "--repeats",
            "1",
            "--no-eager",
            "--backend",
            "torch",
            "--first-answer",
            "--json",
            tmp_path / "b.json",
        ]
    )
    times = json.loads((tmp_path / "b.json").read_text())["first_answer_s"]
    assert times == report["first_answer_s"] and set(times) == {"cold", "saved_choices"}
    assert all(t["load_s"] > 0 and t["first_answer_s"] > 0 for t in times.values())


def test_integrity_cost_reports_each_verify_level():
    report = bench.main(["--integrity", "--model", "tiny", "--repeats", "1"])
    assert report["load_s"].keys() == {"none", "quick", "full"} and report["engine_bytes"] > 10**6
    assert report["full_size_full_check_s"] == report["full_size_engine_bytes"] / report["checksum_bytes_per_s"]


def test_a_busy_machine_gets_one_line_of_advice(monkeypatch, capsys):
    def too_busy(*args, **kwargs):
        raise bench.MachineTooBusy("the machine is too busy to measure; rerun with more --repeats")

    monkeypatch.setattr(bench, "measure", too_busy)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", "tiny", "--batch", "1", "--new-tokens", "4", "--repeats", "1", "--no-eager"])
    assert exit_info.value.code == "qwenvl-lab bench: the machine is too busy to measure; rerun with more --repeats"


@pytest.mark.slow
def test_kv_cache_reuse_gain_is_reported_with_the_ids_each_side_computed(tmp_path, capsys):
    """--kv-cache-reuse: a chat whose later turns compute only what follows the history, a batch that computes only
    what follows the picture, the same answers either way (fp32 on the CPU), the pool's size; no speed asserted."""
    path = tmp_path / "reuse.json"
    argv = ["--model", "tiny", "--kv-cache-reuse", "--turns", "3", "--batch", "2", "--new-tokens", "8"]
    report = bench.main([*argv, "--repeats", "1", "--backend", "torch", "--json", path])
    saved = json.loads(path.read_text())
    assert saved["command"].startswith("python -m qwenvl_lab.bench --model tiny --kv-cache-reuse")
    assert saved["chat"] == json.loads(json.dumps(report["chat"]))
    turns = saved["chat"]["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and turns[0]["reused_ids"] == 0
    tokenizer, history = load_tokenizer(), []
    for k, turn in enumerate(turns):  # make_context's chat with each earlier answer's 8 ids in it
        query = tokenizer.from_list_format([{"image": bench.PICTURE_NAME}] * (k == 0) + [{"text": question(k + 1)}])
        assert turn["prompt_ids"] == len(make_context(tokenizer, query, history)[1]) + 8 * k
        history.append((query, ""))
    for before, turn in zip(turns, turns[1:]):  # each turn re-sends the one before, its answer and a question
        assert turn["computed_ids_without"] == turn["prompt_ids"] > turn["computed_ids_with"]
        assert turn["reused_ids"] + turn["computed_ids_with"] == turn["prompt_ids"]
        assert turn["reused_ids"] >= before["prompt_ids"] // 32 * 32  # at least the history's whole blocks
        assert turn["ttft_ratio_median_of_pairs"] > 0
    assert saved["chat"]["same_answers_with_and_without"] is True
    assert turns[-1]["prompt_ids"] + 8 == bench.chat_length(3, 8)
    [batch] = saved["same_picture_batch"]
    first, *others = [
        make_context(tokenizer, tokenizer.from_list_format([{"image": bench.PICTURE_NAME}, {"text": question(k)}]))[1]
        for k in (1, 2, 3)
    ]
    shared = min(next(i for i, (a, b) in enumerate(zip(first, o)) if a != b) for o in others)  # up to the question
    assert batch["batch"] == 2 and batch["reused_ids"] == 2 * (shared // 32 * 32)
    assert batch["computed_ids_without"] == sum(batch["prompt_ids"]) == batch["reused_ids"] + batch["computed_ids_with"]
    settings = saved["settings"]
    assert settings["kv_cache_key"] == "mm_hash" and settings["kv_block_size"] == 32 and settings["kv_pool_bytes"] > 0
    assert "turns 2+: time to first token" in capsys.readouterr().out


def question(k: int) -> str:
    """The benchmark's k-th chat question (from 1)."""
    return bench.CHAT_QUESTION.format(k=k)


def test_kv_cache_reuse_options_are_checked():
    for argv in (
        ["--kv-cache-reuse", "--turns", "1"],
        ["--kv-cache-reuse", "--turns", "0"],
        ["--kv-cache-reuse", "--turns", "33"],
        ["--kv-cache-reuse", "--turns", "2.5"],
        ["--kv-cache-reuse", "--turns", "32", "--new-tokens", "300"],  # past Qwen-VL's positions
        ["--turns", "3"],  # without --kv-cache-reuse
        ["--kv-cache-reuse", "--integrity"],
        ["--kv-cache-reuse", "--first-answer"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert bench.parse_args(["--kv-cache-reuse", "--turns", "2"]).turns == 2
    assert bench.parse_args(["--kv-cache-reuse"]).turns == 4


def test_the_json_file_is_checked_before_the_benchmark_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_benchmark", lambda *a: pytest.fail("the benchmark ran"))
    (tmp_path / "earlier.json").write_text('{"mine": 1}')
    cases = [
        (tmp_path / "earlier.json", [], "already exists: pass overwrite=True \\(--overwrite\\) to replace it"),
        (tmp_path / "missing" / "b.json", [], r"the folder .*missing does not exist: create it first"),
        (tmp_path, [], "is a folder: give the path of a file to write"),
    ]
    for path, more, message in cases:
        with pytest.raises(SystemExit) as exit_status:
            bench.main(["--model", "tiny", "--json", path, *more])
        assert exit_status.value.code == 2
        assert re.search(rf"--json '.*'.*{message}", capsys.readouterr().err)
    assert (tmp_path / "earlier.json").read_text() == '{"mine": 1}' and not (tmp_path / "missing").exists()
    monkeypatch.setattr(bench, "run_benchmark", lambda *a: {"results": []})
    monkeypatch.setattr(bench, "format_table", lambda report: "")
    bench.main(["--model", "tiny", "--json", tmp_path / "earlier.json", "--overwrite"])
    assert json.loads((tmp_path / "earlier.json").read_text())["results"] == []


def test_chat_turns_are_timed_beside_a_turn_after_the_fewest(capsys):
    report = bench.main(["--model", "tiny", "--chat-turns", "3", "1", "--repeats", "2", "--new-tokens", "2"])
    assert report["max_input_len"] == 640 and list(report["turn_s"]) == [1, 3]
    assert report["ratio_to_first_mark"][3] == report["turn_s"][3] / report["first_mark_turn_s"][3]
    assert report["left_out"] == {1: 0, 3: 0} and '"turn_s"' in capsys.readouterr().out
