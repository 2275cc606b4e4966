#!/usr/bin/env bash
# Session 34's call 5 (bench/runs/2026-12-04_s34_call5/call.sh), trimmed to ~350 s for session 38: fw / fw0 (the
# counts lost in session 36 §5-6) and the 0.5B b256 check are dropped. What is left: graph_fork_pdl (does the side
# branch's fork keep the PDL edges?), l2a's e2e decode tests, then the 7B at 512 x2 for main34, the L2 prefetch
# variants l2a-l2d, the one-boundary no-wait variants nw_* and nowait, alternated; 8K once for main34, l2a-l2c and
# nowait. Variants: .out/variants.tar.xz (bench/runs/2026-12-04_s34_prep/build5.sh, fe171a3 + patches, sm_90a);
# carry [".whl", ".out/variants.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
nq_graph_fork_pdl
mkdir -p nanoqwen_rt/lib && cp .v/l2a/libnanoqwen.so nanoqwen_rt/lib/   # the e2e tests load the product library
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
  -k "greedy or short_context or prefill_decode" tests/test_gpu_e2e.py > "$OUT/tests_l2a.log" 2>&1
echo "l2a tests rc=$?: $(tail -1 "$OUT/tests_l2a.log")" | tee -a "$OUT/summary.txt"
nq_stamp tests
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main34 l2a l2b l2c l2d nw_qkv nw_attn nw_o nw_gu nw_dn nowait; do nq_ab "$v" 512 "$rep"; done; done
nq_stamp 512
for v in main34 l2a l2b l2c nowait; do nq_left 520 && nq_ab "$v" 8192 1; done
nq_stamp 8192
nq_ab_table main34
