#!/usr/bin/env bash
# session 22, call 3: the short-context graphs (this tree) against a017084 (.base): attention alone (each tree's own
# attn_bench and rule), the GPU suite, decode ab at 512 / 8K / 32K, sanitizers, the 7B bench with peers
set -u
X="$OUT/extra.txt"; : > "$X"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests"
python3 -c "import llguidance; print('llguidance', llguidance.__version__)" >> "$X" 2>&1
for tree in new base; do
  if [ $tree = new ]; then d=.; else d=.base; fi
  (cd $d && PYTHONPATH="/tmp/site:$PWD:$PWD/tests" timeout 60 python3 bench/attn_bench.py --contexts 65 577 1024 1100 2048 8192 32768 \
     --decode-kps 64) > "$OUT/attn_$tree.txt" 2>&1
  echo "attn_bench $tree rc=$?" >> "$X"
done
bash bench/gpu_check.sh tests,ab,sanitize
timeout 110 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda > "$OUT/bench_peers.txt" 2>&1; echo "peers rc=$?" >> "$X"
