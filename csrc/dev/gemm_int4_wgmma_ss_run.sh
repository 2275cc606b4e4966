#!/usr/bin/env bash
# One device call for the shared-memory-A few-token GEMM (gemm_int4_wgmma_ss.cuh): correctness of every ss_* build
# (smoke, then the 7B shapes at M in {7, 64, 512, 513, 2048}) and timing against the library's few-token builds and
# the product path at M in {5, 8, 16, 32, 64}. Logs to $OUT. build/dev/gemm_int4_wgmma travels (carry build/dev).
#   device: run(command="bash csrc/dev/gemm_int4_wgmma_ss_run.sh", carry=["build/dev"])
set -o pipefail
B=build/dev/gemm_int4_wgmma
OUT=${OUT:-/tmp/ss_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
[ -x $B ] || make -C csrc/dev "$PWD/$B" > "$OUT/make.log" 2>&1 || { tail -20 "$OUT/make.log"; exit 1; }
fail=0
for k in ss_n16w3s4k4 ss_n32w3s4k4 ss_n32w3s6k2 ss_n64w3s6k2; do
  timeout 60 $B --case smoke:$k > "$OUT/smoke_$k.log" 2>&1 || fail=1
  tail -1 "$OUT/smoke_$k.log"
done
timeout 120 $B --case shapes:ss_n32w3s4k4 > "$OUT/shapes_ss_n32.log" 2>&1 || fail=1; tail -1 "$OUT/shapes_ss_n32.log"
[ $fail = 0 ] || { echo "a correctness case failed: no timing (logs in \$OUT)"; exit 1; }
timeout 240 $B --case timebatch:tma_n16w3s4k4,ss_n16w3s4k4,tma_n32w3s4k4,ss_n32w3s4k4,ss_n32w3s6k2,tma_n64w3s6k2,ss_n64w3s6k2,product \
  > "$OUT/timebatch.log" 2>&1; echo "timebatch rc=$?"
grep -E "M=|per layer" "$OUT/timebatch.log" | tail -20
