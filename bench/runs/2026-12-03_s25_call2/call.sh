#!/usr/bin/env bash
# Session 25 call 2: the GPU suite on 8b77812 (the attention merges of call 1), the 7B bench with peers, 2K / 8K / 32K
# prompts and the sanitizers; then frag_bench --gemv-waves (gate/up and down at tile counts around 7B's).
set -uo pipefail
cd "$(dirname "$0")/../../.."
NANOQWEN_COMMIT=8b77812 bash bench/gpu_check.sh tests,bench,long,sanitize
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests"
timeout 150 python3 bench/frag_bench.py --gemv-waves --iters 100 > "${OUT:-/tmp/nq_out}/waves.txt" 2>&1
echo "waves rc=$?"; cat "${OUT:-/tmp/nq_out}/waves.txt"
