#!/usr/bin/env bash
# Session 36's first device call (~300 s): call 1's decisive rows only (bench/runs/2026-12-05_s35_call1/), after the
# machine was twice refused and once taken back mid-call this session: handover's tests (the e2e decode tests, the
# count test, every size's widths), then the decode A/B of main34, handover and handover0 (7B at 512 x2, 0.5B at
# 512, 7B at 8K, 3B at 512). The L2 side branch (l2a-l2c), graph_fork_pdl and handover_last stay in call 1.
# Carry [".whl", ".out/call1.tar.xz"] (bash bench/runs/2026-12-05_s35_prep/build.sh packs it).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_use handover
git apply --include='tests/*' "$(dirname "$0")/../2026-12-05_s35_call1/handover_tests.patch" && echo "the branch's count test applied" \
  | tee -a "$OUT/summary.txt"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
  -k "greedy or short_context or prefill_decode or sizes or hand_over" \
  tests/test_gpu_e2e.py tests/test_gpu_sizes.py > "$OUT/tests_handover.log" 2>&1
rc=$?
echo "handover tests rc=$rc: $(tail -1 "$OUT/tests_handover.log")" | tee -a "$OUT/summary.txt"
grep -E "FAILED|Error|error" "$OUT/tests_handover.log" | head -5 | tee -a "$OUT/summary.txt"
C="handover0"
[ $rc = 0 ] && C="handover handover0"
nq_stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main34 $C; do nq_ab "$v" 512 "$rep"; done; done
nq_stamp 512
python3 bench/make_7b_file.py /tmp/s05.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for v in main34 $C; do nq_left 420 && nq_ab "$v" 512 1 /tmp/s05.nanoqwen 0.5B; done
rm -f /tmp/s05.nanoqwen
for v in main34 $C; do nq_left 480 && nq_ab "$v" 8192 1; done
rm -f /tmp/q7b.nanoqwen
nq_stamp 8192
nq_left 480 && python3 bench/make_7b_file.py /tmp/s3.nanoqwen --shape 3B --quiet > /dev/null 2>&1 &&
  for v in main34 $C; do nq_left 540 && nq_ab "$v" 512 1 /tmp/s3.nanoqwen 3B; done
rm -f /tmp/s3.nanoqwen
nq_stamp end
python3 bench/ab_table.py "$OUT/summary.txt" --base main34 > "$OUT/ab_table.md" 2>&1; cat "$OUT/ab_table.md"
