#!/usr/bin/env bash
# One device call for the streaming-GEMV dev experiment: device facts, SASS counts, the timed run, ncu stall
# breakdowns of two consumers on the gate/up shape, compute-sanitizer memcheck. Logs go to $OUT (8 files at most).
set -o pipefail
B=build/dev/gemv_int4_stream
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
if ! $B probe > "$OUT/probe.txt" 2>&1; then
  make -C csrc/dev "$PWD/build/dev/gemv_int4_stream" >> "$OUT/probe.txt" 2>&1 || { tail -20 "$OUT/probe.txt"; exit 1; }
fi
cuobjdump -sass $B > /tmp/sass.txt 2>&1
awk '/Function :/{f=$3} {n=split($0,a,/[ ;]+/); for(i=1;i<=n;i++) if (a[i] ~ /^(UBLKCP|SYNCS|LDS|HMMA|HFMA2|LOP3|BAR|STL|LDL|SHF|FFMA|BRA)/) c[f" "a[i]]++}
     END{for(k in c) print c[k], k}' /tmp/sass.txt | grep stream_mma | sort -k2 > "$OUT/sass_counts.txt"
awk '/Function :.*stream_mmaILi2ELi8ELb1ELi1ELi7E/{f=1;print;next} /Function :/{f=0} f' /tmp/sass.txt > "$OUT/sass_mma_xreg_swiglu.txt"
# next run (after round 2): the xreg consumer against the same-run references, twice (seed offsets 0 and 1)
# (round 2 run 5 list: ...;mma W8 ilp;mma W8 ilp 1copy;tma-only 1copy;mma W8 compute-only;mma W16 ilp 1copy;mma W16 compute-only)
export GS_VARIANT="ceiling ld.nc;tma-only W8;prod v2;mma W8 ilp 1copy;tma-only 1copy;mma W8 xreg 1copy${GS_EXTRA:+;$GS_EXTRA}"
timeout 100 $B 0 > "$OUT/run.log" 2>&1; echo "run rc=$?"
timeout 100 $B 1 > "$OUT/run_seed1.log" 2>&1; echo "run seed1 rc=$?"
grep -A40 "^(graph timing" "$OUT/run_seed1.log" | grep -v "^(graph" | grep -v NOTES > /tmp/t1
echo "---- seed 1 table (spread check)"; cat /tmp/t1
echo "---- seed 0 full log"; cat "$OUT/run.log"
unset GS_VARIANT
NCU="ncu --clock-control none --section SpeedOfLight --section SchedulerStats --section WarpStateStats --launch-count 1"
M1="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
M2="$M1,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
# run 5: stall reasons (per issued instruction), shared-memory wavefronts / conflicts, tensor pipe; gate/up
for vv in "mma W8 xreg 1copy:ncu_mma_xreg"; do   # run 5 profiled mma W8 ilp 1copy and mma W16 ilp 1copy
  f="$OUT/${vv##*:}.txt"
  GS_SHAPE=2 GS_VARIANT="${vv%%:*}" timeout 50 $NCU --metrics "$M2" -k regex:stream_mma $B check > "$f" 2>&1 ||
    GS_SHAPE=2 GS_VARIANT="${vv%%:*}" timeout 40 $NCU --metrics "$M1" -k regex:stream_mma $B check > "$f" 2>&1
  echo "ncu ${vv%%:*} rc=$?"
done
GS_VARIANT="mma W8 xreg 1copy;mma W8 ilp 1copy${GS_EXTRA:+;$GS_EXTRA}" timeout 90 compute-sanitizer --tool memcheck $B check > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"
grep -i "ERROR SUMMARY\|FAIL" "$OUT/memcheck.log" | tail -3
for f in "$OUT"/ncu_mma_xreg.txt; do echo "== $f"; grep -i "issue_stalled\|hmma\|shared.sum\|Issued Warp\|Eligible Warps\|Duration\|DRAM Throughput" "$f" | awk '$NF+0 > 0.05 || !/issue_stalled/' | head -40; done
