#!/usr/bin/env bash
# Prepared in session 27 (not run): the tensor-core dot with (a) the word shifts as IMAD.HI (mul.hi.u32 by 2^24: the
# FMA pipe) instead of SHF (the integer pipe, which issues LOP3 / SHF at half rate: 164 a chunk = ~328 pipe cycles
# against 296 issue slots; now ~136 = ~272), and (b) the chunk's scale vector consumed after the loop and the next
# chunk's loaded into the same registers there (call 6's reload order: the SWIGLU g128 build's 8-byte spill goes;
# 94 registers). frag_dot_imad_reload.patch; NOTES "Session 27" §5.
# Before the call, here: main's sm_90a build into .v/base and main + the patch into .v/imad (each:
# NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR=$PWD/build/csrc90 JOBS=2 bash scripts/build_native.sh, then copy
# nanoqwen_rt/lib/libnanoqwen.so and build/lib/libnanoqwen_testing.so; restore the product build after),
# `tar -cf - .v/base .v/imad | xz -T2 -4 > .out/variants.tar.xz`, carry .out and .whl.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
m=$(nq_sanitizer_model tiny)
nq_use imad; nq_quick_tests; nq_sanitize "imad " "$m" racecheck synccheck
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in base imad; do nq_ab "$v" 512 "$rep"; done; done
for v in base imad; do nq_ab "$v" 8192 1; done
