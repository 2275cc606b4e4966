#!/usr/bin/env bash
# Session 35's prepared call (NOTES "Session 35" §1; ~480 s): the decode GEMVs' launch plans on the 14B and 32B shapes,
# whose plans no call has timed (frag_plan's rule was measured on the 7B): 14B / 32B down get 320 blocks of 8 warps
# for 264 slots, 32B gate/up 864 blocks for 660, 14B / 32B q/k/v 5 chunks a warp after the PDL wait (7B: 1-2).
# 1. The decode end to end (512-token prompt, 64 tokens x 2) with .v/planknob (HEAD + planknob.patch: NQ_FRAG_PLAN
#    replaces the plan of the launches it names; unset, the product's plans: host code only, the kernels are HEAD's):
#    the default, one GEMV's plan changed at a time, then the combination of each GEMV's best change (if any beat the
#    default by > 0.5 %), alternated with the default; the 14B first, then the 32B.
# 2. With the time left (each step is skipped past its budget; the device's limit is 600 s): frag_bench.py
#    --gemv-plans --shape 14B / 32B / 3B, every plan of each GEMV alone (the testing library).
# Build here first: bash bench/runs/2026-12-05_s35_prep/build.sh (packs .out/call2.tar.xz, 6 MB); carry [".whl",
# ".out/call2.tar.xz"] (naming the file keeps call 5's variants.tar.xz out of the carry).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_stamp start
python3 bench/make_7b_file.py /tmp/s14.nanoqwen --shape 14B --quiet > /dev/null 2>&1
NQ_KNOB=planknob nq_plan_sweep 14B /tmp/s14.nanoqwen "qkv_w4s4=0:112:5120=w4s4 qkv_w8s2=0:112:5120=w8s2 o_w8s2=1:80:5120=w8s2 down_w8s2=1:80:13824=w8s2 down_w4s4=1:80:13824=w4s4 gate_w4s2=2:432:5120=w4s2"
rm -f /tmp/s14.nanoqwen
nq_stamp 14B
nq_left 400 && python3 bench/make_7b_file.py /tmp/s32.nanoqwen --shape 32B --quiet > /dev/null 2>&1 && NQ_KNOB=planknob nq_plan_sweep 32B /tmp/s32.nanoqwen "down_w8s2=1:80:27648=w8s2 down_w4s4=1:80:27648=w4s4 gate_w4s2=2:864:5120=w4s2 qkv_w4s4=0:112:5120=w4s4"
rm -f /tmp/s32.nanoqwen
nq_stamp 32B
# every plan of each GEMV alone (the testing library), as long as time is left
for s in 14B 32B 3B; do
  nq_left 560 || break
  NANOQWEN_TESTING_LIB="$PWD/.v/planknob/libnanoqwen_testing.so" timeout 40 python3 bench/frag_bench.py --gemv-plans \
    --shape $s --iters 50 > "$OUT/gemv_plans_$s.txt" 2>&1
  echo "gemv_plans $s rc=$?" >> "$OUT/summary.txt"; grep '^gemv plans' "$OUT/gemv_plans_$s.txt" | tee -a "$OUT/summary.txt"
done
nq_stamp end
python3 bench/ab_table.py "$OUT/summary.txt" --base default > "$OUT/ab_table.md" 2>&1; cat "$OUT/ab_table.md"
