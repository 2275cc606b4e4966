#!/usr/bin/env bash
# Session 27 call 1: the 7B decode A/B at 512 (x2, alternated) of main (base) against session 26's prepared patches
# (push4: vector split pushes; w8: 8-warp q/k/v and o) and the L2-ahead experiment (pf0: the mechanism, nothing
# warmed; pf1: o warms gate/up's chunks 1-2 of each warp; pf2: + gate/up warms down's chunk 1 of each warp, down the
# next q/k/v; pf3: + q/k/v warms o); then pf3's frag GEMV / attention / switch tests, and 8K for the A/B's leaders.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in base push4 w8 pf0 pf1 pf2 pf3; do nq_ab "$v" 512 "$rep"; done; done
nq_use pf3; nq_quick_tests
for v in base pf1 pf2 pf3; do nq_ab "$v" 8192 1; done
