#!/usr/bin/env bash
# Session 30 call 5: the GPU suite, the decode bench with peers, the long prompts and the sanitizers on the final
# product tree (csrc as d9bb5a3, both archs built here and carried), then every size on its product library.
set -uo pipefail
cd "$(dirname "$0")/../../.."
NANOQWEN_COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo d9bb5a3)" bash bench/gpu_check.sh tests,bench,long,sanitize
source bench/device_prelude.sh
nq_sizes d9bb5a3
