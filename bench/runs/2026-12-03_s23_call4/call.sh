#!/usr/bin/env bash
# Session 23 call 4: NQ_FRAG_PF="0,norm,epi" (norm 3: the split's norm weights into L1 after the PDL wait; epi 1: the
# push epilogue), kernel tests under the push epilogue, decode against main (.base), traces
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # unpack .out/*.tar.xz, wheels, PYTHONPATH, OUT
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1 &
mk=$!
NQ_FRAG_PF=0,3,1 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -x tests/test_gpu_frag_gemv.py \
  tests/test_gpu_sizes.py 2>&1 | tail -2 | tee "$OUT/tests.txt"
wait $mk
ab() {  # $1 variant or base, $2 prompt
  if [ $1 != base ]; then NQ_FRAG_PF=$1 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens $2 --new-tokens 64 --repeats 2
  else (cd .base && PYTHONPATH="/tmp/site:$PWD" python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens $2 --new-tokens 64 --repeats 2); fi 2>&1 | grep -E '^decode' | sed "s/^/$1 $2: /" | tee -a "$OUT/ab.txt"
}
for r in base 0,0,0 0,3,0 0,0,1 0,3,1 base 0,0,0 0,3,0 0,0,1 0,3,1; do ab $r 512; done
for v in 0,0,0 0,3,1; do
  NQ_FRAG_PF=$v python3 bench/runs/2026-12-03_s23_call2/trace.py /tmp/q7b.nanoqwen 512 > "$OUT/trace_$v.txt" 2>&1
done
grep -E "^(add|swiglu|store)|stage \(mean|epilogue|cluster ready|partials read|span" "$OUT"/trace_*.txt
