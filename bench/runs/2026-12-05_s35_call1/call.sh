#!/usr/bin/env bash
# Session 35's first prepared call (NOTES "Session 35" §2-4; ~500-600 s): the two candidate fixes for the decode's
# hand-overs (session 34 §1: the kernels alone stream at ~80 % of the read ceiling; the PDL hand-overs cost ~6.8 µs a
# 7B layer), each with its control, against main34 (HEAD's kernels):
# * handover: every hand-over of a layer through per-layer counts instead of PDL waits (NOTES §2-4; the libraries of
#   branch wip/s35-handover, with its count test applied from handover_tests.patch); handover0: the same kernels with
#   no link set (the code change alone); handover_last: the first form (flags set by each grid's last block: one
#   more L2 round trip a hand-over);
# * l2a / l2b / l2c: a side branch of the decode graphs bulk-prefetching gate/up's first chunks into L2 while the
#   q/k/v -> attention -> o chain leaves HBM idle (session 34 §3: after q/k/v, chunks 1-2; before q/k/v; after q/k/v,
#   chunks 1-3), with csrc/dev/graph_fork_pdl first (does the fork keep the PDL edges?).
# 1. handover's e2e decode tests, its count test and every size's widths (tests/test_gpu_sizes.py) under a timeout (a
#    wrong count would hang; handover is timed only if they pass); handover_last's greedy tests (timed only if they
#    pass too); l2a's e2e decode tests (the prefetch cannot change a result: timed anyway).
# 2. The decode A/B, alternated: the 7B at 512 x2; then while time is left the 0.5B at 512, the 7B at 8K, the 3B at
#    512 (the 0.5B and 3B: main34, handover, handover0).
# Session 34's call 5 (the one-boundary nowait variants, fw / fw0, l2d, b256's 0.5B check) is not in it: handover
# supersedes fw, and the nw_* rows only locate the cost.
# Build here first: bash bench/runs/2026-12-05_s35_prep/build.sh (packs .out/call1.tar.xz, ~20 MB); carry [".whl",
# ".out/call1.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_graph_fork_pdl   # does l2side's fork keep the q/k/v -> attention PDL edge (NOTES "Session 34" §3)?
nq_count_tests handover "greedy or short_context or prefill_decode or sizes or hand_over" tests/test_gpu_e2e.py \
  tests/test_gpu_sizes.py
rc=$?
cp .v/handover_last/libnanoqwen.so nanoqwen_rt/lib/   # the first form: timed only if its greedy tests pass
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "greedy or short_context" tests/test_gpu_e2e.py \
  > "$OUT/tests_handover_last.log" 2>&1
rc_last=$?
echo "handover_last tests rc=$rc_last: $(tail -1 "$OUT/tests_handover_last.log")" | tee -a "$OUT/summary.txt"
cp .v/l2a/libnanoqwen.so nanoqwen_rt/lib/
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "greedy or short_context or prefill_decode" \
  tests/test_gpu_e2e.py > "$OUT/tests_l2a.log" 2>&1
echo "l2a tests rc=$?: $(tail -1 "$OUT/tests_l2a.log")" | tee -a "$OUT/summary.txt"
C="handover0"
[ $rc = 0 ] && C="handover handover0"
V="main34 $C l2a l2b l2c"
V512="$V"
[ $rc = 0 ] && [ $rc_last = 0 ] && V512="$V handover_last"   # the last-block form: 512 only
nq_stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in $V512; do nq_ab "$v" 512 "$rep"; done; done
nq_stamp 512
# then, as long as time is left (the device's limit is 600 s): the 0.5B (where the hand-overs are most of a layer),
# the 7B at 8K, the 3B
nq_ab_shape 0.5B 470 main34 $C
for v in $V; do nq_left 520 && nq_ab "$v" 8192 1; done
rm -f /tmp/q7b.nanoqwen
nq_stamp 8192
nq_ab_shape 3B 560 main34 $C
nq_stamp end
nq_ab_table main34
