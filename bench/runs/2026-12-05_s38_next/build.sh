#!/usr/bin/env bash
# The libraries of bench/runs/2026-12-05_s38_next/call.sh, built here for sm_90a (~2-4 minutes each on 2 cores) where
# missing: main38 (main's product sources) packed as .out/libs.tar.xz at the paths the tree loads them from, and
# planknob38 = main + planknob.patch (never main) packed as .out/pk38.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
nq_build_missing main38
nq_build_missing planknob38 bench/runs/2026-12-05_s37_prep/planknob.patch
nq_pack_libs main38 .out/libs.tar.xz
NQ_PACK=.out/pk38.tar.xz nq_pack_variants planknob38 planknob38
