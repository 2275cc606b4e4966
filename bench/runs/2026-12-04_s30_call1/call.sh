#!/usr/bin/env bash
# Session 30 call 1 (NOTES "Session 29" §7 and "where it stands" items -1, 0, 1): session 29's prepared split_call.sh
# and lm_head_split_call.sh in one call, alternated on one machine. main29 = main (43d6912: 72 %); r71 = main +
# split_round_down.patch (71 %); dyn = main + frag_dyn_smem.patch; dyn132 = dyn + split132.patch; lmrule = main +
# lm_head_split_rule.patch. ncu's launch metrics first (which split 72 % gives), then the A/B.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
M=launch__shared_mem_config_size,launch__shared_mem_per_block_static,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__grid_size,launch__block_size
for v in main29 r71 dyn132 lmrule; do
  NANOQWEN_LIB="$PWD/.v/$v/libnanoqwen.so" timeout 100 ncu --clock-control none --graph-profiling node --metrics "$M" --csv \
    python3 bench/profile_decode.py run /tmp/q7b.nanoqwen > "/tmp/ncu_$v.csv" 2> "$OUT/ncu_$v.err"
  python3 bench/runs/2026-12-04_s29_call2/ncu_splits.py "/tmp/ncu_$v.csv" 6 > "$OUT/splits_$v.txt"
  echo "ncu $v: $(sed -n 2,8p "$OUT/splits_$v.txt" | tr -s ' ' | tr '\n' '|')" | tee -a "$OUT/summary.txt"
done
for rep in 1 2; do for v in main29 r71 dyn dyn132 lmrule; do nq_ab "$v" 512 "$rep"; done; done
for v in main29 r71 dyn dyn132 lmrule; do nq_ab "$v" 8192 1; done
rm -f /tmp/q7b.nanoqwen
timeout 150 python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main29 r71 lmrule; do nq_ab "$v" 512 "$rep" /tmp/s.nanoqwen 0.5B; done; done
