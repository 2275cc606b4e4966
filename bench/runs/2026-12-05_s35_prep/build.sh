#!/usr/bin/env bash
# The libraries of session 35's prepared calls, built here for sm_90a where .v/NAME is missing (~4 minutes each on 2
# cores, ~35 minutes for all eight from nothing: run it in the background) and packed:
# * .out/call2.tar.xz (6 MB) for bench/runs/2026-12-05_s35_call2/call.sh: planknob (HEAD + planknob.patch, with its
#   testing library for frag_bench.py); carry [".whl", ".out/call2.tar.xz"];
# * .out/call1.tar.xz (~22 MB) for bench/runs/2026-12-05_s35_call1/call.sh: handover (branch wip/s35-handover: the
#   decode hand-overs through counts, with its testing library), handover0 (HEAD + handover_counts.patch with no link
#   set: the same kernels), handover_last (HEAD + handover_last.patch: the first form, flags published by each grid's
#   last block), main34 (HEAD) and session 34's l2a / l2b / l2c; carry [".whl", ".out/call1.tar.xz"].
# handover_counts.patch / handover_last.patch are `git diff main <commit> -- csrc` of the branch's 7990fd0 / d2d9465.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-05_s35_prep
T=build/s35   # relative: nq_build_variant applies $PWD/PATCH
mkdir -p $T
sed 's|^+  return true;$|+  return false;   // handover0: the kernels carry the link code, no launch gets a link|' \
  $P/handover_counts.patch > $T/handover0.patch
cmp -s $P/handover_counts.patch $T/handover0.patch && { echo "handover0: the sed did not apply"; exit 1; }
[ -f .v/planknob/libnanoqwen.so ] || nq_build_variant planknob 0 $P/planknob.patch
if [ ! -f .v/handover/libnanoqwen.so ]; then   # the branch itself: its testing library has nq_test_decode_counts
  wt=/tmp/nq_variant_handover; rm -rf $wt; git worktree prune; git worktree add -q --detach $wt wip/s35-handover
  (cd $wt && NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR=$wt/build/csrc90 JOBS=2 bash scripts/build_native.sh)
  mkdir -p .v/handover && cp $wt/nanoqwen_rt/lib/libnanoqwen.so $wt/build/lib/libnanoqwen_testing.so .v/handover/
  echo "handover = $(git rev-parse --short wip/s35-handover) (branch wip/s35-handover) (sm_90a)" > .v/handover/SOURCE
  git worktree remove --force $wt
fi
[ -f .v/handover0/libnanoqwen.so ] || nq_build_variant handover0 0 $T/handover0.patch
[ -f .v/handover_last/libnanoqwen.so ] || nq_build_variant handover_last 0 $P/handover_last.patch
[ -f .v/main34/libnanoqwen.so ] || nq_build_variant main34 0
# session 34's side-branch L2 prefetch variants, as its build5.sh derives them (l2a: l2side.patch as it is; l2b:
# the fork before q/k/v; l2c: chunks 1-3)
L=bench/runs/2026-12-04_s34_prep
sed 's/constexpr bool kL2ForkBeforeQkv = false;/constexpr bool kL2ForkBeforeQkv = true;/' $L/l2side.patch > $T/l2b.patch
sed 's/kL2First = 1, kL2Chunks = 2,/kL2First = 1, kL2Chunks = 3,/' $L/l2side.patch > $T/l2c.patch
for v in b c; do cmp -s $L/l2side.patch $T/l2$v.patch && { echo "l2$v: the sed did not apply"; exit 1; }; done
[ -f .v/l2a/libnanoqwen.so ] || nq_build_variant l2a 0 $L/l2side.patch
[ -f .v/l2b/libnanoqwen.so ] || nq_build_variant l2b 0 $T/l2b.patch
[ -f .v/l2c/libnanoqwen.so ] || nq_build_variant l2c 0 $T/l2c.patch
NQ_PACK=.out/call2.tar.xz nq_pack_variants planknob planknob
NQ_PACK=.out/call1.tar.xz nq_pack_variants handover handover handover0 handover_last main34 l2a l2b l2c
