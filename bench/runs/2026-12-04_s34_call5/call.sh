#!/usr/bin/env bash
# Session 34's prepared calls 2 and 4 in one, with §6's flagwait (NOTES "Session 34" §2-3, §6; ~500 s):
# csrc/dev/graph_fork_pdl (does the fork keep the PDL edges?); the e2e decode tests of l2a (its graphs with the side
# branch) and fw (counters instead of two PDL waits) against the CPU oracle; the 7B decode A/B at 512 x2 and 8K of
# main34, nowait, the one-boundary nw_* variants (512 only), the L2 prefetch variants l2a-l2d, fw and its control
# fw0, alternated;
# the 0.5B bound check of b256.
# Build here first: bash bench/runs/2026-12-04_s34_prep/build5.sh; carry [".whl", ".out/variants.tar.xz"] (~64.5 MB with the
# tree: under 64 MiB; naming the file keeps other packs in .out out of the carry).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_graph_fork_pdl   # does l2side's fork keep the q/k/v -> attention PDL edge (NOTES "Session 34" §3)?
V="main34 l2a l2b l2c l2d"   # the prefetch cannot change a result nor hang: timed whatever its tests say
for v in l2a fw; do   # fw is timed only if its tests pass (a miscounted wait would hang; nq_decode's timeout is 120 s)
  mkdir -p nanoqwen_rt/lib && cp ".v/$v/libnanoqwen.so" nanoqwen_rt/lib/   # the e2e tests load the product library
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
    -k "greedy or short_context or prefill_decode" tests/test_gpu_e2e.py > "$OUT/tests_$v.log" 2>&1
  rc=$?
  echo "$v tests rc=$rc: $(tail -1 "$OUT/tests_$v.log")" | tee -a "$OUT/summary.txt"
  [ $v = fw ] && [ $rc = 0 ] && V="$V fw"
done
V="$V fw0"   # fw's kernels with no counter set: what the code change alone costs
V8="$V nowait"   # 8K: the prefetch and counter variants against main34 and nowait
V="$V nw_qkv nw_attn nw_o nw_gu nw_dn nowait"
nq_stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in $V; do nq_ab "$v" 512 "$rep"; done; done
nq_stamp 512
for v in $V8; do nq_ab "$v" 8192 1; done
nq_stamp 8192
python3 bench/make_7b_file.py /tmp/s05.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for p in 4500 5500; do for v in main34 b256; do nq_ab "$v" "$p" 1 /tmp/s05.nanoqwen 0.5B; done; done
nq_stamp end
python3 bench/ab_table.py "$OUT/summary.txt" --base main34 > "$OUT/ab_table.md" 2>&1; cat "$OUT/ab_table.md"
