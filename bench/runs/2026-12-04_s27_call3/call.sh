#!/usr/bin/env bash
# Session 27 call 3: the decode GEMV's warp dot on the tensor cores. mma (frag_dot_mma.patch): each lane's word w is
# the mma.m16n8k16 A fragment of rows 16 w .. 16 w + 15 (exact codes), x the B operand in all 8 columns, f32
# accumulation over a scale segment, then times the scales: 409 instructions a chunk against 620. mma2
# (frag_dot_mma_offsets.patch): the codes' offsets folded into one more mma a step (weights unpacked by LOP3 alone,
# the staged x's high pairs / 16): 296 a chunk. Frag GEMV / attention / switch tests with each, then the 7B decode
# A/B at 512 (x2) and 8K.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
for v in mma2 mma; do nq_use "$v"; echo "tests $v:" >> "$OUT/summary.txt"; nq_quick_tests; done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in base mma mma2; do nq_ab "$v" 512 "$rep"; done; done
for v in base mma mma2; do nq_ab "$v" 8192 1; done
