#!/usr/bin/env bash
# Session 41's last call: #15's H200 table on main (every size at 512, then the 7B with its peers), only if the lent
# machine is an H200 (an H100's were measured earlier in the session). carry [".whl", ".out/libs.tar.xz"]; ~230 s.
set -uo pipefail
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing to measure"; exit 0 ;; esac
NQ_REV="${NQ_REV:-unknown}" bash bench/runs/2026-12-06_s36_suite/call.sh sizes
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 NANOQWEN_COMMIT="${NQ_REV:-unknown}"
[ -f /tmp/q7b.nanoqwen ] || timeout 120 python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet
timeout 100 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --json "$OUT/bench7b.json" 2>&1 | tail -16
