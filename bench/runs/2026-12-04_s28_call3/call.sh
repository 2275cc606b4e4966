#!/usr/bin/env bash
# Session 28 call 3 (NOTES "Session 28" §3): which GEMV lost call 2's ring, and whether the first chunk's issue
# before the PDL wait pays at all. ringo = the 2-chunk ring for the ADD builds only (the 7B's o, after attention);
# ringq = the STORE builds only (q/k/v, after down); nopre = main with every GEMV's first chunk issued after the PDL
# wait (a diagnostic). final = main's csrc (sm_90a).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in final ringo ringq nopre; do nq_ab "$v" 512 "$rep"; done; done
for v in final ringo ringq nopre; do nq_ab "$v" 8192 1; done
for v in final ringo; do nq_ab "$v" 32000 1; done
