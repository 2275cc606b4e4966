#!/usr/bin/env bash
# Session 36's call 1b (NOTES "Session 36" §4; ~300 s): the sixth hand-over through a count, run only after call 1
# (bench/runs/2026-12-05_s35_call1/) has handover passing its tests and winning (on main's tree, landed or not).
# handover6 = branch wip/s36-handover6 (6b827fe: wip/s35-handover + the merge kernel waiting on the decode
# attention's splits count instead of the decode grid's end; a sixth slot a layer, published every step). Its e2e
# decode tests and the count test (call 1's handover_tests.patch where the tree lacks it: it reads every slot,
# whatever their number), then the decode A/B against handover (d432b91) where the merge kernel runs: the 7B at 8K
# x2 and 32K, and at 512 (no merge kernel there: a tie expected) once.
# Build here first: bash bench/runs/2026-12-06_s36_prep/build.sh (packs .out/call1b.tar.xz); carry [".whl",
# ".out/call1b.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
# the plain graphs' merge kernel runs in short_context (across the bound) and the count test
nq_count_tests handover6 "greedy or short_context or prefill_decode or in_chunks or hand_over" tests/test_gpu_e2e.py
rc=$?
nq_stamp tests
[ $rc = 0 ] || exit 0
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in handover handover6; do nq_left 420 && nq_ab "$v" 8192 "$rep"; done; done
for v in handover handover6; do nq_left 500 && nq_ab "$v" 32000 1; done
for v in handover handover6; do nq_left 540 && nq_ab "$v" 512 1; done
rm -f /tmp/q7b.nanoqwen
nq_stamp end
nq_ab_table handover
