"""The benchmark runs end to end on the tiny model and reports a table and JSON of sane numbers (no speed asserted)."""

import json

import pytest
import torch

from qwenvl_lab import bench
from qwenvl_lab.engine.layers import weight_bytes_per_token


@pytest.mark.slow
def test_tiny_benchmark_json(tmp_path, capsys):
    pytest.importorskip("numba", reason="the benchmark's default on a CPU is the numba back end")
    path = tmp_path / "out" / "bench.json"
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


def test_chat_turns_are_timed_beside_a_turn_after_the_fewest(capsys):
    report = bench.main(["--model", "tiny", "--chat-turns", "3", "1", "--repeats", "2", "--new-tokens", "2"])
    assert report["max_input_len"] == 640 and list(report["turn_s"]) == [1, 3]
    assert report["ratio_to_first_mark"][3] == report["turn_s"][3] / report["first_mark_turn_s"][3]
    assert report["left_out"] == {1: 0, 3: 0} and '"turn_s"' in capsys.readouterr().out
