#!/usr/bin/env bash
# Session 34 call 1 (NOTES "Session 34" §1): what the chain's dependencies and the decode attention cost the product.
# Variants (bench/runs/2026-12-04_s34_prep/build.sh, sm_90a): main34 = HEAD; nowait = no PDL wait in the decode
# GEMVs, attention and merge (timing only); attnwait = the decode attention and merge launches only hand over; b256 =
# the short-context cluster bound at 2,048 keys. Decode A/B, alternated: 7B at 512 and 8K, 0.5B at 512, and b256
# against main34 between 2,048 and 3,072 keys. Carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
stamp() { echo "t $(date +%s) $*" >> "$OUT/summary.txt"; }
stamp start
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
stamp made7b
for rep in 1 2; do for v in main34 nowait attnwait; do nq_ab "$v" 512 "$rep"; done; done
stamp 512
for rep in 1 2; do for v in main34 nowait attnwait; do nq_ab "$v" 8192 "$rep"; done; done
stamp 8k
for rep in 1 2; do for p in 2400 2900; do for v in main34 b256; do nq_ab "$v" "$p" "$rep"; done; done; done
stamp bound
python3 bench/make_7b_file.py /tmp/s05.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for v in main34 nowait attnwait; do nq_ab "$v" 512 1 /tmp/s05.nanoqwen 0.5B; done
stamp end
