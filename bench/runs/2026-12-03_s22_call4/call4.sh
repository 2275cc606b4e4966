#!/usr/bin/env bash
# session 22, call 4: (a) the decode GEMVs' PDL trigger after the dot (all GEMVs, or o only) against main, 7B at
# 512 x2; (b) the other sizes' decode (0.5B / 1.5B / 3B shapes), main against a017084
set -u
X="$OUT/extra.txt"; : > "$X"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests"
b() { NANOQWEN_LIB=$1 timeout 60 python3 -m nanoqwen_bench $2 --device cuda --no-peers --prompt-tokens 512 --new-tokens 64 \
      --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tr -s ' ' | tr '\n' ';'; }
timeout 90 python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1; echo "make 7B rc=$?" >> "$X"
for rep in 1 2; do for v in main tlate_o tlate_all; do echo "7B $v rep=$rep: $(b v2/$v/libnanoqwen.so /tmp/q7b.nanoqwen)" >> "$X"; done; done
rm -f /tmp/q7b.nanoqwen
for sz in 0.5B 1.5B 3B; do
  timeout 60 python3 bench/make_7b_file.py /tmp/q_$sz.nanoqwen --shape $sz --quiet > /dev/null 2>&1; echo "make $sz rc=$?" >> "$X"
  echo "$sz main: $(b v2/main/libnanoqwen.so /tmp/q_$sz.nanoqwen)" >> "$X"
  echo "$sz a017084: $(b .base/nanoqwen_rt/lib/libnanoqwen.so /tmp/q_$sz.nanoqwen)" >> "$X"
  rm -f /tmp/q_$sz.nanoqwen
done
