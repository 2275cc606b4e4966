#!/usr/bin/env bash
# Session 30 call 4 (NOTES "Session 30" §3-4): ao1 = main31 (d9bb5a3) + the 8-warp attention at 128 registers
# (attn128) + the o GEMV's register ring at depth 1 (FragDepth 1: 128 registers), so that two o blocks (2 x 16 K
# registers) fit beside an attention block (32 K) and all 224 of the 7B's o blocks issue their first chunks while
# attention runs at 8K / 32K (today 132 of them: one beside each attention block). ao1's attention / switch / frag
# tests, racecheck, synccheck; the decode A/B against main31 at 512 x2, 8K x2, 32K x2.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use ao1; nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "ao1 " "$m" racecheck synccheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for p in 512 8192 32000; do for rep in 1 2; do for v in main31 ao1; do nq_ab "$v" "$p" "$rep"; done; done; done
