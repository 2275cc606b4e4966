#!/usr/bin/env bash
# Session 33 call 2's variants (sm_90a, this machine) into .v/<name>, packed into .out/variants.tar.xz with
# session 32's .v/prod (4c0c86f's kernels, the last-block merge):
#   mk    this branch's HEAD: the splits' merge in attn_merge_kernel (a block a query head) after the decode kernel
#   mknh  mk + no_hier.patch (no long-context graphs: the 7B's 33 plain splits and the merge kernel at every length)
#   mkcl  mk + cluster_low.patch (the short bound 128 x 128: clusters to 1,024 keys at D 128, the merge kernel past)
set -euo pipefail
cd "$(dirname "$0")/../../.."
P=bench/runs/2026-12-04_s33_call2
source bench/variants.sh
nq_build_variant mk 0
nq_build_variant mknh 0 "$P/no_hier.patch"
nq_build_variant mkcl 0 "$P/cluster_low.patch"
nq_pack_variants mk prod mk mknh mkcl
