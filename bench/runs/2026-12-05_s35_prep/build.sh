#!/usr/bin/env bash
# The libraries of session 35's prepared call (bench/runs/2026-12-05_s35_plans/call.sh), built here for sm_90a where
# .v/NAME is missing (~3 minutes each on 2 cores) and packed into .out/plans.tar.xz: planknob (HEAD + planknob.patch,
# with its testing library for frag_bench.py) and main34 (HEAD's product library, the 7B control). Carry [".whl",
# ".out/plans.tar.xz"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
[ -f .v/main34/libnanoqwen.so ] || nq_build_variant main34 0
[ -f .v/planknob/libnanoqwen.so ] || nq_build_variant planknob 0 bench/runs/2026-12-05_s35_prep/planknob.patch
NQ_PACK=.out/plans.tar.xz nq_pack_variants planknob planknob main34
