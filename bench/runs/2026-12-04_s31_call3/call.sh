#!/usr/bin/env bash
# Session 31 call 3: the GPU suite, the decode bench with peers, the long prompts and the sanitizers on the product
# tree (csrc as fcb7b1b, both archs built here and carried); then the new cluster bound against the global merge
# where only the bound differs (prod = the carried product library; mwf = fcb7b1b's merge with session 30's bound of
# 1,024 keys, sm_90a, from .out/variants.tar.xz): 7B after 3,000 tokens (prod: clusters up to 3,072 keys), 0.5B
# after 6,000 (prod: clusters up to 6,144 at D = 64), 1.5B after 3,000 (2 KV heads, D = 128).
set -uo pipefail
cd "$(dirname "$0")/../../.."
for f in .out/*.tar.xz; do tar -xJf "$f"; done   # the testing library (build/lib, packed: 64 MiB carry) and mwf
NANOQWEN_COMMIT=fcb7b1b bash bench/gpu_check.sh tests,bench,long,sanitize
source bench/device_prelude.sh
mkdir -p .v/prod && cp nanoqwen_rt/lib/libnanoqwen.so .v/prod/
[ -f /tmp/q7b.nanoqwen ] || python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for v in prod mwf; do nq_ab "$v" 3000 1; done
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for v in prod mwf; do nq_ab "$v" 6000 1 /tmp/s.nanoqwen 0.5B; done
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 1.5B --quiet > /dev/null 2>&1
for v in prod mwf; do nq_ab "$v" 3000 1 /tmp/s.nanoqwen 1.5B; done
