#!/usr/bin/env bash
# Session 31 call 5 (NOTES "Session 31" §4): early = fcb7b1b + merge_early_loads.patch (the last split block's first
# 16 splits' partials of each thread's first item loaded before the split weights, beside the (m, l) loads) against
# prod (fcb7b1b, the carried product library): early's attention tests (testing library), then the 7B decode A/B on
# the global path at 8K x2, 4,000 and 32K.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
mkdir -p .v/prod && cp nanoqwen_rt/lib/libnanoqwen.so .v/prod/
nq_use early
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention" tests/test_gpu_kernels.py \
  2>&1 | tail -1 | sed "s/^/early /" | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in prod early; do nq_ab "$v" 8192 "$rep"; done; done
for v in prod early; do nq_ab "$v" 4000 1; done
for v in prod early; do nq_ab "$v" 32000 1; done
