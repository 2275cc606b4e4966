#!/usr/bin/env bash
# Session 29 call 2 (NOTES "Session 29" §2): does every decode kernel get the same shared-memory / L1 split? An SM
# holds one carveout at a time, so a PDL launch whose blocks need another split may not start beside the previous
# kernel's blocks. ncu's launch metrics of one decode step (main28 and c100), then the A/B: c100 / c72 = main with
# cudaFuncAttributePreferredSharedMemoryCarveout 100 / 72 (% of 228 KB) set on every kernel before its launch
# (carveout.patch: launch.h only, no device code changed).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
M=launch__shared_mem_config_size,launch__shared_mem_per_block_static,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_driver,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__grid_size,launch__block_size
for v in main28 c100; do
  NANOQWEN_LIB="$PWD/.v/$v/libnanoqwen.so" timeout 150 ncu --clock-control none --graph-profiling node --metrics "$M" --csv \
    python3 bench/profile_decode.py run /tmp/q7b.nanoqwen > "$OUT/ncu_$v.csv" 2> "$OUT/ncu_$v.err"
  echo "ncu $v rc=$? rows=$(wc -l < "$OUT/ncu_$v.csv")" | tee -a "$OUT/summary.txt"
done
for rep in 1 2; do for v in main28 c100 c72; do nq_ab "$v" 512 "$rep"; done; done
for v in main28 c100 c72; do nq_ab "$v" 8192 1; done
