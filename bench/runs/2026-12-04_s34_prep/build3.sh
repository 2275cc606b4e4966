#!/usr/bin/env bash
# Session 34's prepared variants for the next session's first call (NOTES "Session 34" §3): the decode graphs with a
# side branch that bulk-prefetches each layer's first gate/up chunks into L2 while the attention chain runs.
# l2a = after q/k/v's launch, chunks 1-2 of every warp range (19.4 MB on the 7B); l2b = the fork before q/k/v (after
# the previous layer's down); l2c = after q/k/v, chunks 1-3 (29 MB); l2d = l2a in the short-context graphs only (up to
# 3,072 keys). main34 = HEAD without them. sm_90a.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-04_s34_prep
nq_build_variant main34 0
nq_build_variant l2a 0 $P/l2side.patch
nq_build_variant l2b 0 $P/l2side_before_qkv.patch
nq_build_variant l2c 0 $P/l2side_3chunks.patch
nq_build_variant l2d 0 $P/l2side_short.patch
nq_pack_variants l2a main34 l2a l2b l2c l2d
