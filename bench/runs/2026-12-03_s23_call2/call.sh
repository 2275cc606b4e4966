#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/../../.."
tar -xJf .out/libs.tar.xz
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nq_out}"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --new-tokens 64 --repeats 2 2>&1 | grep -E '^decode'
python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 2>&1 | tee "$OUT/trace_7b.txt"
cp /tmp/frag_trace.bin "$OUT/" 2>/dev/null
