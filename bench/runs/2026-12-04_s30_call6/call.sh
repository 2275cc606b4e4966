#!/usr/bin/env bash
# Session 30 call 6 (NOTES "Session 30" §5): the q/k/v -> attention -> o hand-overs traced in the decode chain at
# 512 and 8K-token prompts (.v/chtrace = f0f7caa's csrc with make_attn_trace.py and make_frag_trace.py written in;
# never main).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for p in 512 8192; do
  NANOQWEN_LIB=$PWD/.v/chtrace/libnanoqwen.so timeout 100 python3 bench/runs/2026-12-04_s30_call6/chain_trace.py \
    /tmp/q7b.nanoqwen $p 2>&1 | tail -32 | tee -a "$OUT/summary.txt"
done
