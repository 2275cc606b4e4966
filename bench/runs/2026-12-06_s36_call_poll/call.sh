#!/usr/bin/env bash
# Session 36's second device call (~250 s; NOTES "Session 36" §5): why handover lost in call 1a. handover_spin (the
# poll without __nanosleep) and handover_relax (ld.relaxed polls without sleep, one ld.acquire at the end) against
# handover and main34: handover_relax's greedy and count tests first (it changes the wait's memory ordering), then
# the 7B at 512 x2 and the 0.5B at 512.
# Build here first: bash bench/runs/2026-12-06_s36_prep/build_poll.sh; carry [".whl", ".out/call_poll.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_use handover_relax
git apply --include='tests/*' "$(dirname "$0")/../2026-12-05_s35_call1/handover_tests.patch"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "greedy or short_context or hand_over" \
  tests/test_gpu_e2e.py > "$OUT/tests_relax.log" 2>&1
echo "handover_relax tests rc=$?: $(tail -1 "$OUT/tests_relax.log")" | tee -a "$OUT/summary.txt"
nq_stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main34 handover handover_spin handover_relax; do nq_ab "$v" 512 "$rep"; done; done
nq_stamp 512
python3 bench/make_7b_file.py /tmp/s05.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for v in main34 handover handover_spin handover_relax; do nq_left 520 && nq_ab "$v" 512 1 /tmp/s05.nanoqwen 0.5B; done
rm -f /tmp/q7b.nanoqwen /tmp/s05.nanoqwen
nq_stamp end
python3 bench/ab_table.py "$OUT/summary.txt" --base main34 > "$OUT/ab_table.md" 2>&1; cat "$OUT/ab_table.md"
