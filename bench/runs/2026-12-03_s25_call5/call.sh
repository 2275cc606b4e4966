#!/usr/bin/env bash
# Session 25 call 5: obuf = 8b77812 + the decode attention's warp-merge buffer padded (rows D + 8 floats) and written
# as float2 (call 4's trace: the block merge 1.47 us; its scalar stores were 8-way bank conflicts). Tests and
# racecheck / synccheck with obuf; attn_bench attn2 (8b77812) vs obuf; 7B decode A/B at 512 and 8K, alternated.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
mkdir -p nanoqwen_rt/lib build/lib; cp .v/obuf/libnanoqwen.so nanoqwen_rt/lib/; cp .v/obuf/libnanoqwen_testing.so build/lib/
nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "obuf " "$m" racecheck synccheck
for v in attn2 obuf; do
  NANOQWEN_TESTING_LIB=$PWD/.v/$v/libnanoqwen_testing.so timeout 90 python3 bench/attn_bench.py > "$OUT/attn_$v.log" 2>&1
  echo "attn_bench $v rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^attn" "$OUT/attn_$v.log" | head -20 | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in attn2 obuf; do nq_ab $v 512 $rep; done; done
for rep in 1 2; do for v in attn2 obuf; do nq_ab $v 8192 $rep; done; done
