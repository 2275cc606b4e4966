#!/usr/bin/env bash
# Session 23 call 3: the GEMV epilogue / norm staging change: kernel tests, the trace, decode against main (.base)
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # unpack .out/*.tar.xz, wheels, PYTHONPATH, OUT
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1 &
mk=$!
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -x tests/test_gpu_frag_gemv.py tests/test_gpu_sizes.py \
  tests/test_gpu_kernels.py -k "not 7b_shaped" 2>&1 | tail -5 | tee "$OUT/tests.txt"
wait $mk
python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 2>&1 | tee "$OUT/trace_7b.txt"
ab() {  # $1 new|base, $2 prompt
  if [ $1 = new ]; then python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens $2 --new-tokens 64 --repeats 2
  else (cd .base && PYTHONPATH="/tmp/site:$PWD" python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens $2 --new-tokens 64 --repeats 2); fi 2>&1 | grep -E '^decode' | sed "s/^/$1 $2: /" | tee -a "$OUT/ab.txt"
}
for n in 512 8192; do for r in new base new base; do ab $r $n; done; done
