#!/usr/bin/env bash
# session 22, call 1: the cluster merge tree (working tree) against main (.base): attention bench, suite, ab, sanitizers,
# chain_read R rows, the 7B bench with peers
set -u
X="$OUT/extra.txt"; : > "$X"
pip_ok() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1; }
pip_ok
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$X"
for tree in new base; do
  if [ $tree = new ]; then d=.; else d=.base; fi
  (cd $d && PYTHONPATH="/tmp/site:$PWD:$PWD/tests" timeout 60 python3 bench/attn_bench.py --contexts 65 577 1024 2048 8192 32768 \
     --decode-kps 64) > "$OUT/attn_$tree.txt" 2>&1
  echo "attn_bench $tree rc=$?" >> "$X"
done
bash bench/gpu_check.sh tests,ab,sanitize
cp /tmp/nq_logs/summary.txt "$OUT/summary_gc.txt" 2>/dev/null
timeout 60 build/dev/chain_read 28 3584 18944 28 4 128 > "$OUT/chain_read.txt" 2>&1; echo "chain_read rc=$?" >> "$X"
timeout 110 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda > "$OUT/bench_peers.txt" 2>&1; echo "peers rc=$?" >> "$X"
