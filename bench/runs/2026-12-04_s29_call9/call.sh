#!/usr/bin/env bash
# Session 29 call 9 (NOTES "Session 29" §6): the dense lm_head GEMV at a smaller split than the driver's (7B: 100 KB),
# i.e. more L1: lm64 (64 KB: lm_head_split64.patch), lm32 (the same at 14 %: 32 KB), against s164 (cbc9f58).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in s164 lm64 lm32; do nq_ab "$v" 512 "$rep"; done; done
