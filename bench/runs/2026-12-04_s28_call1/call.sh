#!/usr/bin/env bash
# Session 28 call 1 (NOTES "Session 28" §1): the dot's instruction count, four ways, and every group on the tensor
# cores. final = 4b64ca5's csrc (sm_90a; main's gemv_frag SASS); imad = session 27's frag_dot_imad_reload.patch
# (shifts as IMAD.HI, scale reload after the loop); xp2 = frag_dot_x_mma_order.patch (staged x in the mma B order:
# one LDS.128 a step pair instead of 4 LDS.32; the next chunk's loads issued after their step's use: ADD / STORE
# loops 325 -> 267 instructions, SWIGLU 296 -> 269); ix2 = both (frag_dot_x_mma_order_imad.patch); seg / seg4 =
# session 27's segment-column patches (groups 32 / 64 on the tensor cores).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
m=$(nq_sanitizer_model tiny)
nq_use ix2; nq_quick_tests; nq_sanitize "ix2 " "$m" racecheck synccheck
nq_use xp2
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 tests/test_gpu_frag_gemv.py 2>&1 | tail -1 | sed 's/^/xp2 frag: /' | tee -a "$OUT/summary.txt"
nq_use seg4
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 tests/test_gpu_frag_gemv.py 2>&1 | tail -1 | sed 's/^/seg4 frag: /' | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in final imad xp2 ix2; do nq_ab "$v" 512 "$rep"; done; done
for v in final xp2 ix2; do nq_ab "$v" 8192 1; done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --group-size 64 --quiet > /dev/null 2>&1
for v in final seg seg4; do echo "g64: $(nq_ab "$v" 512 1)" >> "$OUT/summary.txt"; done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --group-size 32 --quiet > /dev/null 2>&1
for v in final seg4; do echo "g32: $(nq_ab "$v" 512 1)" >> "$OUT/summary.txt"; done
