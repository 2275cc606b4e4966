#!/usr/bin/env bash
# One device call for csrc/dev/attn_prefill_fa.cu: build (ptxas registers / spills of every variant from the build
# log), every variant x key split against float64 and the product kernel (check; stops here on a failure), then the
# 7B timings against the product's attn_prefill_kernel (time). Full logs in $OUT.
#   device: run(command="bash csrc/dev/attn_prefill_fa_run.sh")
set -o pipefail
B=build/dev/attn_prefill_fa
OUT=${OUT:-/tmp/fa_out}; mkdir -p "$OUT"
make -C csrc/dev "$PWD/$B" > "$OUT/make.log" 2>&1 || { tail -30 "$OUT/make.log"; exit 1; }
# registers / spills per kernel (function name line, then its spill line, then its register line)
grep -E "Compiling entry function|spill stores|Used [0-9]+ registers" "$OUT/make.log" | paste - - - |
  grep -E "attn_prefill_faINS|attn_prefill_kernel" |
  sed -E 's/.*CfgILi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELb([01])ELi([0-9]+).*sm_90a.(.*)/fa D\1 W\2 MT\3 KT\4 ST\5 QREG\6 MINB\7 \8/;
          s/.*attn_prefill_kernel(_v1)?ILi([0-9]+).*sm_90a.(.*)/attn_prefill_kernel\1 D\2 \3/;
          s/ptxas info *: //g; s/[ \t]+/ /g' | tee "$OUT/regs.txt"
timeout 200 $B --case check > "$OUT/check.log" 2>&1; rc=$?
grep -E "FAIL" "$OUT/check.log" | head -20; tail -1 "$OUT/check.log"
[ $rc = 0 ] || { echo "check failed (rc=$rc): no timing"; exit 1; }
timeout 300 $B --case time > "$OUT/time.log" 2>&1; echo "time rc=$?"
grep -E "registers|v1 attn|product|best per prompt" "$OUT/time.log"
