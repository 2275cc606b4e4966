#!/usr/bin/env bash
# Session 24 call 3: the split reduction's pushes as st.async (complete-tx on the owner's mbarrier; no MEMBAR.GPU
# after each push) = stasync; stasync2 = + the prologue's cluster barrier arrived at relaxed (after
# fence.mbarrier_init). Against qg (main 8993259) at 512 / 8K; the frag GEMV / attention / switch tests and racecheck
# / synccheck with stasync2.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
mkdir -p nanoqwen_rt/lib build/lib; cp .v/stasync2/libnanoqwen.so nanoqwen_rt/lib/; cp .v/stasync2/libnanoqwen_testing.so build/lib/
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
ab() { for n in 512 8192; do for rep in 1 2; do vs="qg stasync stasync2"; [ $n = 512 ] || { vs="qg stasync2"; [ $rep = 1 ] || continue; }; for v in $vs; do
  r=$(NANOQWEN_LIB=$PWD/.v/$v/libnanoqwen.so timeout 120 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers \
      --prompt-tokens $n --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tr -s ' ' | tr '\n' ';')
  echo "ab $v $n rep$rep: $r" | tee -a "$OUT/summary.txt"; done; done; done; }
ab
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention or switch or frag" tests/test_gpu_kernels.py tests/test_gpu_e2e.py tests/test_gpu_frag_gemv.py 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
python3 -c "
import sys; sys.path.insert(0, 'tests')
from synth import make_checkpoint
from nanoqwen_quant.convert import convert_checkpoint
make_checkpoint('/tmp/san_hf', dtype='bf16', n_layers=2, hidden=128, intermediate=256, n_heads=2, n_kv_heads=1, vocab=384, seed=4)
convert_checkpoint('/tmp/san_hf', '/tmp/san.nanoqwen', quant='int4', group_size=64)" > /dev/null 2>&1
m=/tmp/san.nanoqwen
[ -f models/tiny-py/config.json ] && python3 -c "
from nanoqwen_quant.convert import convert_checkpoint
convert_checkpoint('models/tiny-py', '/tmp/tiny-py.nanoqwen', quant='int4')" > /dev/null 2>&1 && m=/tmp/tiny-py.nanoqwen
for tool in racecheck synccheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 bench/sanitize_tiny.py $m > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | head -2 | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
done
