#!/usr/bin/env bash
# Session 32, prepared for the next session: build call.sh's variants (sm_90a, this machine) into .v/<name> (product
# library, a SOURCE line; hl128 also its testing library) and pack them into .out/variants.tar.xz:
#   prod    this tree's HEAD (4c0c86f's kernels: the hierarchical merge from 16,384 keys on the 7B)
#   hlow    + hier_low.patch (kAttnHierKeyDimsPerBlock 128 x 128: the 7B's long graph in clusters from 4,096 keys)
#   hl128   + hier_low.patch + attn_cluster128.patch (the attention's 8-warp cluster build at 128 registers, so that
#           one of its blocks fits beside two q/k/v blocks: 32 K + 2 x 16 K registers)
#   hl2     + hier_low.patch + hier_c2.patch (the long graph's clusters of 2 instead of 8: 2 free SMs of a GPC at once)
#   trprod  prod with the attention and GEMV traces (session 30 call 6's make_attn_trace.py, session 25's make_frag_trace.py)
#   trhlow  hlow with the same traces
# and csrc/dev/cluster_entry (packed into .out/dev.tar.xz). ~2 minutes a variant on 2 cores. Run from the repository root: bash bench/runs/2026-12-04_s32_prep/build.sh; then
# carry [".whl", ".out"] and run call.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
P=bench/runs/2026-12-04_s32_prep
source bench/variants.sh
nq_build_variant prod 0
nq_build_variant hlow 0 "$P/hier_low.patch"
nq_build_variant hl128 0 "$P/hier_low.patch" "$P/attn_cluster128.patch"
nq_build_variant hl2 0 "$P/hier_low.patch" "$P/hier_c2.patch"
nq_build_variant trprod 1
nq_build_variant trhlow 1 "$P/hier_low.patch"
nq_pack_variants hl128 prod hlow hl128 hl2 trprod trhlow
make -C csrc/dev "$PWD/build/dev/cluster_entry"   # the dev program call.sh runs first
tar -cf - build/dev/cluster_entry | xz -2 > .out/dev.tar.xz
