#!/usr/bin/env bash
# Session 30 call 3 (NOTES "Session 30" §3): the 8-warp decode attention capped at 128 registers (attn128 =
# main30 + __launch_bounds__(256, 2) on attn_decode_kernel's 8-warp builds: 128 registers, 16 / 4 bytes spilled),
# so that a block (32 K registers) fits beside two q/k/v GEMV blocks (2 x 15.9 K) and its pre-wait K/V loads start
# before a q/k/v block retires. attn128's attention / switch / frag tests, racecheck and synccheck; then the decode
# A/B against main30 (b189507) at 512 x2, 8K x2, 32K; attn_bench (launches alone) of both.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use attn128; nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "attn128 " "$m" racecheck synccheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for p in 512 8192; do for rep in 1 2; do for v in main30 attn128; do nq_ab "$v" "$p" "$rep"; done; done; done
for v in main30 attn128; do nq_ab "$v" 32000 1; done
for v in main30 attn128; do
  NANOQWEN_TESTING_LIB="$PWD/.v/$v/libnanoqwen_testing.so" timeout 90 python3 bench/attn_bench.py --contexts 577 8192 32768 \
    --decode-kps 32 2>&1 | grep -E "^attn 7B +decode" | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
done
