#!/usr/bin/env bash
# Issue #43 on one GPU (H100 or H200), from the repository root: the per-stage dump tests marked gpu, then the normal
# drift at Qwen-VL-Chat's shapes with random weights (no download) — the engine in float16 (torch and triton decode
# back ends), bfloat16 and float32 against the eager model in float32 — every result as JSON under $OUT/stage_drift/.
#
#     OUT=/path/to/results bash tools/gpu/stage_drift.sh                 # on the GPU machine
#     OUT=/tmp/dry-run bash tools/gpu/stage_drift.sh --device cpu        # the same commands at the toy model's size
#
# Writes tests.json (the pytest run: command, exit status, summary, the card) with tests.log beside it, and
# stage_drift-qwen-vl-chat.json (stage_drift-toy.json on a CPU): see docs/diff.md for the fields and where they go.
set -euo pipefail

DEVICE=cuda
if [ "${1:-}" = "--device" ]; then
    DEVICE="${2:?--device needs cpu or cuda}"
fi
case "$DEVICE" in cpu | cuda) ;; *) echo "--device must be cpu or cuda, got $DEVICE" >&2; exit 2 ;; esac
: "${OUT:?set OUT to the folder where the results go}"
RESULTS="$OUT/stage_drift"
mkdir -p "$RESULTS"
PY="${PYTHON:-python}"

if [ "$DEVICE" = cuda ]; then
    MARKS="gpu"  # the CUDA tests: the toy engine on the GPU (float32 with torch, float16 with triton and CUDA graphs)
    DRIFT=(--model qwen-vl-chat --device cuda --engines float16/torch,float16/triton,bfloat16/torch,float32/torch)
else
    MARKS="not gpu and not slow"  # the dry run: the same file's CPU tests
    DRIFT=(--model toy --device cpu --engines float16/torch,bfloat16/torch,float32/torch,float32/numba)
fi

TESTS=("$PY" -m pytest -p no:cacheprovider -q -m "$MARKS" tests/test_stagediff.py)
set +e
"${TESTS[@]}" > "$RESULTS/tests.log" 2>&1
STATUS=$?
set -e
"$PY" - "$RESULTS" "$STATUS" "$DEVICE" "$(printf '%q ' "${TESTS[@]}")" <<'PYTHON'
import json, platform, sys
from pathlib import Path

import torch

results, status, device, command = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
log = (results / "tests.log").read_text(errors="replace").strip().splitlines()
card = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else f"CPU: {platform.machine()}"
summary = {"card": card, "command": command.strip(), "exit_status": status, "summary": log[-1] if log else ""}
(results / "tests.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary))
PYTHON

"$PY" tools/stage_drift.py "${DRIFT[@]}" --out "$RESULTS"
exit "$STATUS"
