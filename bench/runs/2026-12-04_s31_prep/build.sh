#!/usr/bin/env bash
# Session 31, prepared for the next session: build the variants of call.sh (sm_90a, this machine) into .v/<name>
# (product and testing libraries, a SOURCE line each) and pack them into .out/variants.tar.xz: main (this tree's
# HEAD), hier (+ hier_merge.patch), cl4x (+ cluster_bound_x4.patch). ~1 minute a variant on 2 cores. Run from the
# repository root: bash bench/runs/2026-12-04_s31_prep/build.sh; then carry [".whl", ".out"] and run call.sh.
set -euo pipefail
cd "$(dirname "$0")/../../.."
P=bench/runs/2026-12-04_s31_prep
head=$(git rev-parse --short HEAD)
build_one() {   # NAME [PATCH]
  local n=$1 wt=/tmp/nq_variant_$1
  rm -rf "$wt"; git worktree prune; git worktree add -q --detach "$wt" HEAD
  [ -z "${2:-}" ] || git -C "$wt" apply "$PWD/$2"
  (cd "$wt" && NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR="$wt/build/csrc90" JOBS=2 bash scripts/build_native.sh)
  mkdir -p ".v/$n"
  cp "$wt/nanoqwen_rt/lib/libnanoqwen.so" "$wt/build/lib/libnanoqwen_testing.so" ".v/$n/"
  echo "$n = $head${2:+ + $2} (sm_90a)" > ".v/$n/SOURCE"
  git worktree remove --force "$wt"
}
build_one main
build_one hier "$P/hier_merge.patch"
build_one cl4x "$P/cluster_bound_x4.patch"
mkdir -p .out
stage=$(mktemp -d)
mkdir -p "$stage/.v"
for n in main hier cl4x; do
  mkdir -p "$stage/.v/$n"; cp ".v/$n/libnanoqwen.so" ".v/$n/SOURCE" "$stage/.v/$n/"
done
cp .v/hier/libnanoqwen_testing.so "$stage/.v/hier/"   # the only variant whose tests run
(cd "$stage" && tar -cf - .v | xz -2 -T2 > "$OLDPWD/.out/variants.tar.xz")
rm -rf "$stage"
ls -la .out/variants.tar.xz
