#!/usr/bin/env bash
# The variants of session 34's prepared call 5 (calls 2 and 4 in one), built here for sm_90a where .v/NAME is missing
# (~2 minutes each on 2 cores, ~30 minutes for all 15 from nothing: run it in the background) and packed into
# .out/variants.tar.xz (~40 MB; with .whl and the tracked tree the carry is ~64.5 MB, under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-04_s34_prep
build() { [ -f ".v/$1/libnanoqwen.so" ] || nq_build_variant "$1" 0 "${@:2}"; }
build main34
build nowait $P/nowait.patch
build b256 $P/b256.patch
for v in qkv o gu dn attn; do build nw_$v $P/nw_$v.patch; done
# l2a = l2side.patch as it is (fork after q/k/v, chunks 1-2); l2b, l2c, l2d: one constant or condition changed
T=build/s34_derived_patches   # relative: nq_build_variant applies $PWD/PATCH
mkdir -p $T
sed 's/constexpr bool kL2ForkBeforeQkv = false;/constexpr bool kL2ForkBeforeQkv = true;/' $P/l2side.patch > $T/l2b.patch
sed 's/kL2First = 1, kL2Chunks = 2,/kL2First = 1, kL2Chunks = 3,/' $P/l2side.patch > $T/l2c.patch
sed 's|^+    if (!kL2ForkBeforeQkv) NQ_TRY(fork_l2_prefetch(s, L));|+    if (!kL2ForkBeforeQkv \&\& short_ctx) NQ_TRY(fork_l2_prefetch(s, L));   // l2d: short graphs only|' \
  $P/l2side.patch > $T/l2d.patch
for v in b c d; do cmp -s $P/l2side.patch $T/l2$v.patch && { echo "l2$v: the sed did not apply"; exit 1; }; done
build l2a $P/l2side.patch
build l2b $T/l2b.patch
build l2c $T/l2c.patch
build l2d $T/l2d.patch
build fw $P/flagwait.patch
# fw0: fw's kernels with no counter ever set (every GEMV takes its PDL wait): what the code change alone costs
sed 's/^+  const bool flags = L.o.order == ORDER_FRAG/+  const bool flags = false \&\& L.o.order == ORDER_FRAG/' $P/flagwait.patch > $T/fw0.patch
cmp -s $P/flagwait.patch $T/fw0.patch && { echo "fw0: the sed did not apply"; exit 1; }
build fw0 $T/fw0.patch
nq_pack_variants l2a main34 nowait b256 nw_qkv nw_o nw_gu nw_dn nw_attn l2a l2b l2c l2d fw fw0
