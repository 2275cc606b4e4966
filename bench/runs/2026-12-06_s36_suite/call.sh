#!/usr/bin/env bash
# The GPU suite (tests, the decode bench with peers, long prompts, sanitizers; ~550-600 s: session 33's call 3 ran the
# same steps, tests 430 s) on libraries built here and carried packed, so no call builds on the device: main's
# (owed since 1cff141; .v/main34 = main's product sources, sm_90a) or a branch's before it lands (both archs, built
# with `JOBS=2 bash scripts/build_native.sh` in its checkout and copied into .v/NAME).
# Here: `source bench/variants.sh && nq_pack_libs NAME .out/libs.tar.xz`; carry [".whl", ".out/libs.tar.xz"];
# command: `NQ_REV=<short commit> bash bench/runs/2026-12-06_s36_suite/call.sh [STEPS]` (default
# tests,bench,long,sanitize; `tests` alone ~300 s). Record in bench/RESULTS.md with the peers.
set -uo pipefail
cd "$(dirname "$0")/../../.."
tar -xJf .out/libs.tar.xz   # nanoqwen_rt/lib/libnanoqwen.so, build/lib/libnanoqwen_testing.so
NANOQWEN_COMMIT="${NQ_REV:-unknown}" bash bench/gpu_check.sh "${1:-tests,bench,long,sanitize}"
