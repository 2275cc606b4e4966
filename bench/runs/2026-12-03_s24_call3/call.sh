#!/usr/bin/env bash
# Session 24 call 3: the split reduction's pushes as st.async (complete-tx on the owner's mbarrier; no MEMBAR.GPU
# after each push) = stasync; stasync2 = + the prologue's cluster barrier arrived at relaxed (after
# fence.mbarrier_init). Against qg (main 8993259) at 512 / 8K; the frag GEMV / attention / switch tests and racecheck
# / synccheck with stasync2.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # nq_ab, nq_quick_tests, nq_sanitize*: factored out after the run, same commands
mkdir -p nanoqwen_rt/lib build/lib; cp .v/stasync2/libnanoqwen.so nanoqwen_rt/lib/; cp .v/stasync2/libnanoqwen_testing.so build/lib/
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
ab() { for n in 512 8192; do for rep in 1 2; do vs="qg stasync stasync2"; [ $n = 512 ] || { vs="qg stasync2"; [ $rep = 1 ] || continue; }; for v in $vs; do
  nq_ab $v $n $rep; done; done; done; }
ab
nq_quick_tests
nq_sanitize "" "$(nq_sanitizer_model tiny)" racecheck synccheck
