#!/usr/bin/env bash
# Session 38's prepared call for the next session (bench/NOTES.md "Session 38" §1 and its order's items 2-3; ~450 s):
# 1. `gpu_check.sh sizes` on main's product library (.out/libs.tar.xz: gate38 = 91b1314's product sources, sm_90a):
#    every size at 512 against its run's probe, in one run: #15's table;
# 2. the 7B at group 32 on an H200: the rule's gate/up halves against one block a tile (a tie on the H100);
# 3. the small sizes' plans that gained < 2 % on the H100, on an H200, each against the default alternated x2, with
#    .v/planknob38 (main + bench/runs/2026-12-05_s37_prep/planknob.patch; .out/pk38.tar.xz).
# Here: `bash bench/runs/2026-12-05_s38_next/build.sh`; carry [".whl", ".out/libs.tar.xz", ".out/pk38.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
export NQ_KNOB=planknob38
nq_stamp start
nq_sizes main38
nq_stamp sizes
# plans LABEL FILE "NAME=SPEC ...": the default and each NAME's plan alternated x2 on FILE at 512
plans() {
  local rep kv
  for rep in 1 2; do
    nq_ab_plan "$1" default "" 512 $rep "$2"
    for kv in $3; do nq_left 540 && nq_ab_plan "$1" "${kv%%=*}" "${kv#*=}" 512 $rep "$2"; done
  done
}
python3 bench/make_7b_file.py /tmp/g32.nanoqwen --group-size 32 --quiet > /dev/null 2>&1
plans 7Bg32 /tmp/g32.nanoqwen "gate_w4s1=2:592:3584=w4s1"
rm -f /tmp/g32.nanoqwen; nq_stamp 7Bg32
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 3B --quiet > /dev/null 2>&1
plans 3B /tmp/s.nanoqwen "o_w8s1=1:32:2048=w8s1 combo=0:40:2048=w8s2,1:32:2048=w8s1"
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 1.5B --quiet > /dev/null 2>&1
plans 1.5B /tmp/s.nanoqwen "o_w4s4=1:24:1536=w4s4 o_w8s2=1:24:1536=w8s2"
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
plans 0.5B /tmp/s.nanoqwen "o_w8s1=1:14:896=w8s1 combo=1:14:896=w8s1,1:14:4864=w4s8"
rm -f /tmp/s.nanoqwen; nq_stamp end
nq_ab_table default
