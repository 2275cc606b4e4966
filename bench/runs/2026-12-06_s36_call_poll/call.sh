#!/usr/bin/env bash
# Session 36's second device call (~250 s; NOTES "Session 36" §5): why handover lost in call 1a. handover_spin (the
# poll without __nanosleep) and handover_relax (ld.relaxed polls without sleep, one ld.acquire at the end) against
# handover and main34: handover_relax's greedy and count tests first (it changes the wait's memory ordering), then
# the 7B at 512 x2 and the 0.5B at 512.
# Build here first: bash bench/runs/2026-12-06_s36_prep/build_poll.sh; carry [".whl", ".out/call_poll.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_count_tests handover_relax "greedy or short_context or hand_over" tests/test_gpu_e2e.py
nq_stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main34 handover handover_spin handover_relax; do nq_ab "$v" 512 "$rep"; done; done
nq_stamp 512
rm -f /tmp/q7b.nanoqwen
nq_ab_shape 0.5B 520 main34 handover handover_spin handover_relax
nq_stamp end
nq_ab_table main34
