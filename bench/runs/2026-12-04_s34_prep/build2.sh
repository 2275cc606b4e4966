#!/usr/bin/env bash
# Session 34 call 2's variants (NOTES "Session 34" §2): HEAD with one kind of decode launch not waiting for the kernel
# before it (timing only: outputs are garbage): nw_qkv, nw_o, nw_gu (gate/up), nw_dn (down), nw_attn (the decode
# attention and merge). Packed with main34, nowait and b256 from build.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-04_s34_prep
for v in qkv o gu dn attn; do nq_build_variant nw_$v 0 $P/nw_$v.patch; done
nq_pack_variants main34 main34 nowait b256 nw_qkv nw_o nw_gu nw_dn nw_attn
