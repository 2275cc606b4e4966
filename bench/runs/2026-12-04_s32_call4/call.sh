#!/usr/bin/env bash
# Session 32 call 4: the GPU suite, the decode bench with peers, the long prompts and the sanitizers on the product
# tree (4c0c86f: the hierarchical merge for long contexts; both archs built here, the product library carried in
# nanoqwen_rt/lib, the testing one packed in .out/testing.tar.xz: 64 MiB carry); then racecheck / synccheck on the
# kernel test's hierarchical cases (17,500 and 33,000 keys: clusters of 8 and of 2).
set -uo pipefail
cd "$(dirname "$0")/../../.."
for f in .out/*.tar.xz; do tar -xJf "$f"; done
NANOQWEN_COMMIT=4c0c86f bash bench/gpu_check.sh tests,bench,long,sanitize
source bench/device_prelude.sh
for tool in racecheck synccheck; do
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_kernels.py -k "test_attention_vs_numpy and (17500 or 33000)" > "$OUT/san_hier_$tool.log" 2>&1
  echo "hier kernel test under $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/san_hier_$tool.log" | tail -2 | tr '\n' ' ')" \
    | tee -a "$OUT/summary_hier.txt"
done
