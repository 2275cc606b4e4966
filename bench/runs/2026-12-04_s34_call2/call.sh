#!/usr/bin/env bash
# Session 34 call 2 (NOTES "Session 34" §2): which boundary holds call 1's 13 % (nowait against main34): decode with
# one kind of launch not waiting (bench/runs/2026-12-04_s34_prep/build2.sh), 7B at 512 and 8K, alternated; and the
# 0.5B (D 64) with the short-context bound at 256 x 128 key-dims (b256) against main34 between 4,096 and 6,144 keys.
# Carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
stamp() { echo "t $(date +%s) $*" >> "$OUT/summary.txt"; }
stamp start
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main34 nw_qkv nw_attn nw_o nw_gu nw_dn nowait; do nq_ab "$v" 512 "$rep"; done; done
stamp 512
for v in main34 nw_qkv nw_attn nw_o nw_gu nw_dn nowait; do nq_ab "$v" 8192 1; done
stamp 8192
python3 bench/make_7b_file.py /tmp/s05.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for p in 4500 5500; do for v in main34 b256; do nq_ab "$v" "$p" 1 /tmp/s05.nanoqwen 0.5B; done; done
stamp end
