#!/usr/bin/env bash
# Session 29 call 3 (NOTES "Session 29" §3): c72 (every kernel prefers 72 % of 228 KB: the 164 KB split that
# gate/up and attention get anyway) again, slotq72 (session 28's slotq with that carveout instead of the maximum,
# which left L1 28 KB), and c72 on the 0.5B and 14B shapes (14B's gate/up needs more than 164 KB at 5 blocks).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main28 c72 slotq72; do nq_ab "$v" 512 "$rep"; done; done
for v in main28 c72 slotq72; do nq_ab "$v" 8192 1; done
rm -f /tmp/q7b.nanoqwen
for size in 0.5B 14B; do
  timeout 150 python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape $size --quiet > /dev/null 2>&1 || { echo "$size: make failed" | tee -a "$OUT/summary.txt"; continue; }
  for v in main28 c72 main28 c72; do
    r=$(NANOQWEN_LIB="$PWD/.v/$v/libnanoqwen.so" timeout 150 python3 -m nanoqwen_bench /tmp/s.nanoqwen --device cuda --no-peers \
        --prompt-tokens 512 --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tr -s ' ' | tr '\n' ';')
    echo "size $size $v: $r" | tee -a "$OUT/summary.txt"
  done
  rm -f /tmp/s.nanoqwen
done
