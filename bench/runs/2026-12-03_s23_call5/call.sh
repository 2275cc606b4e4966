#!/usr/bin/env bash
# Session 23 call 5: the product build (push epilogue, its mbarriers initialised before the PDL wait): the GPU suite,
# ab against main (.base) at 512 / 8K / 32K, sanitizers; then the call-4 variant library (push epilogue waiting on its
# init barrier after the dot) as a third arm, the bench with peers, and the 0.5B / 1.5B / 3B sizes against main
set -uo pipefail
cd "$(dirname "$0")/../../.."
tar -xJf .out/libs.tar.xz; tar -xJf .out/base.tar.xz; tar -xJf .out/exp.tar.xz
OUT="${OUT:-/tmp/nq_out}"; mkdir -p "$OUT"
bash bench/gpu_check.sh tests,ab,sanitize
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1
X="$OUT/extra.txt"
b() { python3 -m nanoqwen_bench "$@" --device cuda --no-peers --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tr -s ' ' | tr '\n' ';'; echo; }
for r in new exp new exp; do
  if [ $r = exp ]; then echo "exp 512: $(NANOQWEN_LIB=$PWD/.v/exp/libnanoqwen.so NQ_FRAG_PF=0,0,1 b /tmp/q7b.nanoqwen)" | tee -a "$X"
  else echo "new 512: $(b /tmp/q7b.nanoqwen)" | tee -a "$X"; fi
done
timeout 150 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda > "$OUT/bench_peers.txt" 2>&1
grep -E "decode|MBU|torch|cuBLAS|TTFT|load|ceiling|floor" "$OUT/bench_peers.txt" | head -20
for sz in 0.5B 1.5B 3B; do
  python3 bench/make_7b_file.py /tmp/q_$sz.nanoqwen --shape $sz --quiet > /dev/null 2>&1
  echo "$sz new: $(b /tmp/q_$sz.nanoqwen)" | tee -a "$X"
  echo "$sz base: $(cd .base && PYTHONPATH=/tmp/site:$PWD b /tmp/q_$sz.nanoqwen)" | tee -a "$X"
  rm -f /tmp/q_$sz.nanoqwen
done
