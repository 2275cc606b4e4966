#!/usr/bin/env bash
# Session 25 call 5: obuf = 8b77812 + the decode attention's warp-merge buffer padded (rows D + 8 floats) and written
# as float2 (call 4's trace: the block merge 1.47 us; its scalar stores were 8-way bank conflicts). Tests and
# racecheck / synccheck with obuf; attn_bench attn2 (8b77812) vs obuf; 7B decode A/B at 512 and 8K, alternated.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # helpers factored out after the run, same commands
nq_attn_variant_call attn2 obuf
