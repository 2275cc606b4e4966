#!/usr/bin/env bash
# Session 29 call 7 (NOTES "Session 29" §4, a data point for the next session): s164 = cbc9f58's product library (the
# uniform split, 164 KB: 92 KB of L1), s196 = the same with a 196 KB split (60 KB of L1). All at 228 KB (28 KB of L1)
# lost 3.5 % (call 2): does the L1 left over bound the bytes in flight between 92 and 60 KB?
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in s164 s196; do nq_ab "$v" 512 "$rep"; done; done
for v in s164 s196; do nq_ab "$v" 8192 1; done
