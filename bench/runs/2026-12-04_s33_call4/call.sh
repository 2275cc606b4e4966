#!/usr/bin/env bash
# Session 33 call 4 (NOTES "Session 33" §4): where the merge kernel's hand-over time goes at 8K. The chain trace
# (session 30's chain_trace.py, which reads the merge kernel's records too; call 4 ran a copy of it, commit 96b1b6f) of trmk (3de48ba + the attention / merge-kernel / GEMV records) at 8K, then of trprod (4c0c86f
# with the attention and GEMV records, the last-block merge; session 30's chain_trace.py) on the same machine.
# Build first (build.sh), carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
echo "chain trace trmk 8192" | tee -a "$OUT/summary.txt"
NANOQWEN_LIB=$PWD/.v/trmk/libnanoqwen.so timeout 100 python3 bench/runs/2026-12-04_s30_call6/chain_trace.py \
  /tmp/q7b.nanoqwen 8192 2>&1 | tail -40 | tee -a "$OUT/summary.txt"
echo "chain trace trprod 8192" | tee -a "$OUT/summary.txt"
NANOQWEN_LIB=$PWD/.v/trprod/libnanoqwen.so timeout 100 python3 bench/runs/2026-12-04_s30_call6/chain_trace.py \
  /tmp/q7b.nanoqwen 8192 2>&1 | tail -32 | tee -a "$OUT/summary.txt"
