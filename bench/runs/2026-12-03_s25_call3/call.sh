#!/usr/bin/env bash
# Session 25 call 3: decode on every size's shapes with 8b77812's library (the attention merges; 512-token prompt,
# 64 tokens x 2), then gpu_check's hf7b step (the 7B-shaped model against transformers), which call 2 left out.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
for size in 0.5B 1.5B 3B 14B 32B; do
  timeout 150 python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape $size --quiet > /dev/null 2>&1 || { echo "$size: make failed" | tee -a "$OUT/summary.txt"; continue; }
  r=$(timeout 150 python3 -m nanoqwen_bench /tmp/s.nanoqwen --device cuda --no-peers \
      --prompt-tokens 512 --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU|read-only)' | tr -s ' ' | tr '\n' ';')
  echo "size $size (8b77812): $r" | tee -a "$OUT/summary.txt"
  rm -f /tmp/s.nanoqwen
done
NANOQWEN_COMMIT=8b77812 OUT="$OUT/hf7b" bash bench/gpu_check.sh hf7b | tail -3
