#!/usr/bin/env bash
# Session 35's second prepared call (NOTES "Session 35" §2; ~450 s): the decode graphs' hand-overs through flags
# instead of PDL waits at every boundary of a layer (chainflag: q/k/v, attention (or the merge kernel), o, gate/up
# and down each publish a per-layer flag from their last block; each waits on its producer's flag), its control
# chainflag0 (the same kernels, no flag set: what the code change alone costs) and main34 (HEAD).
# 1. chainflag's e2e decode tests (tiny-py and the synthetic files against the CPU oracle) and every size's widths
#    (tests/test_gpu_sizes.py), under a timeout: a wrong count would hang. Timed only if they pass.
# 2. The decode A/B: the 7B at 512 x2 and 8K, the 0.5B and 3B at 512, alternated.
# Build here first: bash bench/runs/2026-12-05_s35_prep/build.sh (packs .out/chain.tar.xz); carry [".whl",
# ".out/chain.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
stamp() { echo "t $(date +%s) $*" >> "$OUT/summary.txt"; }
stamp start
nq_use chainflag
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "greedy or short_context or prefill_decode or sizes" \
  tests/test_gpu_e2e.py tests/test_gpu_sizes.py > "$OUT/tests_chainflag.log" 2>&1
rc=$?
echo "chainflag tests rc=$rc: $(tail -1 "$OUT/tests_chainflag.log")" | tee -a "$OUT/summary.txt"
V="main34 chainflag0"
[ $rc = 0 ] && V="main34 chainflag chainflag0"
stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in $V; do nq_ab "$v" 512 "$rep"; done; done
for v in $V; do nq_ab "$v" 8192 1; done
rm -f /tmp/q7b.nanoqwen
stamp 7B
for s in 0.5B 3B; do
  python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape $s --quiet > /dev/null 2>&1
  for v in $V; do nq_ab "$v" 512 1 /tmp/s.nanoqwen $s; done
  rm -f /tmp/s.nanoqwen
done
stamp end
python3 bench/ab_table.py "$OUT/summary.txt" --base main34 > "$OUT/ab_table.md" 2>&1; cat "$OUT/ab_table.md"
