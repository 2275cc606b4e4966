#!/usr/bin/env bash
# Session 25 call 1: attn2 = main a9e5bca + the attention CLUSTER build's merge by st.async (session 24 §6's patch)
# + the global (last-block) merge signalled by one acq_rel atomic of thread 0 instead of a __threadfence by every
# thread on both sides. Tests and racecheck / synccheck with attn2; attention alone (attn_bench) base vs attn2; 7B
# decode A/B at 512 and 8K, alternated.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
mkdir -p nanoqwen_rt/lib build/lib; cp .v/attn2/libnanoqwen.so nanoqwen_rt/lib/; cp .v/attn2/libnanoqwen_testing.so build/lib/
nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "attn2 " "$m" racecheck synccheck
for v in base attn2; do
  NANOQWEN_TESTING_LIB=$PWD/.v/$v/libnanoqwen_testing.so timeout 90 python3 bench/attn_bench.py > "$OUT/attn_$v.log" 2>&1
  echo "attn_bench $v rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^attn" "$OUT/attn_$v.log" | head -20 | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in base attn2; do nq_ab $v 512 $rep; done; done
for rep in 1 2; do for v in base attn2; do nq_ab $v 8192 $rep; done; done
