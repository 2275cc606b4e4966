#!/usr/bin/env bash
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # unpack .out/*.tar.xz, wheels, PYTHONPATH, OUT
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --new-tokens 64 --repeats 2 2>&1 | grep -E '^decode'
python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 2>&1 | tee "$OUT/trace_7b.txt"
cp /tmp/frag_trace.bin "$OUT/" 2>/dev/null
