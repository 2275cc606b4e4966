#!/usr/bin/env bash
# Prepared in session 27 (compiled, not run): every group on the tensor cores, one scale segment a B column
# (NOTES "Session 27" §6). seg = frag_dot_mma_segment_columns.patch (the g64 SWIGLU build still spills 32 bytes, in
# its loop); seg4 = frag_dot_mma_segment_columns_swiglu4.patch (the same, and the g64 SWIGLU build at 4 blocks an SM,
# 128 registers: no build spills; the 7B's 592 gate/up tiles then take two waves at g64, as they do at g32 today).
# Before the call, here: main's sm_90a build into .v/base, main + each patch into .v/seg and .v/seg4 (each:
# NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR=$PWD/build/csrc90 JOBS=2 bash scripts/build_native.sh, then copy
# nanoqwen_rt/lib/libnanoqwen.so and build/lib/libnanoqwen_testing.so; restore the product build after),
# `tar -cf - .v/base .v/seg .v/seg4 | xz -T2 -4 > .out/variants.tar.xz`, carry .out and .whl.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
m=$(nq_sanitizer_model tiny)
nq_use seg4
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 tests/test_gpu_frag_gemv.py 2>&1 | tail -2 | tee -a "$OUT/summary.txt"
nq_quick_tests; nq_sanitize "seg4 " "$m" racecheck synccheck
for gs in 128 64 32; do
  python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --group-size $gs --quiet > /dev/null 2>&1
  for rep in 1 2; do for v in base seg seg4; do echo "g$gs: $(nq_ab "$v" 512 "$rep")" >> "$OUT/summary.txt"; done; done
done
tail -18 "$OUT/summary.txt"
