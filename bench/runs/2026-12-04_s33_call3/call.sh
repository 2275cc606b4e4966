#!/usr/bin/env bash
# Session 33 call 3: the GPU suite, the decode bench with peers, the long prompts and the sanitizers on the product
# tree (3de48ba: the splits' merge in attn_merge_kernel, no hierarchical merge; both archs built here, the product
# library carried in nanoqwen_rt/lib, the testing one packed in .out/testing.tar.xz); then memcheck / racecheck on the
# kernel tests' many-split cases and the few-token split prefill (the merge kernel over 31-34 partials, M up to 16).
set -uo pipefail
cd "$(dirname "$0")/../../.."
for f in .out/*.tar.xz; do tar -xJf "$f"; done
NANOQWEN_COMMIT=3de48ba bash bench/gpu_check.sh tests,bench,long,sanitize
source bench/device_prelude.sh
nq_sanitize_tests merge "(test_attention_vs_numpy and (17500 or 33000)) or test_attention_prefill_split" memcheck racecheck
