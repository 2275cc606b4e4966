#!/usr/bin/env bash
# Session 25 call 4: a trace of the decode attention's phases (attn_trace.patch on 8b77812's attention.cu; the
# library .v/trace, carried in .out/variants.tar.xz) at 512 and 8K-token prompts, 8 decode steps each.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for p in 512 8192; do
  NANOQWEN_LIB=$PWD/.v/trace/libnanoqwen.so timeout 150 python3 bench/runs/2026-12-03_s25_call4/trace_attn.py \
    /tmp/q7b.nanoqwen $p 2>&1 | tail -16 | tee -a "$OUT/summary.txt"
done
