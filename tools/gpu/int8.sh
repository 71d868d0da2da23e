#!/usr/bin/env bash
# Issue 44 on one GPU (H100 or H200): weight-only INT8 beside float16, and where a float16 decode step's time goes.
#
#   OUT=/path/to/results bash tools/gpu/int8.sh            # on the GPU machine, from the repository's root
#   OUT=/tmp/dry bash tools/gpu/int8.sh --dry-run          # the same steps on this CPU with the toy model
#
# Writes under $OUT/int8/ (each JSON names the card and the command that made it):
#   tests.json                 the CUDA tests (test_engine_cuda, _triton, _int8) on the compiled kernels: counts, failures
#   bench-fp16-int8.json       python -m qwenvl_lab.bench, Qwen-VL-Chat's shapes, float16 and weight-only INT8 side by
#                              side at batch 1 and 8 (speed, limits, peak memory, TTFT, drift per layer and of logits)
#   profile-fp16-batch1.json   tools/decode_profile.py: one float16 decode step by role (products, norms, attention,
#                              pick and bookkeeping, gaps inside and outside the CUDA graph), batch 1
#   profile-int8-batch1.json   the same for the INT8 engine
#   profile-fp16-batch8.json   the float16 step at batch 8
#   bench-fp32.json            the float32 engine at batch 1: the precision table's first row (memory, speed)
#   steps.json                 each step's command, exit status and seconds
# About six minutes on an H100, most of it the Triton autotuner timing tile shapes the first time it meets a
# product shape; each step has its own time limit (at most 15 minutes in all).
set -u
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
: "${OUT:?set OUT to the folder the results go in}"
DIR="$OUT/int8"
mkdir -p "$DIR"
PY="${PYTHON:-python}"
STEPS="$DIR/steps.jsonl"
: > "$STEPS"

run() {  # run NAME TIMEOUT COMMAND...: its output in NAME.log, its exit status and time in steps.jsonl
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$DIR/$name.log" 2>&1
  local rc=$?
  "$PY" - "$name" "$rc" "$((SECONDS - start))" "$*" >> "$STEPS" <<'PYEOF'
import json, sys
name, rc, seconds, command = sys.argv[1:]
print(json.dumps({"step": name, "returncode": int(rc), "seconds": int(seconds), "command": command}))
PYEOF
  echo "$name: exit $rc after $((SECONDS - start)) s"
  return "$rc"
}

if [ "$DRY" = 1 ]; then
  run tests 900 "$PY" -m pytest -p no:cacheprovider -q -m "not slow" tests/test_engine_int8.py tests/test_decode_profile.py --junitxml "$DIR/tests.xml"
  run bench 900 "$PY" -m qwenvl_lab.bench --model toy --device cpu --threads 1 --batch 1 2 --new-tokens 8 --repeats 1 --no-eager --weight-only int8 --drift-steps 4 --json "$DIR/bench-fp16-int8.json"
  run profile-fp16-batch1 900 "$PY" tools/decode_profile.py --model toy --device cpu --steps 4 --json "$DIR/profile-fp16-batch1.json"
  run profile-int8-batch1 900 "$PY" tools/decode_profile.py --model toy --device cpu --steps 4 --weight-only int8 --json "$DIR/profile-int8-batch1.json"
else
  run tests 240 "$PY" -m pytest -p no:cacheprovider -q tests/test_engine_cuda.py tests/test_engine_triton.py tests/test_engine_int8.py --junitxml "$DIR/tests.xml"
  run bench 240 "$PY" -m qwenvl_lab.bench --model qwen-vl-chat --device cuda --dtype float16 --batch 1 8 --new-tokens 128 --repeats 3 --no-eager --weight-only int8 --drift-steps 32 --json "$DIR/bench-fp16-int8.json"
  run profile-fp16-batch1 120 "$PY" tools/decode_profile.py --model qwen-vl-chat --device cuda --batch 1 --tuning-file "$DIR/tuning.json" --json "$DIR/profile-fp16-batch1.json" ||
    run profile-fp16-batch1-no-graphs 120 "$PY" tools/decode_profile.py --model qwen-vl-chat --device cuda --batch 1 --no-cuda-graphs --tuning-file "$DIR/tuning.json" --json "$DIR/profile-fp16-batch1-no-graphs.json"
  run profile-int8-batch1 120 "$PY" tools/decode_profile.py --model qwen-vl-chat --device cuda --batch 1 --weight-only int8 --tuning-file "$DIR/tuning.json" --json "$DIR/profile-int8-batch1.json"
  run profile-fp16-batch8 120 "$PY" tools/decode_profile.py --model qwen-vl-chat --device cuda --batch 8 --tuning-file "$DIR/tuning.json" --json "$DIR/profile-fp16-batch8.json"
  run bench-fp32 150 "$PY" -m qwenvl_lab.bench --model qwen-vl-chat --device cuda --dtype float32 --batch 1 --new-tokens 64 --repeats 2 --no-eager --json "$DIR/bench-fp32.json"
fi

# the test counts and failures as JSON, and the steps' record, each with the card's name
"$PY" - "$DIR" "$DRY" <<'PYEOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

folder, dry = Path(sys.argv[1]), sys.argv[2] == "1"
card = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (dry run on the CPU)"
steps = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines() if line.strip()]
(folder / "steps.json").write_text(json.dumps({"card": card, "dry_run": dry, "steps": steps}, indent=2) + "\n")
tests = {"card": card, "dry_run": dry, "command": next((s["command"] for s in steps if s["step"] == "tests"), None)}
xml = folder / "tests.xml"
if xml.is_file():
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests.update({key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")})
    tests["seconds"] = float(suite.get("time", 0))
    tests["not_passed"] = [
        {"test": f"{case.get('classname')}::{case.get('name')}", "outcome": child.tag, "message": (child.get("message") or "")[:500]}
        for case in suite.iter("testcase")
        for child in case
        if child.tag in ("failure", "error", "skipped")
    ]
(folder / "tests.json").write_text(json.dumps(tests, indent=2) + "\n")
print(json.dumps({"card": card, "tests": {k: tests.get(k) for k in ("tests", "failures", "errors", "skipped")}}))
PYEOF
rm -f "$STEPS"
