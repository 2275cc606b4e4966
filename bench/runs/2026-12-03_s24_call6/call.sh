#!/usr/bin/env bash
# Session 24 call 6: the final main's libraries (carried: nanoqwen_rt/lib, build/lib): the frag GEMV / attention /
# switch tests, racecheck on sanitize_tiny, and one 7B decode timing at 512.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # nq_quick_tests, nq_sanitize*
nq_quick_tests
nq_sanitize "" "$(nq_sanitizer_model)" racecheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
timeout 60 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens 512 --new-tokens 64 \
  --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tee -a "$OUT/summary.txt"
