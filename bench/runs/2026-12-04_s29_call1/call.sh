#!/usr/bin/env bash
# Session 29 call 1 (prepared in session 28; NOTES "Session 28" §5): a warp's odd chunks through a 4 KB shared-memory
# slot filled by one cp.async.bulk, its even ones through the register ring, so 2 chunks a warp are in flight at the
# registers of 1, chunk 1 issued before the PDL wait as well. slot = frag_slot.patch (q/k/v and gate/up: the 4-warp
# STORE and SWIGLU builds; SWIGLU at 96 registers spills 56 bytes, 6 values stored and loaded in its chunk loop;
# x's f32 parking moved to dynamic shared memory sized by K so that 5 SWIGLU blocks fit: 5 x 45,600 B of 228 KB);
# slotq = frag_slot_store_only.patch (q/k/v only); slot4 = frag_slot_swiglu4.patch (slot, SWIGLU at 4 blocks an SM:
# 127 registers, no stack, 528 slots for the 7B's 592 tiles); slotd = frag_slot_down.patch (slot, and the 8-warp
# builds too: the down projection, 127 registers, no stack, 2 blocks an SM with 50 KB each).
# Before the call, here: main's sm_90a build into .v/main28 and main + each patch into .v/<variant> (each:
# NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR=$PWD/build/csrc90 JOBS=2 bash scripts/build_native.sh in a git worktree,
# then copy nanoqwen_rt/lib/libnanoqwen.so and build/lib/libnanoqwen_testing.so), tar the five .v folders into
# .out/variants.tar.xz (xz -6: ~10 MB with one testing library), carry .out and .whl.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
m=$(nq_sanitizer_model tiny)
nq_use slot; nq_quick_tests; nq_sanitize "slot " "$m" racecheck synccheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main28 slot slotq slot4 slotd; do nq_ab "$v" 512 "$rep"; done; done
for v in main28 slot slotq slot4 slotd; do nq_ab "$v" 8192 1; done
