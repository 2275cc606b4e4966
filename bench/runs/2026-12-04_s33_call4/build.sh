#!/usr/bin/env bash
# Session 33 call 4's variant: trmk = HEAD (3de48ba's kernels: the merge kernel) with the records of the decode
# attention (session 30's make_attn_trace.py), the merge kernel (session 30's make_merge_trace.py) and the decode GEMVs
# (session 25's make_frag_trace.py), sm_90a, into .v/trmk. (Call 4 ran a session-33 make_trace.py with the same points,
# commit 96b1b6f, since folded into those two scripts, which now take 3de48ba's kernel.) Packed with
# session 32's .v/trprod (4c0c86f with the same attention points and the last-block merge) into .out/variants.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
wt=/tmp/nq_variant_trmk
rm -rf "$wt"; git worktree prune; git worktree add -q --detach "$wt" HEAD
python3 bench/runs/2026-12-04_s30_call6/make_attn_trace.py "$wt/csrc/src/attention.cu"
python3 bench/runs/2026-12-04_s30_prep/make_merge_trace.py "$wt/csrc/src/attention.cu"
python3 bench/runs/2026-12-03_s25_prep/make_frag_trace.py "$wt/csrc/src"
(cd "$wt" && NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR="$wt/build/csrc90" JOBS=2 bash scripts/build_native.sh)
mkdir -p .v/trmk
cp "$wt/nanoqwen_rt/lib/libnanoqwen.so" "$wt/build/lib/libnanoqwen_testing.so" .v/trmk/
echo "trmk = $(git rev-parse --short HEAD) + make_attn_trace.py + make_merge_trace.py + make_frag_trace.py (sm_90a)" > .v/trmk/SOURCE
git worktree remove --force "$wt"
nq_pack_variants trmk trmk trprod
