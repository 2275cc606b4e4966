#!/usr/bin/env bash
# Session 26 call 4: the decode attention's last-block merge (the global path, beyond the cluster contexts) with the
# first 16 splits' partials of each thread's output loaded before the split weights (.v/mpre) against .v/dpush
# (= 52eeaaf): attention / frag / switch tests and racecheck / synccheck with mpre, attn_bench both, decode A/B at
# 8K x2, 32000, 2K and 512.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use mpre
nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "mpre " "$m" racecheck synccheck
for v in dpush mpre; do nq_attn_bench "$v" 60; done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in dpush mpre; do nq_ab "$v" 8192 "$rep"; done; done
for p in 32000 2048 512; do for v in dpush mpre; do nq_ab "$v" "$p" 1; done; done
