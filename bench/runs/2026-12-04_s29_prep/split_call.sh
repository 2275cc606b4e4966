#!/usr/bin/env bash
# Prepared in session 29 (patches compiled, not run; NOTES "Session 29" §7 and the next order's items -1 and 1).
# main29 = main (cbc9f58's rule: 72 %); r71 = main + split_round_down.patch (the percentage rounded down: 71 %, surely
# the 164 KB split); dyn = main + frag_dyn_smem.patch (the frag GEMV's x f32 parking and split slots in dynamic shared
# memory sized by K and S: 7B gate/up 24.4 KB a block with its reservation, static 2,448 B instead of 22,928; SWIGLU
# 96 registers, 8 bytes of stack, 2,440 SASS instructions as main); dyn132 = dyn + split132.patch (the uniform split at
# 132 KB, rounded down: 57 %; the 8-warp attention's 141 KB still gets 164). Before the call, here: each variant's
# sm_90a build (product library; dyn132's testing library too) into .v/<name>, tarred into .out/variants.tar.xz; carry
# .out and .whl.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use dyn132; nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "dyn132 " "$m" racecheck synccheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
M=launch__shared_mem_config_size,launch__shared_mem_per_block_static,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__grid_size,launch__block_size
for v in main29 r71 dyn132; do
  NANOQWEN_LIB="$PWD/.v/$v/libnanoqwen.so" timeout 150 ncu --clock-control none --graph-profiling node --metrics "$M" --csv \
    python3 bench/profile_decode.py run /tmp/q7b.nanoqwen > "/tmp/ncu_$v.csv" 2> "$OUT/ncu_$v.err"
  python3 bench/runs/2026-12-04_s29_call2/ncu_splits.py "/tmp/ncu_$v.csv" 6 > "$OUT/splits_$v.txt"
  echo "ncu $v: $(sed -n 2,7p "$OUT/splits_$v.txt" | awk '{print $3}' | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
done
for rep in 1 2; do for v in main29 r71 dyn dyn132; do nq_ab "$v" 512 "$rep"; done; done
for v in main29 r71 dyn dyn132; do nq_ab "$v" 8192 1; done
