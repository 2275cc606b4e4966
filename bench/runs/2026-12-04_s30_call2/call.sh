#!/usr/bin/env bash
# Session 30 call 2 (NOTES "Session 30" §2): why the decode attention streams K/V at ~3 TB/s at 32K keys (22.4 µs a
# 7B layer for 65.5 MB). attn_bench (testing libraries) of main29 (attention at a 196 KB split: 60 KB of L1) and r71
# (164 KB: 92 KB of L1) at 577 / 8K / 32K keys: does L1 bound the cp.async stream? Then ncu's sections on one
# 32K-key launch (main29): what the warps stall on, DRAM throughput, L1 / LSU pressure.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
for v in main29 r71 main29 r71; do
  NANOQWEN_TESTING_LIB="$PWD/.v/$v/libnanoqwen_testing.so" timeout 90 python3 bench/attn_bench.py --contexts 577 8192 32768 \
    --decode-kps 32 2>&1 | grep -E "^attn 7B" | sed "s/^/$v /" | tee -a "$OUT/summary.txt"
done
NANOQWEN_TESTING_LIB="$PWD/.v/main29/libnanoqwen_testing.so" timeout 200 ncu --clock-control none --graph-profiling node \
  --kernel-name regex:attn_decode --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis_Tables \
  python3 bench/attn_bench.py --contexts 32768 --decode-kps 32 --iters 8 > "$OUT/ncu_attn32k.txt" 2>&1
echo "ncu rc=$?" | tee -a "$OUT/summary.txt"
cp "$OUT/summary.txt" "$OUT/summary_copy.txt" 2>/dev/null
