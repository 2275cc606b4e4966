#!/usr/bin/env bash
# Session 37's prepared call (NOTES "Session 37" §4; ~450 s): the decode GEMV plans the rule (2e8405f) left untimed,
# end to end at 512 with .v/planknob37 (main + bench/runs/2026-12-05_s37_prep/planknob.patch: NQ_FRAG_PLAN replaces
# the plans of the launches it names; host code only, the kernels are main's):
# 1. the 7B at group 32, where the rule splits gate/up in 2 (592 tiles for 528 slots: SWIGLU at group 32 takes 4
#    blocks an SM) and the old rule did not: the default against gate/up w4s1, alternated x2;
# 2. the 3B, 1.5B and 0.5B: each GEMV's alternatives one at a time, then the best of each combined (nq_plan_sweep).
# Here: `bash bench/runs/2026-12-05_s37_prep/build.sh` (packs .out/sweep.tar.xz); carry [".whl", ".out/sweep.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
export NQ_KNOB=planknob37
nq_stamp start
python3 bench/make_7b_file.py /tmp/g32.nanoqwen --group-size 32 --quiet > /dev/null 2>&1
for rep in 1 2; do
  nq_ab_plan 7Bg32 default "" 512 $rep /tmp/g32.nanoqwen
  nq_ab_plan 7Bg32 gate_w4s1 "2:592:3584=w4s1" 512 $rep /tmp/g32.nanoqwen
done
rm -f /tmp/g32.nanoqwen
nq_stamp 7Bg32
# sweep SHAPE "NAME=SPEC ...": a SHAPE-shaped file, nq_plan_sweep over it, the file removed
sweep() {
  nq_left 420 && python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape "$1" --quiet > /dev/null 2>&1 &&
    nq_plan_sweep "$1" /tmp/s.nanoqwen "$2"
  rm -f /tmp/s.nanoqwen; nq_stamp "$1"
}
sweep 3B "qkv_w8s2=0:40:2048=w8s2 qkv_w8s1=0:40:2048=w8s1 qkv_w4s2=0:40:2048=w4s2 o_w4s4=1:32:2048=w4s4 o_w8s1=1:32:2048=w8s1 o_w4s2=1:32:2048=w4s2 gate_w4s2=2:344:2048=w4s2 down_w8s4=1:32:11008=w8s4"
sweep 1.5B "qkv_w4s4=0:32:1536=w4s4 qkv_w8s2=0:32:1536=w8s2 o_w4s4=1:24:1536=w4s4 o_w8s2=1:24:1536=w8s2 gate_w4s2=2:280:1536=w4s2 down_w8s4=1:24:8960=w8s4 down_w4s4=1:24:8960=w4s4"
sweep 0.5B "qkv_w4s2=0:18:896=w4s2 qkv_w8s1=0:18:896=w8s1 o_w4s2=1:14:896=w4s2 o_w8s1=1:14:896=w8s1 gate_w4s1=2:152:896=w4s1 gate_w4s4=2:152:896=w4s4 down_w4s8=1:14:4864=w4s8 down_w8s4=1:14:4864=w8s4 down_w8s8=1:14:4864=w8s8"
nq_ab_table default
