#!/usr/bin/env bash
# Session 33 call 5 (NOTES "Session 33" §5): the merge kernel at 256 threads (mk256: one L2 round trip of partials at
# the 7B's 33 splits) against 128 (mknh = 3de48ba's kernels). mk256's attention / switch / batch tests, then the decode
# A/B at 8K x2, 32K and 512. Build: nq_build_variant mk256 0 on the branch's HEAD, nq_pack_variants mk256 mk256 mknh;
# carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use mk256
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "attn or attention or switch or batch" \
  tests/test_gpu_kernels.py tests/test_gpu_e2e.py tests/test_gpu_batch.py > "$OUT/tests_mk256.log" 2>&1
tail -2 "$OUT/tests_mk256.log" | sed "s/^/mk256 /" | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in mknh mk256; do nq_ab "$v" 8192 "$rep"; done; done
for v in mknh mk256; do nq_ab "$v" 32000 1; done
for v in mknh mk256; do nq_ab "$v" 512 1; done
