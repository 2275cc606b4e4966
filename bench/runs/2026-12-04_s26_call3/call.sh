#!/usr/bin/env bash
# Session 26 call 3: the handed-over RMSNorm, second form (.v/hand2: one sum of squares per 16 outputs, shuffled
# among the writer threads only; producers with >= 16 outputs a block) against .v/dpush (= 52eeaaf): decode A/B at
# 512 x2 and 8K, the GEMV trace of hand2 (.v/htrace2: the patched tree instrumented by
# bench/runs/2026-12-03_s25_prep/make_frag_trace.py with make_frag_trace.diff here applied), then the frag GEMV / e2e /
# sizes GPU tests with hand2 (rmsnorm_handoff.patch here is that tree's diff against 52eeaaf).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in dpush hand2; do nq_ab "$v" 512 "$rep"; done; done
for v in dpush hand2; do nq_ab "$v" 8192 1; done
NANOQWEN_LIB=$PWD/.v/htrace2/libnanoqwen.so timeout 150 python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 \
  > "$OUT/trace_7b.txt" 2>&1; echo "trace rc=$?" | tee -a "$OUT/summary.txt"
nq_use hand2
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gpu_frag_gemv.py tests/test_gpu_e2e.py \
  tests/test_gpu_sizes.py > "$OUT/tests.log" 2>&1; echo "tests rc=$? $(tail -1 "$OUT/tests.log")" | tee -a "$OUT/summary.txt"
