#!/usr/bin/env bash
# Session 27 call 5 (.out/variants.tar.xz: main's base and the final sm_90a build of 4b64ca5's csrc, which is
# the product and testing library here: the both-arch build does not fit the 64 MiB carry beside them): the sampler tests (test_sampler_edge_rows failed once in call 4 on a tie at the maximum; the
# test now makes the maximum unique); the 7B decode A/B at 512 x2, base (52eeaaf's csrc: main before this session) against final (4b64ca5);
# the 7B-shaped model against transformers (gpu_check hf7b); every size's decode (512-token prompt, 64 tokens x 2).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use final
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_kernels.py -k sampler 2>&1 | tail -2 | tee -a "$OUT/summary.txt"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in base final; do nq_ab "$v" 512 "$rep"; done; done
rm -f /tmp/q7b.nanoqwen
NANOQWEN_COMMIT=7c5a296 OUT="$OUT/hf7b" bash bench/gpu_check.sh hf7b | tail -2 | tee -a "$OUT/summary.txt"
nq_sizes 7c5a296
