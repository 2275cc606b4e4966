#!/usr/bin/env bash
# Session 25 call 1: attn2 = main a9e5bca + the attention CLUSTER build's merge by st.async (session 24 §6's patch)
# + the global (last-block) merge signalled by one acq_rel atomic of thread 0 instead of a __threadfence by every
# thread on both sides. Tests and racecheck / synccheck with attn2; attention alone (attn_bench) base vs attn2; 7B
# decode A/B at 512 and 8K, alternated.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # helpers factored out after the run, same commands
nq_attn_variant_call base attn2
