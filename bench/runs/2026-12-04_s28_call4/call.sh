#!/usr/bin/env bash
# Session 28 call 4 (NOTES "Session 28" §4): ringosw = the 2-chunk ring for the ADD builds (o) and the SWIGLU builds
# (gate/up, 4 blocks an SM at 128 registers: 72 bytes of stack, spills in the loop; 528 slots for 592 tiles);
# ringo = the ADD builds only (call 3). final = main's csrc (sm_90a). ringosw's frag GEMV tests first.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use ringosw
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 tests/test_gpu_frag_gemv.py 2>&1 | tail -1 | sed 's/^/ringosw frag: /' | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in final ringo ringosw; do nq_ab "$v" 512 "$rep"; done; done
for v in final ringo ringosw; do nq_ab "$v" 8192 1; done
