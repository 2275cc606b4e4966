#!/usr/bin/env bash
# Session 38: the GPU suite (tests, bench with peers, sanitizers) on the gate/up rule (gate38: 91b1314's product
# sources, sm_90a, packed in .out/libs.tar.xz), then the 1.5B at 512, main (review37: f578ba2) against gate38
# alternated x2 (bench/NOTES.md "Session 38" §1). Carry [".whl", ".out/libs.tar.xz", ".out/ab38.tar.xz"]; ~470 s.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NQ_REV=1403df0 bash bench/runs/2026-12-06_s36_suite/call.sh tests,bench,sanitize
source bench/device_prelude.sh
nq_stamp suite
python3 bench/make_7b_file.py /tmp/s15.nanoqwen --shape 1.5B --quiet > /dev/null 2>&1
for rep in 1 2; do for v in review37 gate38; do nq_ab "$v" 512 "$rep" /tmp/s15.nanoqwen 1.5B; done; done
nq_stamp end
nq_ab_table review37
