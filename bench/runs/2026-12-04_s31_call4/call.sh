#!/usr/bin/env bash
# Session 31 call 4 (NOTES "Session 31" §3): the cluster bound on the sizes with 8 KV heads, whose global path has 16
# splits a head (the 7B 33, the small sizes 66) and so may cross over below the 7B's 3,072 keys: prod (fcb7b1b, the
# carried product library: clusters up to 3,072 keys at D 128) against mwf (the same merge, clusters up to 1,024),
# 14B after 2,000 (x2) and 3,000 tokens, 32B after 3,000.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
mkdir -p .v/prod && cp nanoqwen_rt/lib/libnanoqwen.so .v/prod/
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 14B --quiet > /dev/null 2>&1
for rep in 1 2; do for v in prod mwf; do nq_ab "$v" 2000 "$rep" /tmp/s.nanoqwen 14B; done; done
for v in prod mwf; do nq_ab "$v" 3000 1 /tmp/s.nanoqwen 14B; done
rm -f /tmp/s.nanoqwen
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 32B --quiet > /dev/null 2>&1
for v in prod mwf; do nq_ab "$v" 3000 1 /tmp/s.nanoqwen 32B; done
