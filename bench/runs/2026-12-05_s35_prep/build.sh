#!/usr/bin/env bash
# The library of session 35's prepared call (bench/runs/2026-12-05_s35_plans/call.sh), built here for sm_90a where
# .v/planknob is missing (~3 minutes on 2 cores; HEAD + planknob.patch, with its testing library for frag_bench.py)
# and packed into .out/plans.tar.xz (6 MB). Carry [".whl", ".out/plans.tar.xz"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
[ -f .v/planknob/libnanoqwen.so ] || nq_build_variant planknob 0 bench/runs/2026-12-05_s35_prep/planknob.patch
NQ_PACK=.out/plans.tar.xz nq_pack_variants planknob planknob
