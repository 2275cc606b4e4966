#!/usr/bin/env bash
# Session 34's prepared calls 2 and 4 in one (NOTES "Session 34" §2-3; ~400 s): l2a's e2e decode tests (its graphs
# with the side branch against the CPU oracle); the 7B decode A/B at 512 x2 and 8K of main34, nowait, the one-boundary
# nw_* variants and the side-branch L2 prefetch variants l2a-l2d, alternated; the 0.5B bound check of b256.
# Build here first: bash bench/runs/2026-12-04_s34_prep/build5.sh; carry [".whl", ".out"].
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
V="main34 l2a l2b l2c l2d nw_qkv nw_attn nw_o nw_gu nw_dn nowait"
for rep in 1 2; do for v in $V; do nq_ab "$v" 512 "$rep"; done; done
stamp 512
for v in $V; do nq_ab "$v" 8192 1; done
stamp 8192
python3 bench/make_7b_file.py /tmp/s05.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for p in 4500 5500; do for v in main34 b256; do nq_ab "$v" "$p" 1 /tmp/s05.nanoqwen 0.5B; done; done
stamp end
