#!/usr/bin/env bash
# Session 36's first device call (~300 s): call 1's decisive rows only (bench/runs/2026-12-05_s35_call1/), after the
# machine was twice refused and once taken back mid-call this session: handover's tests (the e2e decode tests, the
# count test, every size's widths), then the decode A/B of main34, handover and handover0 (7B at 512 x2, 0.5B at
# 512, 7B at 8K, 3B at 512). The L2 side branch (l2a-l2c), graph_fork_pdl and handover_last stay in call 1.
# Carry [".whl", ".out/call1.tar.xz"] (bash bench/runs/2026-12-05_s35_prep/build.sh packs it).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_count_tests handover "greedy or short_context or prefill_decode or sizes or hand_over" tests/test_gpu_e2e.py \
  tests/test_gpu_sizes.py
rc=$?
grep -E "FAILED|Error|error" "$OUT/tests_handover.log" | head -5 | tee -a "$OUT/summary.txt"
C="handover0"
[ $rc = 0 ] && C="handover handover0"
nq_stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main34 $C; do nq_ab "$v" 512 "$rep"; done; done
nq_stamp 512
nq_ab_shape 0.5B 420 main34 $C
for v in main34 $C; do nq_left 480 && nq_ab "$v" 8192 1; done
rm -f /tmp/q7b.nanoqwen
nq_stamp 8192
nq_ab_shape 3B 540 main34 $C
nq_stamp end
nq_ab_table main34
