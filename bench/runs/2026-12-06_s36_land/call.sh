#!/usr/bin/env bash
# Landing branch wip/s35-handover (the decode hand-overs through counts), run only if call 1
# (bench/runs/2026-12-05_s35_call1/) has it passing its tests and faster than main34 and handover0: the GPU suite on
# the branch's tree (its count test, test_decode_hand_over_counts_add_up_every_step, among the e2e tests), the decode
# bench with peers, the long prompts, and the sanitizers on tiny-py, whose decode graphs hand over through counts
# (every layer's GEMVs in the fragment order). ~550-600 s (session 33's call 3 ran the same steps: tests 430 s).
# Here, first: `git merge wip/s35-handover` (the branch has main merged in); the libraries built from the
# branch (both archs; .v/land_handover/SOURCE names the commit) are packed in .out/land.tar.xz (7.7 MB, at their
# paths nanoqwen_rt/lib/ and build/lib/; the two unpacked and the tree would pass the 64 MiB a call carries). If the
# branch moved since, rebuild (`JOBS=2 bash scripts/build_native.sh`, ~10 minutes) and repack. Carry [".whl",
# ".out/land.tar.xz"]; command: `NQ_REV=<short commit> bash bench/runs/2026-12-06_s36_land/call.sh`. Record in
# bench/RESULTS.md with the peers.
set -uo pipefail
cd "$(dirname "$0")/../../.."
tar -xJf .out/land.tar.xz   # nanoqwen_rt/lib/libnanoqwen.so, build/lib/libnanoqwen_testing.so
NANOQWEN_COMMIT="${NQ_REV:-unknown}" bash bench/gpu_check.sh tests,bench,long,sanitize
