#!/usr/bin/env bash
# One device call for csrc/dev/gemm_int4_fragpack.cu: the repack/unpack pair on the CPU, every M-tile build against a
# float64 reference, then the 7B layer's GEMMs at M = 1, 8, 16, 32, 64 against the product's gemm_multi (every build and
# split count; the best printed), and where the best builds spend their time (diag). Logs to $OUT.
#   device: run(command="bash csrc/dev/gemm_int4_fragpack_run.sh", carry=["build/dev/gemm_int4_fragpack"])
set -o pipefail
B=build/dev/gemm_int4_fragpack
OUT=${OUT:-/tmp/fp_out}; mkdir -p "$OUT"
[ -x $B ] || make -C csrc/dev "$PWD/$B" > "$OUT/make.log" 2>&1 || { tail -20 "$OUT/make.log"; exit 1; }
$B --case pack | tee "$OUT/pack.log" || exit 1
$B --case emulate | tee "$OUT/emulate.log" || exit 1
timeout 120 $B --case check > "$OUT/check.log" 2>&1; rc=$?; cat "$OUT/check.log"
[ $rc = 0 ] || { echo "check failed (rc=$rc): no timing"; exit 1; }
timeout 300 $B --case time > "$OUT/time.log" 2>&1; echo "time rc=$?"; grep -E "best|per 7B" "$OUT/time.log"
timeout 120 $B --case diag | tee "$OUT/diag.log"
