#!/usr/bin/env bash
# Session 34's prepared call 4 (NOTES "Session 34" §3): the side-branch L2 prefetch of gate/up's first chunks.
# Build here first: bash bench/runs/2026-12-04_s34_prep/build3.sh (main34, l2a, l2b, l2c, l2d; ~12 minutes); carry
# [".whl", ".out"]. l2a's e2e decode tests (its graphs with the side branch against the CPU oracle), then the 7B
# decode A/B at 512 x2 and 8K, alternated.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
stamp() { echo "t $(date +%s) $*" >> "$OUT/summary.txt"; }
stamp start
nq_use l2a
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
  -k "decode or greedy or generate or short_context" tests/test_gpu_e2e.py > "$OUT/tests_l2a.log" 2>&1
tail -2 "$OUT/tests_l2a.log" | sed "s/^/l2a /" | tee -a "$OUT/summary.txt"
stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main34 l2a l2b l2c l2d; do nq_ab "$v" 512 "$rep"; done; done
stamp 512
for v in main34 l2a l2b l2c l2d; do nq_ab "$v" 8192 1; done
stamp end
