#!/usr/bin/env bash
# Prepared for the next session (not run): the decode GEMVs traced per block with %smid and chunk counts. Before the
# call, here: python3 bench/runs/2026-12-03_s25_prep/make_frag_trace.py csrc/src (or git apply frag_trace.patch), a
# 90a build, its libnanoqwen.so copied to .v/ftrace, `git checkout csrc/src`, and .v/ftrace packed into
# .out/variants.tar.xz (carry .out and .whl).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
NANOQWEN_LIB=$PWD/.v/ftrace/libnanoqwen.so timeout 150 python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 \
  2>&1 | tee "$OUT/trace_7b.txt" | tail -60
python3 bench/runs/2026-12-03_s25_prep/frag_trace_sm.py /tmp/frag_trace.bin 2>&1 | tee "$OUT/trace_sm.txt"
