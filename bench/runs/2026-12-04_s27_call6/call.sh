#!/usr/bin/env bash
# Session 27 call 6 (measurements for the next session; nothing here lands): `final` (4b64ca5's csrc, sm_90a), `mall`
# (frag_dot_mma_all_groups.patch: the tensor-core dot for every group, each scale vector reloaded right after its
# use; g128's SWIGLU build loses its 8-byte spill, g32 / g64 still spill 24-72 bytes), `w8n` (session 26's 8-warp
# q/k/v and o plan on the new dot). mall's frag GEMV tests (every group through the tensor cores), the 7B decode A/B
# at 512 x2 (g128), and final / mall on a g64 7B file.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use mall
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 tests/test_gpu_frag_gemv.py 2>&1 | tail -2 | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in final mall w8n; do nq_ab "$v" 512 "$rep"; done; done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --group-size 64 --quiet > /dev/null 2>&1
for v in final mall; do echo "g64: $(nq_ab "$v" 512 1)" | tee -a "$OUT/summary.txt"; done
