#!/usr/bin/env bash
# One device call for an A/B of few-token builds of gemm_int4_wgmma (csrc/dev/gemm_int4_wgmma.cu's kernel table):
# correctness of each candidate (smoke, then the 7B shapes at M in {7, 64, 512, 513, 2048}), then timing of the
# candidates against the library's few-token builds and the product path at M in {5, 8, 16, 32, 64}. Logs to $OUT.
#   device: run(command="bash csrc/dev/gemm_int4_wgmma_fewtoken_ab.sh tma_n16w4s6k2 tma_n32w4s6k2",
#               carry=["build/dev/gemm_int4_wgmma"])
# With no arguments: the 4-consumer-warpgroup builds (w4), which lost (bench/NOTES.md "Session 10" §2). Session 9
# ran it on the shared-memory builds (ss_*), which lost too; their kernel, a copy of the library's with the weights
# dequantised into shared memory, is on branch wip/fewtoken-ss (bench/NOTES.md "Session 9").
set -o pipefail
B=build/dev/gemm_int4_wgmma
OUT=${OUT:-/tmp/ab_out}; mkdir -p "$OUT"
CANDIDATES=("$@")
[ ${#CANDIDATES[@]} -gt 0 ] || CANDIDATES=(tma_n16w4s6k2 tma_n32w4s6k2 tma_n64w4s8k1)
BASELINES=(tma_n16w3s4k4 tma_n32w3s4k4 tma_n64w3s6k2)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
[ -x $B ] || make -C csrc/dev "$PWD/$B" > "$OUT/make.log" 2>&1 || { tail -20 "$OUT/make.log"; exit 1; }
fail=0
for k in "${CANDIDATES[@]}"; do
  timeout 60 $B --case smoke:$k > "$OUT/smoke_$k.log" 2>&1 || fail=1
  tail -1 "$OUT/smoke_$k.log"
done
timeout 120 $B --case shapes:${CANDIDATES[0]} > "$OUT/shapes.log" 2>&1 || fail=1; tail -1 "$OUT/shapes.log"
[ $fail = 0 ] || { echo "a correctness case failed: no timing (logs in \$OUT)"; exit 1; }
list=$(IFS=,; echo "${BASELINES[*]},${CANDIDATES[*]},product")
timeout 240 $B --case timebatch:$list > "$OUT/timebatch.log" 2>&1; echo "timebatch rc=$?"
grep -E "M=|per layer" "$OUT/timebatch.log" | tail -20
