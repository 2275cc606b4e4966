#!/usr/bin/env bash
# The libraries of bench/runs/2026-12-05_s39_warps/call.sh, built here for sm_90a (~1-3 minutes each on 2 cores) where
# missing: warps39 = main + warpknob.patch (planknob's NQ_FRAG_PLAN knob, and SwiGLU builds of 5, 6 and 7 warps at
# groups >= 64; never main), stage39 = main + stage39.patch (q/k/v's RMSNorm staging with two units a thread issued
# before rms_inv's pass) and main38 (main's product sources), packed with warps39's testing library as
# .out/warps39.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
nq_build_missing warps39 bench/runs/2026-12-05_s39_warps/warpknob.patch
nq_build_missing stage39 bench/runs/2026-12-05_s39_warps/stage39.patch
nq_build_missing main38
NQ_PACK=.out/warps39.tar.xz nq_pack_variants warps39 warps39 stage39 main38
