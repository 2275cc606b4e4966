#!/usr/bin/env bash
# Session 33 call 2 (NOTES "Session 33" §2): the merge kernel (mk) against the last-block merge (prod, 4c0c86f's
# kernels). mk's attention / switch / long-context / batch tests, racecheck / synccheck / memcheck on the kernel
# tests' long cases; decode A/B 7B prod / mk / mknh at 8K x2 and 32K, prod / mk at 16,384 and 512 x2, prod / mk / mkcl
# at 2,048; 0.5B prod / mk at 8K. Build first (build.sh), carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use mk
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
  -k "attn or attention or switch or short_context or long_context or batch" tests/test_gpu_kernels.py \
  tests/test_gpu_e2e.py tests/test_gpu_batch.py > "$OUT/tests_mk.log" 2>&1
tail -3 "$OUT/tests_mk.log" | sed "s/^/mk /" | tee -a "$OUT/summary.txt"
nq_sanitize_tests mk "(test_attention_vs_numpy and (8200 or 17500)) or test_attention_prefill_split" racecheck synccheck memcheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in prod mk mknh; do nq_ab "$v" 8192 "$rep"; done; done
for v in prod mk mknh; do nq_ab "$v" 32000 1; done
for v in prod mk mkcl; do nq_ab "$v" 2048 1; done
for v in prod mk; do nq_ab "$v" 16384 1; done
for rep in 1 2; do for v in prod mk; do nq_ab "$v" 512 "$rep"; done; done
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for v in prod mk; do nq_ab "$v" 8192 1 /tmp/s.nanoqwen 0.5B; done
