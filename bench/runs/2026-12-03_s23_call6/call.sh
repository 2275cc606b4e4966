#!/usr/bin/env bash
# Session 23 call 6: the exit cluster barrier (racecheck's rule for distributed shared memory): racecheck and synccheck,
# the frag GEMV tests, decode against c9fc004 (call 5's library, no exit barrier)
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # unpack .out/*.tar.xz, wheels, PYTHONPATH, OUT
python3 -c "
from nanoqwen_quant.convert import convert_checkpoint
convert_checkpoint('models/tiny-py', '/tmp/tiny-py.nanoqwen', quant='int4')" > /dev/null 2>&1
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1 &
for tool in racecheck synccheck; do
  timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 python3 bench/sanitize_tiny.py /tmp/tiny-py.nanoqwen > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | head -2 | tr '\n' ' ')" | tee -a "$OUT/res.txt"
done
timeout 45 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gpu_frag_gemv.py 2>&1 | tail -1 | tee -a "$OUT/res.txt"
wait
b() { python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --new-tokens 64 --repeats 2 2>&1 | grep -E '^decode' | tr -s ' '; }
echo "new: $(b)" | tee -a "$OUT/res.txt"; echo "c9fc004: $(NANOQWEN_LIB=$PWD/.v/c9/libnanoqwen.so b)" | tee -a "$OUT/res.txt"
