#!/usr/bin/env bash
# One device call for the prefill builds' stream-K A/B (csrc/dev/gemm_int4_wgmma.cu's sk_* entries, gemm_wgmma.cuh
# "Work split"): correctness of each stream-K build (smoke: small shapes, tails, groups, bias/add; then the 7B shapes
# at M in {7, 64, 512, 513, 2048}), then timing of the tile-grid builds, their stream-K twins and the product path
# (gemm.cu's choice) on the 7B shapes at M = 512 and 2048. Logs to $OUT.
#   device: run(command="bash csrc/dev/gemm_int4_wgmma_streamk_ab.sh", carry=["build/dev/gemm_int4_wgmma"])
set -o pipefail
B=build/dev/gemm_int4_wgmma
OUT=${OUT:-/tmp/ab_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
[ -x $B ] || make -C csrc/dev "$PWD/$B" > "$OUT/make.log" 2>&1 || { tail -20 "$OUT/make.log"; exit 1; }
fail=0
for k in sk_n128w2 sk_n256w2 sk_n128w3; do
  timeout 60 $B --case smoke:$k > "$OUT/smoke_$k.log" 2>&1 || fail=1
  tail -1 "$OUT/smoke_$k.log"
done
timeout 150 $B --case shapes:sk_n256w2 > "$OUT/shapes.log" 2>&1 || fail=1; tail -1 "$OUT/shapes.log"
[ $fail = 0 ] || { echo "a correctness case failed: no timing (logs in \$OUT)"; grep -h FAIL "$OUT"/*.log | head; exit 1; }
timeout 240 $B --case time:tma_n128w2,tma_n256w2,tma_n128w3,sk_n128w2,sk_n256w2,sk_n128w3,product > "$OUT/time.log" 2>&1
echo "time rc=$?"
grep -E "timing|^  [a-z+]|per layer" "$OUT/time.log"
