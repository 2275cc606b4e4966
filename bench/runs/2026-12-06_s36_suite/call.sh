#!/usr/bin/env bash
# The GPU suite (tests, the decode bench with peers, long prompts, sanitizers) on libraries built here and carried
# packed, so no call builds on the device: main's (.v/NAME = main's product sources, sm_90a, built by variants.sh's
# nq_build_variant) or a branch's before it lands. Session 37: `tests` 176-222 s, `bench,long,sanitize` 179 s,
# `tests,bench,sanitize` 420 s; `sizes` (every size at 512, the small ones per kernel) ~200 s more.
# Here: `source bench/variants.sh && nq_pack_libs NAME .out/libs.tar.xz`; carry [".whl", ".out/libs.tar.xz"];
# command: `NQ_REV=<short commit> bash bench/runs/2026-12-06_s36_suite/call.sh [STEPS]` (default
# tests,bench,long,sanitize). Record in bench/RESULTS.md with the peers.
set -uo pipefail
cd "$(dirname "$0")/../../.."
tar -xJf .out/libs.tar.xz   # nanoqwen_rt/lib/libnanoqwen.so, build/lib/libnanoqwen_testing.so
NANOQWEN_COMMIT="${NQ_REV:-unknown}" bash bench/gpu_check.sh "${1:-tests,bench,long,sanitize}"
