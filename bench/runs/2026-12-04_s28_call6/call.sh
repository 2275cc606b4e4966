#!/usr/bin/env bash
# Session 28 call 6: every size's decode on 8abbf12's product library (random files, INT4 g128, f16 lm_head; 512-token
# prompt, 64 tokens x 2), as session 27 call 5 measured 4194cb4's.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_sizes 8abbf12
