#!/usr/bin/env bash
# Session 30 call 7 (NOTES "Session 30" §6): mfs = main31 (d9bb5a3) + merge_staged.patch (the last split block's
# merge with every split's partial staged in shared memory by cp.async: one L2 round trip instead of five). Its
# attention tests (decode, batched, few-token split, e2e switch), racecheck and synccheck; the decode A/B against
# main31 at 8K x2, 32K, 512; the chain trace (mfstr = mfs + the traces) at 8K.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use mfs
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention or switch" \
  tests/test_gpu_kernels.py tests/test_gpu_e2e.py 2>&1 | tail -2 | tee -a "$OUT/summary.txt"
m=$(nq_sanitizer_model tiny); nq_sanitize "mfs " "$m" racecheck synccheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main31 mfs; do nq_ab "$v" 8192 "$rep"; done; done
for v in main31 mfs; do nq_ab "$v" 32000 1; done
for v in main31 mfs; do nq_ab "$v" 512 1; done
NANOQWEN_LIB=$PWD/.v/mfstr/libnanoqwen.so timeout 60 python3 bench/runs/2026-12-04_s30_call6/chain_trace.py \
  /tmp/q7b.nanoqwen 8192 2>&1 | tail -27 | tee -a "$OUT/summary.txt"
