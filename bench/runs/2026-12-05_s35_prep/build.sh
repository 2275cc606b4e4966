#!/usr/bin/env bash
# The libraries of session 35's prepared calls, built here for sm_90a where .v/NAME is missing (~4 minutes each on 2
# cores, ~35 minutes for all eight from nothing: run it in the background) and packed:
# * .out/call2.tar.xz (6 MB) for bench/runs/2026-12-05_s35_call2/call.sh: planknob (HEAD + planknob.patch, with its
#   testing library for frag_bench.py); carry [".whl", ".out/call2.tar.xz"];
# * .out/call1.tar.xz (~22 MB) for bench/runs/2026-12-05_s35_call1/call.sh: handover (branch wip/s35-handover: the
#   decode hand-overs through counts, with its testing library), handover0 (the branch + handover_nolink.patch: the
#   same kernels, no launch given a link), handover_last (the branch's d2d9465: the first form, flags published by
#   each grid's last block), main34 (HEAD) and session 34's l2a / l2b / l2c; carry [".whl", ".out/call1.tar.xz"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
source bench/runs/2026-12-04_s34_prep/l2_patches.sh
P=bench/runs/2026-12-05_s35_prep
T=build/s35   # relative: nq_build_variant applies $PWD/PATCH
nq_build_missing planknob $P/planknob.patch
NQ_BASE=wip/s35-handover nq_build_missing handover
NQ_BASE=wip/s35-handover nq_build_missing handover0 $P/handover_nolink.patch
NQ_BASE=d2d9465 nq_build_missing handover_last
nq_build_missing main34
nq_l2_patches $T
nq_build_missing l2a bench/runs/2026-12-04_s34_prep/l2side.patch
nq_build_missing l2b $T/l2b.patch
nq_build_missing l2c $T/l2c.patch
NQ_PACK=.out/call2.tar.xz nq_pack_variants planknob planknob
NQ_PACK=.out/call1.tar.xz nq_pack_variants handover handover handover0 handover_last main34 l2a l2b l2c
