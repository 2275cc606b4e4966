#!/usr/bin/env bash
# Session 24 call 2: main; qkv = main + qkv's staging in one round trip; qg = qkv + gate/up's staging in one pass
# (x parked in shared memory through the block sum); qga = qg + the attention cluster merge as a push. Alternated at
# 512 / 8K-token prompts; the GEMV trace of qg; the frag GEMV / attention / switch tests and racecheck / synccheck
# with qg; the GEMV plan sweep.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # nq_ab, nq_quick_tests, nq_sanitize*: factored out after the run, same commands
mkdir -p nanoqwen_rt/lib build/lib; cp .v/qg/libnanoqwen.so nanoqwen_rt/lib/; cp .v/qg/libnanoqwen_testing.so build/lib/
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
ab() { for n in 512 8192; do for rep in 1 2; do vs="main qkv qg qga"; [ $n = 512 ] || vs="main qg"; for v in $vs; do
  nq_ab $v $n $rep; done; done; done; }
ab
nq_quick_tests
nq_sanitize "" "$(nq_sanitizer_model tiny)" racecheck synccheck
NANOQWEN_LIB=$PWD/.v/trace/libnanoqwen.so timeout 90 python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 > "$OUT/trace_7b.txt" 2>&1
echo "trace rc=$?" | tee -a "$OUT/summary.txt"
