#!/usr/bin/env bash
# Session 25 call 3: decode on every size's shapes with 8b77812's library (the attention merges; 512-token prompt,
# 64 tokens x 2), then gpu_check's hf7b step (the 7B-shaped model against transformers), which call 2 left out.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_sizes 8b77812
NANOQWEN_COMMIT=8b77812 OUT="$OUT/hf7b" bash bench/gpu_check.sh hf7b | tail -3
