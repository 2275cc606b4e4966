#!/usr/bin/env bash
# The variants of session 34's prepared call 5 (calls 2 and 4 in one), built here for sm_90a where .v/NAME is missing
# (~2 minutes each on 2 cores, ~30 minutes for all 15 from nothing: run it in the background) and packed into
# .out/variants.tar.xz (~40 MB; with .whl and the tracked tree the carry is ~64.5 MB, under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
source bench/runs/2026-12-04_s34_prep/l2_patches.sh
P=bench/runs/2026-12-04_s34_prep
nq_build_missing main34
nq_build_missing nowait $P/nowait.patch
nq_build_missing b256 $P/b256.patch
for v in qkv o gu dn attn; do nq_build_missing nw_$v $P/nw_$v.patch; done
T=build/s34_derived_patches   # relative: nq_build_variant applies $PWD/PATCH
nq_l2_patches $T
nq_build_missing l2a $P/l2side.patch
nq_build_missing l2b $T/l2b.patch
nq_build_missing l2c $T/l2c.patch
nq_build_missing l2d $T/l2d.patch
nq_build_missing fw $P/flagwait.patch
# fw0: fw's kernels with no counter ever set (every GEMV takes its PDL wait): what the code change alone costs
nq_derive_patch $P/flagwait.patch 's/^+  const bool flags = L.o.order == ORDER_FRAG/+  const bool flags = false \&\& L.o.order == ORDER_FRAG/' \
  $T/fw0.patch
nq_build_missing fw0 $T/fw0.patch
nq_pack_variants l2a main34 nowait b256 nw_qkv nw_o nw_gu nw_dn nw_attn l2a l2b l2c l2d fw fw0
