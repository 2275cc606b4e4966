#!/usr/bin/env bash
# Session 26 call 2: the RMSNorm handed over between decode GEMVs (.v/hand: o and down write x * norm_w and sums of
# squares; gate/up and the next qkv stage from them) against .v/dpush (= 52eeaaf, main before it). GPU tests of the
# frag GEMV (with the new handoff test), e2e (GPU vs CPU oracle) and sizes with hand; memcheck / racecheck /
# synccheck on tiny-py; decode A/B at 512 x2 and 8K; the GEMV trace of hand (.v/htrace: the patched tree instrumented
# by bench/runs/2026-12-03_s25_prep/make_frag_trace.py with make_frag_trace.diff here applied).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
nq_use hand
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gpu_frag_gemv.py tests/test_gpu_e2e.py \
  tests/test_gpu_sizes.py > "$OUT/tests.log" 2>&1; echo "tests rc=$? $(tail -1 "$OUT/tests.log")" | tee -a "$OUT/summary.txt"
m=$(nq_sanitizer_model tiny); nq_sanitize "hand " "$m" memcheck racecheck synccheck
for rep in 1 2; do for v in dpush hand; do nq_ab "$v" 512 "$rep"; done; done
for v in dpush hand; do nq_ab "$v" 8192 1; done
NANOQWEN_LIB=$PWD/.v/htrace/libnanoqwen.so timeout 150 python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 \
  > "$OUT/trace_7b.txt" 2>&1; echo "trace rc=$?" | tee -a "$OUT/summary.txt"
