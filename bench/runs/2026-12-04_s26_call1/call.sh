#!/usr/bin/env bash
# Session 26 call 1: (a) the decode GEMVs traced per block (session 25 §8's prepared trace: .v/ftrace = main +
# make_frag_trace.py); (b) session 25 §6's direct-push cluster merge (.v/dpush) against main (.v/main26 = cf1d705,
# decode SASS = 867508d): tests, racecheck / synccheck, attn_bench, decode A/B at 512 and 8K; (c) main's decode
# with peers (never measured for 867508d's attention).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
NANOQWEN_LIB=$PWD/.v/ftrace/libnanoqwen.so timeout 150 python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 \
  > "$OUT/trace_7b.txt" 2>&1; echo "trace rc=$?" | tee -a "$OUT/summary.txt"
python3 bench/runs/2026-12-03_s25_prep/frag_trace_sm.py /tmp/frag_trace.bin > "$OUT/trace_sm.txt" 2>&1
nq_attn_variant_call main26 dpush
NANOQWEN_LIB=$PWD/.v/main26/libnanoqwen.so timeout 150 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda \
  --prompt-tokens 512 --new-tokens 128 > "$OUT/peers_main26.txt" 2>&1; echo "peers rc=$?" | tee -a "$OUT/summary.txt"
