#!/usr/bin/env bash
# Session 42: what every size's kernels reach with no hand-over cost at all, on today's main. #15 asks the H200 for
# 60-80 % MBU; session 34 §1's nowait (every PDL wait removed: the kernels race, the output is garbage, timing only)
# reached 80.0-80.3 % on the 7B with session 34's plans, and no other size was measured that way. That bound is what
# any dependency mechanism (PDL, counts, a persistent grid) could at best reach with these kernels. Per size, at a
# 512-token prompt: main42 (= main's product, HEAD's csrc) and nowait42 (the same + session 34's bench/runs/2026-12-04_s34_prep/nowait.patch,
# applying unchanged), alternated x2; the 7B also with its peers (main's library) and at 8K. Most used first, so a
# short call still returns the 7B. Either GPU is useful (an H100's bound was measured only on the 7B too).
# Build here: `source bench/variants.sh && nq_build_variant main42 0 && nq_build_variant nowait42 0
# bench/runs/2026-12-04_s34_prep/nowait.patch && NQ_PACK=.out/ceiling42.tar.xz nq_pack_variants main42 main42 nowait42`;
# carry [".whl", ".out/ceiling42.tar.xz"] (and no other .out/*.tar.xz: the prelude unpacks every one).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
export NANOQWEN_COMMIT="${NQ_REV:-unknown}"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | sed 's/^/GPU: /' | tee -a "$OUT/summary.txt"
nq_stamp start
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
NANOQWEN_LIB="$PWD/.v/main42/libnanoqwen.so" timeout 90 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda 2>&1 |
  grep -E '^(read-only|TTFT|decode|bytes read|MBU|torch|cuBLAS|load)' | sed 's/^/7B peers: /' | tee -a "$OUT/summary.txt"
for rep in 1 2; do for v in main42 nowait42; do nq_ab "$v" 512 "$rep" /tmp/q7b.nanoqwen 7B; done; done
for v in main42 nowait42; do nq_left 200 && nq_ab "$v" 8192 1 /tmp/q7b.nanoqwen 7B; done
rm -f /tmp/q7b.nanoqwen
nq_stamp 7B
nq_ab_shape 14B 330 main42 nowait42 main42 nowait42
nq_stamp 14B
nq_ab_shape 3B 390 main42 nowait42 main42 nowait42
nq_ab_shape 1.5B 440 main42 nowait42 main42 nowait42
nq_ab_shape 0.5B 490 main42 nowait42 main42 nowait42
nq_stamp small
nq_ab_shape 32B 560 main42 nowait42
nq_stamp 32B
nq_ab_table main42
