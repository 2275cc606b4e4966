#!/usr/bin/env bash
# Session 29 call 8 (NOTES "Session 29" §5): one decode GEMV alone (frag_bench.py: each 7B projection launched back to
# back, so one split throughout) under the driver's split (main28), 164 KB (s164 = cbc9f58), 196 KB (s196) and 228 KB
# (c100): if the L1 left over bounds a kernel's bytes in flight, gate/up and down slow down with the split even alone.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
for v in main28 s164 s196 c100; do
  NANOQWEN_TESTING_LIB="$PWD/.v/$v/libnanoqwen_testing.so" timeout 40 python3 bench/frag_bench.py --tokens 1 --iters 100 \
    > "$OUT/frag_$v.log" 2>&1
  echo "frag_bench $v rc=$?" | tee -a "$OUT/summary.txt"
  grep -iE "gemv|qkv|gate|down|^ *o" "$OUT/frag_$v.log" | head -8 | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
done
