#!/usr/bin/env bash
# The variants of session 34's prepared call 5 (calls 2 and 4 in one), built here for sm_90a where .v/NAME is missing
# (~2.5 minutes each on 2 cores) and packed into .out/variants.tar.xz
# (~35 MB; with .whl and the tracked tree the carry stays under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-04_s34_prep
build() { [ -f ".v/$1/libnanoqwen.so" ] || nq_build_variant "$1" 0 "${@:2}"; }
build main34
build nowait $P/nowait.patch
build b256 $P/b256.patch
for v in qkv o gu dn attn; do build nw_$v $P/nw_$v.patch; done
build l2a $P/l2side.patch
build l2b $P/l2side_before_qkv.patch
build l2c $P/l2side_3chunks.patch
build l2d $P/l2side_short.patch
nq_pack_variants l2a main34 nowait b256 nw_qkv nw_o nw_gu nw_dn nw_attn l2a l2b l2c l2d
