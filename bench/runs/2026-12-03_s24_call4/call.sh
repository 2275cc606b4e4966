#!/usr/bin/env bash
# Session 24 call 4: (1) noexit = main 8317893 without the GEMV's exit cluster barrier (the pushes are st.async now;
# every block is an owner that waits for its 256 bytes) against main at 512, alternated, and racecheck / synccheck
# with noexit; (2) decode on every size's shapes with main's library (512-token prompt, 64 tokens x 2).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # nq_ab, nq_quick_tests, nq_sanitize*: factored out after the run, same commands
mkdir -p nanoqwen_rt/lib build/lib; cp .v/noexit/libnanoqwen.so nanoqwen_rt/lib/; cp .v/noexit/libnanoqwen_testing.so build/lib/
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in head noexit; do
  nq_ab $v 512 $rep; done; done
nq_sanitize "noexit " "$(nq_sanitizer_model)" racecheck synccheck
rm -f /tmp/q7b.nanoqwen
for size in 0.5B 1.5B 3B 14B 32B; do
  timeout 150 python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape $size --quiet > /dev/null 2>&1 || { echo "$size: make failed" | tee -a "$OUT/summary.txt"; continue; }
  r=$(NANOQWEN_LIB=$PWD/.v/head/libnanoqwen.so timeout 150 python3 -m nanoqwen_bench /tmp/s.nanoqwen --device cuda --no-peers \
      --prompt-tokens 512 --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU|read-only)' | tr -s ' ' | tr '\n' ';')
  echo "size $size (main 8317893): $r" | tee -a "$OUT/summary.txt"
  rm -f /tmp/s.nanoqwen
done
