#!/usr/bin/env bash
# session 22, call 2: the cluster-merge variants (.v/<name>: kMaxDecodeCluster c, kClusterKeysPerBlock k) against main
# (.base): attention alone, chain_read's R rows, then the 7B decode at 512 / 8K-token prompts, trees alternated twice
set -u
X="$OUT/extra.txt"; : > "$X"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests"
V="c8k256 c8k128 c4k256 c4k128 c1k256"
for v in base $V; do
  if [ $v = base ]; then t=.base/build/lib/libnanoqwen_testing.so; else t=.v/$v/libnanoqwen_testing.so; fi
  NANOQWEN_TESTING_LIB=$t timeout 60 python3 bench/attn_bench.py --contexts 65 577 1024 2048 4096 8192 32768 \
    --decode-kps 64 > "$OUT/attn_$v.txt" 2>&1; echo "attn $v rc=$?" >> "$X"
done
timeout 90 build/dev/chain_read 28 3584 18944 28 4 128 > "$OUT/chain_read.txt" 2>&1; echo "chain_read rc=$?" >> "$X"
timeout 120 python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1; echo "make7b rc=$?" >> "$X"
for n in 512 8192; do
  for rep in 1 2; do
    for v in base c8k128 c4k128 c8k256 c4k256 c1k256; do
      if [ $v = base ]; then l=.base/nanoqwen_rt/lib/libnanoqwen.so; else l=.v/$v/libnanoqwen.so; fi
      r=$(NANOQWEN_LIB=$l timeout 100 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens $n \
          --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tr -s ' ' | tr '\n' ';')
      echo "ab $v n=$n rep=$rep: $r" >> "$X"
    done
  done
done
