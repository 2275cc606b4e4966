#!/usr/bin/env bash
# Prepared in session 26 (not run): (a) the decode GEMV's split pushes as 16 / 32 vector st.async a block instead of
# 64 scalar ones (frag_push_vec.patch here; NOTES "Session 26" §5); (b) 8-warp blocks for q/k/v and o
# (frag_plan_w8.patch; §6). Before the call, here: main's 90a build into .v/base, main + each patch into .v/push4 and
# .v/w8 (each: NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR=$PWD/build/csrc90 JOBS=2 bash scripts/build_native.sh, then
# copy nanoqwen_rt/lib/libnanoqwen.so and build/lib/libnanoqwen_testing.so; restore the product build after),
# `tar -cJf .out/variants.tar.xz .v/base .v/push4 .v/w8`, carry .out and .whl.
# Runs: frag GEMV / attention / switch tests and racecheck / synccheck with push4 and w8; the 7B decode A/B at 512 x2
# and 8K.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
m=$(nq_sanitizer_model tiny)
for v in push4 w8; do nq_use "$v"; nq_quick_tests; nq_sanitize "$v " "$m" racecheck synccheck; done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in base push4 w8; do nq_ab "$v" 512 "$rep"; done; done
for v in base push4 w8; do nq_ab "$v" 8192 1; done
