#!/usr/bin/env bash
# Prepared in session 29 (compiled, not run; NOTES "Session 29" §6 and the next order's item 0): the dense GEMV (the
# f16 lm_head) asks for the smallest split that holds its 4 blocks an SM (lm_head_split_rule.patch: 7B 64 KB, 0.5B
# 16 KB) instead of the driver's (7B 100, 0.5B 32 KB). Before the call, here: main's sm_90a build into .v/main29 and
# main + the patch into .v/lmrule (product libraries), tarred into .out/variants.tar.xz; carry .out and .whl. Then,
# if it wins, the GPU suite on the landed commit.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main29 lmrule; do nq_ab "$v" 512 "$rep"; done; done
rm -f /tmp/q7b.nanoqwen
timeout 150 python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main29 lmrule; do nq_ab "$v" 512 "$rep" /tmp/s.nanoqwen 0.5B; done; done
