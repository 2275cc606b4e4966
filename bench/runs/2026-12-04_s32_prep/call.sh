#!/usr/bin/env bash
# Session 32, prepared for the next session (NOTES "Session 32" §5; not run): why a cluster launch of the decode
# attention costs ~2.5 µs a 7B layer at 8K (§2). hlow = the product with the hierarchical bound at 128 x 128 (the 7B's
# long graph in clusters from 4,096 keys); hl128 = hlow with the 8-warp cluster build at 128 registers (one block fits
# beside two q/k/v blocks); hl2 = hlow in clusters of 2 (2 free SMs of a GPC at once). hl128's attention / switch /
# long-context tests, racecheck / synccheck on the hierarchical kernel cases; decode A/B prod / hlow / hl128 / hl2 at
# 8K x2 and 32K, prod / hlow / hl128 at 16,384, prod / hl128 at 512 x2; then the chain trace at 8K of prod (the plain
# launch) and hlow (clusters): when the attention blocks enter and their PDL wait resolves against q/k/v's end. First
# csrc/dev/cluster_entry, the same question without the product. Build first (build.sh), carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
# csrc/dev/cluster_entry (built here, carried in .out/dev.tar.xz): the entry of plain and clustered dependents under
# PDL behind a predecessor that fills the SMs, alone (seconds)
timeout 60 build/dev/cluster_entry 2>&1 | tee -a "$OUT/summary.txt"
nq_use hl128
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 \
  -k "attn or attention or switch or short_context or long_context" tests/test_gpu_kernels.py tests/test_gpu_e2e.py \
  2>&1 | tail -2 | sed "s/^/hl128 /" | tee -a "$OUT/summary.txt"
nq_sanitize_tests hl128 "test_attention_vs_numpy and (8200 or 17500 or 33000)" racecheck synccheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in prod hlow hl128 hl2; do nq_ab "$v" 8192 "$rep"; done; done
for v in prod hlow hl128; do nq_ab "$v" 16384 1; done
for v in prod hlow hl128 hl2; do nq_ab "$v" 32000 1; done
for rep in 1 2; do for v in prod hl128; do nq_ab "$v" 512 "$rep"; done; done
for v in trprod trhlow; do
  echo "chain trace $v 8192" | tee -a "$OUT/summary.txt"
  NANOQWEN_LIB=$PWD/.v/$v/libnanoqwen.so timeout 100 python3 bench/runs/2026-12-04_s30_call6/chain_trace.py \
    /tmp/q7b.nanoqwen 8192 2>&1 | tail -32 | tee -a "$OUT/summary.txt"
done
