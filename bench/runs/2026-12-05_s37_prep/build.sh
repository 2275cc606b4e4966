#!/usr/bin/env bash
# The library of session 37's prepared call (bench/runs/2026-12-05_s37_sweep/), built here for sm_90a where
# .v/planknob37 is missing (~2-4 minutes on 2 cores) and packed into .out/sweep.tar.xz: planknob37 = HEAD +
# planknob.patch (NQ_FRAG_PLAN="MODE:TILES:K=wWsS,..." replaces frag_plan's plan of the launches it names; never
# main), with its testing library. Carry [".whl", ".out/sweep.tar.xz"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
nq_build_missing planknob37 bench/runs/2026-12-05_s37_prep/planknob.patch
NQ_PACK=.out/sweep.tar.xz nq_pack_variants planknob37 planknob37
