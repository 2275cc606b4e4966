#!/usr/bin/env bash
# Session 32, prepared for the next session: build call.sh's variants (sm_90a, this machine) into .v/<name> (product
# library, a SOURCE line; hl128 also its testing library) and pack them into .out/variants.tar.xz:
#   prod    this tree's HEAD (4c0c86f's kernels: the hierarchical merge from 16,384 keys on the 7B)
#   hlow    + hier_low.patch (kAttnHierKeyDimsPerBlock 128 x 128: the 7B's long graph in clusters from 4,096 keys)
#   hl128   + hier_low.patch + attn_cluster128.patch (the attention's 8-warp cluster build at 128 registers, so that
#           one of its blocks fits beside two q/k/v blocks: 32 K + 2 x 16 K registers)
#   hl2     + hier_low.patch + hier_c2.patch (the long graph's clusters of 2 instead of 8: 2 free SMs of a GPC at once)
#   trprod  prod with the attention and GEMV traces (session 30 call 6's make_attn_trace.py, session 25's make_frag_trace.py)
#   trhlow  hlow with the same traces
# ~2 minutes a variant on 2 cores. Run from the repository root: bash bench/runs/2026-12-04_s32_prep/build.sh; then
# carry [".whl", ".out"] and run call.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
P=bench/runs/2026-12-04_s32_prep
head=$(git rev-parse --short HEAD)
build_one() {   # NAME TRACE(0/1) [PATCH...]
  local n=$1 trace=$2 wt=/tmp/nq_variant_$1; shift 2
  rm -rf "$wt"; git worktree prune; git worktree add -q --detach "$wt" HEAD
  for p in "$@"; do git -C "$wt" apply "$PWD/$p"; done
  if [ "$trace" = 1 ]; then
    python3 bench/runs/2026-12-04_s30_call6/make_attn_trace.py "$wt/csrc/src/attention.cu"
    python3 bench/runs/2026-12-03_s25_prep/make_frag_trace.py "$wt/csrc/src"
  fi
  (cd "$wt" && NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR="$wt/build/csrc90" JOBS=2 bash scripts/build_native.sh)
  mkdir -p ".v/$n"
  cp "$wt/nanoqwen_rt/lib/libnanoqwen.so" "$wt/build/lib/libnanoqwen_testing.so" ".v/$n/"
  echo "$n = $head${*:+ + $*}$([ "$trace" = 1 ] && echo ' + traces') (sm_90a)" > ".v/$n/SOURCE"
  git worktree remove --force "$wt"
}
build_one prod 0
build_one hlow 0 "$P/hier_low.patch"
build_one hl128 0 "$P/hier_low.patch" "$P/attn_cluster128.patch"
build_one hl2 0 "$P/hier_low.patch" "$P/hier_c2.patch"
build_one trprod 1
build_one trhlow 1 "$P/hier_low.patch"
mkdir -p .out
stage=$(mktemp -d)
mkdir -p "$stage/.v"
for n in prod hlow hl128 hl2 trprod trhlow; do
  mkdir -p "$stage/.v/$n"; cp ".v/$n/libnanoqwen.so" ".v/$n/SOURCE" "$stage/.v/$n/"
done
cp .v/hl128/libnanoqwen_testing.so "$stage/.v/hl128/"   # the only variant whose tests run
(cd "$stage" && tar -cf - .v | xz -2 -T2 > "$OLDPWD/.out/variants.tar.xz")
rm -rf "$stage"
ls -la .out/variants.tar.xz
