#!/usr/bin/env bash
# Session 31, prepared for the next session (NOTES "Session 31" §5; not run): the hierarchical merge (hier =
# main + hier_merge.patch: a session's long decode graph also runs the attention in clusters, each cluster of C splits
# merges in distributed shared memory into one partial, and the last block merges the n_split / C partials globally:
# at 8K on the 7B 4 partials a head instead of 32; the decode split count a multiple of 8, 33 -> 32) and the cluster
# bound x4 on the 2-KV-head sizes (cl4x = main + cluster_bound_x4.patch). hier's attention / switch tests and e2e
# tests, racecheck / synccheck; decode A/B main / hier at 4,000, 8K x2, 32K and 512 (7B), 0.5B at 8K; main / cl4x
# on 0.5B at 8K and 16K, 1.5B and 3B at 8K. Build first (build.sh), carry [".whl", ".out"].
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_use hier
# the patch's kernel test case (7500, 512) lives in tests/: apply that part to this copy of the tree
git apply --include='tests/*' "$(dirname "$0")/hier_merge.patch" && echo "hier test case applied" | tee -a "$OUT/summary.txt"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention or switch or short_context" \
  tests/test_gpu_kernels.py tests/test_gpu_e2e.py 2>&1 | tail -2 | sed "s/^/hier /" | tee -a "$OUT/summary.txt"
m=$(nq_sanitizer_model tiny); nq_sanitize "hier " "$m" racecheck synccheck
# the hierarchical path itself under the sanitizers (tiny-py's decode stays under the short bound): the kernel test's
# (7500, 512) cases (16 splits, clusters of 8 where the GPU holds them) and (8200, 256) at n_kv 2 (clusters of 2)
for tool in racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_kernels.py -k "test_attention_vs_numpy and (7500 or 8200)" > "$OUT/san_hier_$tool.log" 2>&1
  echo "hier kernel test under $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/san_hier_$tool.log" | tail -2 | tr '\n' ' ')" \
    | tee -a "$OUT/summary.txt"
done
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
for rep in 1 2; do for v in main hier; do nq_ab "$v" 8192 "$rep"; done; done
for p in 4000 32000 512; do for v in main hier; do nq_ab "$v" "$p" 1; done; done
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for v in main hier cl4x; do nq_ab "$v" 8192 1 /tmp/s.nanoqwen 0.5B; done
for v in main cl4x; do nq_ab "$v" 16000 1 /tmp/s.nanoqwen 0.5B; done
for size in 1.5B 3B; do
  python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape $size --quiet > /dev/null 2>&1
  for v in main cl4x; do nq_ab "$v" 8192 1 /tmp/s.nanoqwen $size; done
done
