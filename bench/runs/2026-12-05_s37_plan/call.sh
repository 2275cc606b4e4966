#!/usr/bin/env bash
# Session 37's plan call (NOTES "Session 37" §2; ~350 s): frag_plan's slot-aware rule (.v/plan37 = wip/s37-plan,
# sm_90a) against main (.v/main34): the frag GEMV tests on plan37's libraries (the new shapes take the new plans),
# then the decode at 512 alternated main34 / plan37 on the sizes whose plans changed (14B, 32B, 3B, 1.5B), then the
# 7B once each (its plans are unchanged: a control).
# Here: `source bench/variants.sh && nq_build_variant plan37 0 && NQ_PACK=.out/plan37.tar.xz nq_pack_variants plan37
# main34 plan37`; carry [".whl", ".out/plan37.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_use plan37
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gpu_frag_gemv.py 2>&1 | tail -3 |
  sed 's/^/frag tests plan37: /' | tee -a "$OUT/summary.txt"
nq_stamp tests
for shape in 14B 32B 3B 1.5B; do
  nq_left 470 || break
  python3 bench/make_7b_file.py /tmp/ab.nanoqwen --shape "$shape" --quiet > /dev/null 2>&1 || continue
  for rep in 1 2; do
    for v in main34 plan37; do nq_left 520 && nq_ab "$v" 512 "$rep" /tmp/ab.nanoqwen "$shape"; done
  done
  rm -f /tmp/ab.nanoqwen
  nq_stamp "$shape"
done
if nq_left 500; then
  python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
  for v in main34 plan37; do nq_left 560 && nq_ab "$v" 512 1 /tmp/q7b.nanoqwen 7B; done
fi
nq_ab_table main34
