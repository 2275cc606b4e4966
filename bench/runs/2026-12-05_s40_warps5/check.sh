#!/usr/bin/env bash
# Session 40's short check of branch wip/s40-warps5 (gate/up's 5-warp blocks; bench/NOTES.md "Session 40" §2), for
# a device budget too small for the suite (~230 s of tests + sanitize): the fragment-order GEMV tests (every decode
# GEMV shape and plan, the 14B-gate's 5-warp build at groups 64-256 among them), the 14B-shaped model's greedy
# tokens against the CPU oracle (the one size whose gate/up takes 5 warps), and the three
# sanitizers on the changed kernel alone (the 14B-gate SwiGLU cases; the suite's tiny-py sanitizer model never takes
# 5 warps). carry [".whl", ".out/libs.tar.xz"] (land40 = the branch, sm_90a).
set -uo pipefail
cd "$(dirname "$0")/../../.."
tar -xJf .out/libs.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
py() { python3 -m pytest -q -m gpu -p no:cacheprovider "$@"; }
timeout 150 py -n 8 tests/test_gpu_frag_gemv.py > "$OUT/frag_gemv.log" 2>&1
echo "test_gpu_frag_gemv rc=$?: $(tail -1 "$OUT/frag_gemv.log")"
timeout 90 py -k 14B tests/test_gpu_sizes.py > "$OUT/sizes.log" 2>&1   # the 14B's shapes, greedy vs the CPU oracle
echo "test_gpu_sizes[14B] rc=$?: $(tail -1 "$OUT/sizes.log")"
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool python3 -m pytest -q -m gpu -p no:cacheprovider \
    -k "swiglu and 14B-gate and not -32]" tests/test_gpu_frag_gemv.py > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1); $(grep -E 'passed|failed' "$OUT/san_$tool.log" | tail -1)"
done
