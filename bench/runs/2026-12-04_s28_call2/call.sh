#!/usr/bin/env bash
# Session 28 call 2 (NOTES "Session 28" §2): ring = frag_ring_depth2.patch (the 4-warp STORE / ADD builds of the
# tensor-core dot keep 2 chunks a warp in flight, 3 blocks an SM at 168 registers: the 7B's q/k/v and o issue all
# their weights before the PDL wait); xperm = call 1's staged-x mma order alone (without xp2's load placement).
# final = main's csrc (sm_90a).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
m=$(nq_sanitizer_model tiny)
nq_use ring; nq_quick_tests; nq_sanitize "ring " "$m" racecheck synccheck
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 tests/test_gpu_sizes.py 2>&1 | tail -1 | sed 's/^/ring sizes: /' | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in final ring xperm; do nq_ab "$v" 512 "$rep"; done; done
for v in final ring; do nq_ab "$v" 8192 1; done
