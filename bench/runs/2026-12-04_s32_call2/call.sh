#!/usr/bin/env bash
# Session 32 call 2 (NOTES "Session 32" §2): why the hierarchical merge (hier, session 31's prepared patch) lost 5 %
# at 8K and won 1.2 % at 32K (call 1). hierg = hier whose kernel merges hierarchically only from 16,384 keys (below:
# the cluster launch with every block's partial merged globally, as main): at 8K it separates the cluster launch (and
# the 33 -> 32 splits) from the merge stage. hier4 = hier with clusters of 4 in the long graph (8 partials a head at
# 8K). hierg's attention tests with a (17000, 1152) case (hierarchical in clusters of 8 / 2), racecheck / synccheck
# on the hierarchical cases; decode A/B main / hier / hierg / hier4 at 8K x2, 16K, 32K x2 (main, hierg), 512.
# Build the variants here first (.v/<name>, packed into .out/variants.tar.xz), carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use hierg
git apply --include='tests/*' "$(dirname "$0")/hierg.patch" && echo "hierg test cases applied" | tee -a "$OUT/summary.txt"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention or switch or short_context" \
  tests/test_gpu_kernels.py tests/test_gpu_e2e.py 2>&1 | tail -2 | sed "s/^/hierg /" | tee -a "$OUT/summary.txt"
for tool in racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_kernels.py -k "test_attention_vs_numpy and (17000 or 8200)" > "$OUT/san_hierg_$tool.log" 2>&1
  echo "hierg kernel test under $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/san_hierg_$tool.log" | tail -2 | tr '\n' ' ')" \
    | tee -a "$OUT/summary.txt"
done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main hier hierg hier4; do nq_ab "$v" 8192 "$rep"; done; done
for v in main hier hierg hier4; do nq_ab "$v" 16384 1; done
for v in main hierg hier4 hier; do nq_ab "$v" 32000 1; done
for v in main hierg; do nq_ab "$v" 32000 2; done
for v in main hierg; do nq_ab "$v" 512 1; done
