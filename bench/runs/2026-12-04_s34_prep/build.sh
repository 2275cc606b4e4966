#!/usr/bin/env bash
# Session 34 call 1's variants (NOTES "Session 34" §1), built here for sm_90a and packed into .out/variants.tar.xz:
# main34 = HEAD; nowait = HEAD without the decode kernels' PDL waits (timing only: garbage outputs); attnwait = HEAD
# whose decode attention and merge launches only hand over (wait, trigger, exit); b256 = the short-context cluster
# bound at 2,048 keys (D 128) instead of 3,072.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-04_s34_prep
nq_build_variant main34 0
nq_build_variant nowait 0 $P/nowait.patch
nq_build_variant attnwait 0 $P/attnwait.patch
nq_build_variant b256 0 $P/b256.patch
nq_pack_variants main34 main34 nowait attnwait b256
