#!/usr/bin/env bash
# Session 27 call 2: why did call 1's pf0 (the L2-ahead mechanism, nothing warmed) cost +3.9 %? Its epilogue reads
# parameters (L2Ahead, at 0x328..0x378 of the constant bank) that nothing read before: a constant-cache miss after
# the dot. A/B at 512 (x2, alternated): base; pad (88 unused parameter bytes: the size alone); pf0; pf0t (pf0 with
# those parameters read before the PDL wait); touch (base with the parameters the staging and epilogue read, read
# before the PDL wait). Then touch's frag GEMV / attention / switch tests and racecheck, and 8K base / touch.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in base pad pf0 pf0t touch; do nq_ab "$v" 512 "$rep"; done; done
nq_use touch; nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "touch " "$m" racecheck
for rep in 1 2; do for v in base touch; do nq_ab "$v" 8192 "$rep"; done; done
