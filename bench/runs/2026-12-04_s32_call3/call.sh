#!/usr/bin/env bash
# Session 32 call 3 (NOTES "Session 32" §3): the hierarchical merge in product form (cand = this tree: a session's
# third pair of decode graphs, from attn_hier_keys = n_split x 512 x 128 / D keys, runs the attention in clusters
# merging hierarchically) before the GPU suite: the attention / switch tests and the new long-context e2e test with
# cand's testing library; decode A/B main / cand on the 14B's shapes (8 KV heads, 16 splits: the bound at 8,192
# keys, unmeasured so far) after 8,192 x2, 12,000 and 16,384 tokens, and on the 7B after 16,384 and 32,000.
# Carry [".whl", ".out"]: .out/variants.tar.xz holds .v/main (fad5b6b, sm_90a) and .v/cand (this tree, both archs,
# product and testing libraries).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use cand
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention or switch or short_context or long_context" \
  tests/test_gpu_kernels.py tests/test_gpu_e2e.py 2>&1 | tail -2 | sed "s/^/cand /" | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 14B --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main cand; do nq_ab "$v" 8192 "$rep" /tmp/s.nanoqwen 14B; done; done
for p in 12000 16384; do for v in main cand; do nq_ab "$v" "$p" 1 /tmp/s.nanoqwen 14B; done; done
rm -f /tmp/s.nanoqwen
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for p in 16384 32000; do for v in main cand; do nq_ab "$v" "$p" 1; done; done
