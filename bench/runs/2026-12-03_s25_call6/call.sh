#!/usr/bin/env bash
# Session 25 call 6 (the session's last device seconds): qstage = b268507 + the decode attention's q / k / v staging
# with every global load issued before any use (call 4's trace: wait -> q staged 0.82 us at 512 keys). Frag GEMV /
# attention / switch tests and racecheck with qstage; attn_bench obuf (b268507) vs qstage.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
mkdir -p nanoqwen_rt/lib build/lib; cp .v/qstage/libnanoqwen.so nanoqwen_rt/lib/; cp .v/qstage/libnanoqwen_testing.so build/lib/
nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "qstage " "$m" racecheck
for v in obuf qstage; do
  NANOQWEN_TESTING_LIB=$PWD/.v/$v/libnanoqwen_testing.so timeout 40 python3 bench/attn_bench.py > "$OUT/attn_$v.log" 2>&1
  echo "attn_bench $v rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^attn" "$OUT/attn_$v.log" | head -20 | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
done
