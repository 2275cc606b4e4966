#!/usr/bin/env bash
# Session 24 call 1: the prepared patches (attention cluster push; + qkv staging in one round trip; + gate/up's staging
# in one pass, `all`) against main,
# alternated, at 512 / 8K-token prompts; a GEMV trace of `all` without the attention patch; the GEMV plan sweep; the attention
# kernel tests and racecheck / synccheck on sanitize_tiny with `all`.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # nq_ab, nq_quick_tests, nq_sanitize*: factored out after the run, same commands
cp .v/all/libnanoqwen.so nanoqwen_rt/lib/; mkdir -p build/lib; cp .v/all/libnanoqwen_testing.so build/lib/
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
ab() { for n in 512 8192; do for rep in 1 2; do vs="main attn attnqkv all"; [ $n = 512 ] || vs="main all"; for v in $vs; do
  nq_ab $v $n $rep; done; done; done; }
ab
nq_quick_tests
nq_sanitize "" "$(nq_sanitizer_model tiny)" racecheck synccheck
NANOQWEN_LIB=$PWD/.v/trace/libnanoqwen.so timeout 90 python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 > "$OUT/trace_7b.txt" 2>&1
echo "trace rc=$?" | tee -a "$OUT/summary.txt"
timeout 150 python3 bench/frag_bench.py --gemv-plans > "$OUT/gemv_plans.txt" 2>&1
echo "gemv plans rc=$?" | tee -a "$OUT/summary.txt"
