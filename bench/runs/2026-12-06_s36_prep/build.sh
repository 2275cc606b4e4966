#!/usr/bin/env bash
# The libraries of session 36's call 1b (bench/runs/2026-12-06_s36_call1b/), built here for sm_90a where .v/NAME is
# missing (~4 minutes each on 2 cores) and packed into .out/call1b.tar.xz (~11 MB): handover6 (branch
# wip/s36-handover6: the sixth hand-over through a count, with its testing library) and handover (branch
# wip/s35-handover, as call 1's). Carry [".whl", ".out/call1b.tar.xz"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
NQ_BASE=wip/s36-handover6 nq_build_missing handover6
NQ_BASE=wip/s35-handover nq_build_missing handover
NQ_PACK=.out/call1b.tar.xz nq_pack_variants handover6 handover handover6
