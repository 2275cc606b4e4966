#!/usr/bin/env bash
# Session 39's call (bench/NOTES.md "Session 39" §1; ~330 s): the gate/up (SwiGLU) GEMV in blocks of 5, 6 or 7 warps
# where 4-warp blocks leave the SMs' slots short (14B: 432 blocks for 660 slots, 13 warps an SM) or a warp with 4
# chunks after the wait (3B), with .v/warps39 (main + warpknob.patch: NQ_FRAG_PLAN picks a launch's plan):
# 1. correctness: tests/test_gpu_frag_gemv.py's SwiGLU cases with every new build in the plan of a shape they cover
#    (5 warps: 14B-gate, 7B-gate, tiny-gate with warps left without a chunk; 6: 1.5B-gate, one-pair-tile with uneven
#    chunks; 7: 0.5B-gate); group 32 keeps the rule's plan;
# 2. gate/up alone (gate_us.py: the product's gemv(), as frag_bench's "product" column) per size, default and the
#    alternatives alternated x2;
# 3. decode at 512 (64 tokens x 2): 14B, 3B, 1.5B, 0.5B, default and alternatives alternated x2;
# 4. on the same 14B file, stage39 (main + stage39.patch: q/k/v's RMSNorm staging, two units a thread issued before
#    rms_inv's pass) against main38 (main) alternated x2, and the 7B as its control (its q/k/v do not take the path).
# Here: `bash bench/runs/2026-12-05_s39_warps/build.sh`; carry [".whl", ".out/warps39.tar.xz"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
export NQ_KNOB=warps39 NANOQWEN_TESTING_LIB="$PWD/.v/warps39/libnanoqwen_testing.so"
RUN=bench/runs/2026-12-05_s39_warps
nq_stamp start
NQ_FRAG_PLAN="2:432:5120=w5s1,2:592:3584=w5s1,2:24:256=w5s1,2:280:1536=w6s1,2:2:2048=w6s1,2:152:896=w7s1" \
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k swiglu tests/test_gpu_frag_gemv.py \
  > "$OUT/tests_warps39.log" 2>&1
echo "warps39 tests rc=$?: $(tail -1 "$OUT/tests_warps39.log")" | tee -a "$OUT/summary.txt"
nq_stamp tests
# gate SHAPE "NAME=SPEC ...": gate/up alone, the rule and each SPEC, alternated x2
gate() {
  local rep kv
  for rep in 1 2; do
    python3 $RUN/gate_us.py "$1" default 2>&1 | tee -a "$OUT/summary.txt"
    for kv in $2; do NQ_FRAG_PLAN="${kv#*=}" python3 $RUN/gate_us.py "$1" "${kv%%=*}" 2>&1 | tee -a "$OUT/summary.txt"; done
  done
}
gate 14B "w5s1=2:432:5120=w5s1"
gate 3B "w6s1=2:344:2048=w6s1 w5s1=2:344:2048=w5s1"
gate 1.5B "w6s1=2:280:1536=w6s1"
gate 0.5B "w7s1=2:152:896=w7s1"
gate 32B "w5s1=2:864:5120=w5s1 w5s2=2:864:5120=w5s2"
nq_stamp gate
# plans LABEL FILE "NAME=SPEC ...": the default and each NAME's plan alternated x2 on FILE at 512
plans() {
  local rep kv
  for rep in 1 2; do
    nq_left 560 && nq_ab_plan "$1" default "" 512 $rep "$2"
    for kv in $3; do nq_left 560 && nq_ab_plan "$1" "${kv%%=*}" "${kv#*=}" 512 $rep "$2"; done
  done
}
f=/tmp/s.nanoqwen
# ab2 LABEL FILE A B: nq_ab of A and B alternated x2 on FILE at 512
ab2() { local rep v; for rep in 1 2; do for v in "$3" "$4"; do nq_left 560 && nq_ab "$v" 512 $rep "$2" "$1"; done; done; }
python3 bench/make_7b_file.py $f --shape 14B --quiet > /dev/null 2>&1 && plans 14B $f "w5s1=2:432:5120=w5s1" &&
  ab2 14B $f main38 stage39
nq_stamp 14B
python3 bench/make_7b_file.py $f --shape 3B --quiet > /dev/null 2>&1 &&
  plans 3B $f "w6s1=2:344:2048=w6s1 w5s1=2:344:2048=w5s1"
python3 bench/make_7b_file.py $f --shape 1.5B --quiet > /dev/null 2>&1 && plans 1.5B $f "w6s1=2:280:1536=w6s1"
python3 bench/make_7b_file.py $f --shape 0.5B --quiet > /dev/null 2>&1 && plans 0.5B $f "w7s1=2:152:896=w7s1"
nq_left 500 && python3 bench/make_7b_file.py $f --quiet > /dev/null 2>&1 && ab2 7B $f main38 stage39
rm -f $f; nq_stamp end
nq_ab_table default
