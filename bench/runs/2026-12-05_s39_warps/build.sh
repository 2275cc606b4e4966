#!/usr/bin/env bash
# The library of bench/runs/2026-12-05_s39_warps/call.sh, built here for sm_90a (~1-3 minutes on 2 cores) where
# missing: warps39 = main + warpknob.patch (planknob's NQ_FRAG_PLAN knob, and SwiGLU builds of 5, 6 and 7 warps at
# groups >= 64; never main), packed with its testing library as .out/warps39.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
nq_build_missing warps39 bench/runs/2026-12-05_s39_warps/warpknob.patch
NQ_PACK=.out/warps39.tar.xz nq_pack_variants warps39 warps39
