#!/usr/bin/env bash
# Session 41's last call: #15's H200 table on main, only if the lent machine is an H200 (an H100's were measured
# earlier in the session). In order of use, so that a short call still returns the first ones: the 7B with its peers
# and at 8K, then gpu_check.sh's sizes step on the 14B (its gate/up's 5 warps have no H200 number), the 32B, the 3B,
# 1.5B and 0.5B. carry [".whl", ".out/libs.tar.xz"]; ~25-40 s a size.
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing to measure"; exit 0 ;; esac
source "$(dirname "$0")/../../device_prelude.sh"   # unpacks .out/libs.tar.xz, installs .whl/, PYTHONPATH
export NANOQWEN_COMMIT="${NQ_REV:-unknown}"
keep='^(read-only|TTFT|decode|bytes read|MBU|torch|cuBLAS)'
timeout 60 python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet
timeout 60 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda 2>&1 | grep -E "$keep" | sed 's/^/7B: /'
timeout 60 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens 8192 --new-tokens 64 \
  --repeats 2 2>&1 | grep -E "$keep" | sed 's/^/7B 8K: /'
rm -f /tmp/q7b.nanoqwen
NQ_SIZES="14B 32B 3B 1.5B 0.5B" bash bench/gpu_check.sh sizes
