#!/usr/bin/env bash
# Session 29 call 4 (NOTES "Session 29" §3): c72 lost 2 % on the 0.5B (call 3) and won 0.1-0.9 % on the 7B and 0.75 %
# on the 14B. Which part: c72nolm = c72 except the dense lm_head GEMV (gemv_rowpair keeps the driver's split), c57 =
# every kernel prefers 57 % (132 KB: the 0.5B's largest need; on the 7B gate/up and attention still get 164).
# ncu's launch splits of the 0.5B's decode step (main28) first.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
M=launch__shared_mem_config_size,launch__shared_mem_per_block_static,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__grid_size,launch__block_size
timeout 150 python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
NANOQWEN_LIB="$PWD/.v/main28/libnanoqwen.so" timeout 100 ncu --clock-control none --graph-profiling node --metrics "$M" --csv \
  python3 bench/profile_decode.py run /tmp/s.nanoqwen > "$OUT/ncu_05b.csv" 2> "$OUT/ncu_05b.err"
echo "ncu 0.5B rc=$?" | tee -a "$OUT/summary.txt"
for rep in 1 2; do for v in main28 c72 c72nolm c57; do
  r=$(NANOQWEN_LIB="$PWD/.v/$v/libnanoqwen.so" timeout 150 python3 -m nanoqwen_bench /tmp/s.nanoqwen --device cuda --no-peers \
      --prompt-tokens 512 --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tr -s ' ' | tr '\n' ';')
  echo "size 0.5B $v rep$rep: $r" | tee -a "$OUT/summary.txt"
done; done
rm -f /tmp/s.nanoqwen
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main28 c72 c72nolm c57; do nq_ab "$v" 512 "$rep"; done; done
