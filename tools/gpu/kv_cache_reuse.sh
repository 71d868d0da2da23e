#!/usr/bin/env bash
# Issue #42 on the GPU machine: the CUDA tests of KV-cache block reuse (the ids-only bug and its three fixes, reuse on
# and off the same chat, the toy engine in CUDA graphs with each decode back end), then the time to first token with
# and without reuse at Qwen-VL-Chat's size (float16, random weights). Every result is JSON under $OUT/kv_cache_reuse/:
#   tests.json                 the CUDA tests' outcome (and tests.log, tests.xml)
#   <card>-<model>-<dtype>.json  python -m qwenvl_lab.bench --kv-cache-reuse's report (its command and hardware inside)
#   summary.json               the card, each command, its exit status and the figures docs/engine.md quotes
# Run from the repository root:  OUT=/some/folder bash tools/gpu/kv_cache_reuse.sh
# A dry run of the same steps on a CPU (the toy model, the numba back end; the CUDA tests skip):
#   OUT=/tmp/out bash tools/gpu/kv_cache_reuse.sh --device cpu
set -euo pipefail

device=cuda
if [[ $# -gt 0 ]]; then
    if [[ $# -ne 2 || "$1" != "--device" || ! "$2" =~ ^(cpu|cuda)$ ]]; then
        echo "usage: OUT=FOLDER bash tools/gpu/kv_cache_reuse.sh [--device cpu|cuda]" >&2
        exit 2
    fi
    device=$2
fi
out="${OUT:?set OUT to the folder the results go to}/kv_cache_reuse"
mkdir -p "$out"
python=${PYTHON:-python}

card=$("$python" -c "import torch; print(torch.cuda.get_device_name() if '$device' == 'cuda' else 'cpu')")
tag=$(printf '%s' "$card" | tr '[:upper:] ' '[:lower:]-' | tr -cd 'a-z0-9-')

# 1. the CUDA tests (marked gpu; on a CPU they skip)
tests=("$python" -m pytest -p no:cacheprovider -q -m gpu tests/test_engine_kv_reuse.py --junitxml="$out/tests.xml")
set +e
"${tests[@]}" >"$out/tests.log" 2>&1
tests_status=$?
set -e

# 2. the benchmark: a 4-turn chat about one picture, batches of 1, 4 and 8 questions about one picture
if [[ $device == cuda ]]; then
    bench=("$python" -m qwenvl_lab.bench --model qwen-vl-chat --device cuda --dtype float16 --kv-cache-reuse
        --turns 4 --new-tokens 32 --batch 1 4 8 --repeats 3 --json "$out/$tag-qwen-vl-chat-fp16.json")
else
    bench=("$python" -m qwenvl_lab.bench --model toy --device cpu --threads 1 --kv-cache-reuse
        --turns 4 --new-tokens 32 --batch 1 4 --repeats 3 --json "$out/$tag-toy-fp32.json")
fi
set +e
"${bench[@]}" >"$out/bench.log" 2>&1
bench_status=$?
set -e

"$python" - "$out" "$card" "$tests_status" "$bench_status" "${bench[-1]}" "${tests[*]}" "${bench[*]}" <<'PY'
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, card, tests_status, bench_status, bench_json, tests_command, bench_command = sys.argv[1:]
suite = ET.parse(Path(out) / "tests.xml").getroot()
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
cases = []
for case in suite.iter("testcase"):
    outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
    cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "seconds": float(case.get("time", 0))})
tests = {"card": card, "command": tests_command, "exit_status": int(tests_status), "cases": cases}
(Path(out) / "tests.json").write_text(json.dumps(tests, indent=2) + "\n")
summary = {"card": card, "tests": {k: tests[k] for k in ("command", "exit_status")}, "bench": {"command": bench_command, "exit_status": int(bench_status), "json": bench_json}}
if int(bench_status) == 0:
    report = json.loads(Path(bench_json).read_text())
    chat = report["chat"]
    summary["figures"] = {
        "chat_ttft_ratio_turns_2_plus": round(chat["ttft_ratio_turns_2_plus"], 2),
        "chat_ttft_ratio_turns_2_plus_median_of_pairs": round(chat["ttft_ratio_turns_2_plus_median_of_pairs"], 2),
        "chat_computed_ids_turns_2_plus": chat["computed_ids_turns_2_plus"],
        "chat_turns": [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in t.items()} for t in chat["turns"]],
        "chat_same_answers_with_and_without": chat["same_answers_with_and_without"],
        "batches": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in b.items() if k != "prompt_ids"} for b in report["same_picture_batch"]],
        "kv_pool": {k: report["settings"][k] for k in ("kv_block_size", "kv_pool_blocks", "kv_pool_bytes")},
    }
(Path(out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
exit $(( tests_status != 0 && tests_status != 5 || bench_status != 0 ))
