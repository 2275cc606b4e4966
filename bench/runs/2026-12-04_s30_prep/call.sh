#!/usr/bin/env bash
# Prepared in session 30 (not run; NOTES "Session 30" §7): (a) the global merge traced from inside (mtrace = main +
# call 6's make_attn_trace.py + make_merge_trace.py + session 25's make_frag_trace.py) in the decode chain at 8K;
# (b) the short-context path (8 splits in clusters of 8, the merge in distributed shared memory) for longer contexts:
# cl512 / cl2k = main + cluster_keys_512.patch / cluster_keys_2048.patch (kAttnClusterKeysPerBlock 128 -> 512 /
# 2,048: the short graph up to 4,096 / 16,384 keys); (c) mf16 = main + merge_f16.patch (the split partials stored
# as O / l in f16, the merge weights exp2(m_s - M) l_s, 16 splits' loads a batch: half the bytes, 3 round trips at 32
# splits instead of 5). cl2k's and mf16's attention tests, racecheck, synccheck; the decode A/B of main / cl512 /
# cl2k / mf16 at 2K and 8K x2, 32K (main / mf16), 512. Before the call, here: each variant's sm_90a build into
# .v/<name> (product libraries; cl2k's and mf16's testing libraries too), tarred into .out/variants.tar.xz; carry .out
# and .whl.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
NANOQWEN_LIB=$PWD/.v/mtrace/libnanoqwen.so timeout 60 python3 bench/runs/2026-12-04_s30_call6/chain_trace.py \
  /tmp/q7b.nanoqwen 8192 2>&1 | tail -37 | tee -a "$OUT/summary.txt"
m=$(nq_sanitizer_model tiny)
for v in cl2k mf16; do
  nq_use "$v"
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention or switch" \
    tests/test_gpu_kernels.py tests/test_gpu_e2e.py 2>&1 | tail -2 | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
  nq_sanitize "$v " "$m" racecheck synccheck
done
for p in 2048 8192; do for rep in 1 2; do for v in main32 cl512 cl2k mf16; do nq_ab "$v" "$p" "$rep"; done; done; done
for v in main32 mf16; do nq_ab "$v" 32000 1; done
for v in main32 cl512 cl2k mf16; do nq_ab "$v" 512 1; done
