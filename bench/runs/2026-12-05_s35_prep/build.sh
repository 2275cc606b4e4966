#!/usr/bin/env bash
# The libraries of session 35's prepared calls, built here for sm_90a where .v/NAME is missing (~3 minutes each on 2
# cores) and packed:
# * .out/call2.tar.xz (6 MB) for bench/runs/2026-12-05_s35_call2/call.sh: planknob (HEAD + planknob.patch, with its
#   testing library for frag_bench.py); carry [".whl", ".out/call2.tar.xz"];
# * .out/call1.tar.xz (~20 MB) for bench/runs/2026-12-05_s35_call1/call.sh: chainflag (branch wip/s35-handover, with
#   its testing library), chainflag0 (the same kernels, no flag ever set), chainflag_s256 (polls 8x less often), main34 (HEAD) and session 34's l2a / l2b /
#   l2c (bench/runs/2026-12-04_s34_prep/build5.sh builds them; derived from l2side.patch); carry [".whl",
#   ".out/call1.tar.xz"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-05_s35_prep
T=build/s35   # relative: nq_build_variant applies $PWD/PATCH
mkdir -p $T
sed 's|^+  return true;$|+  return false;   // chainflag0: the kernels carry the flag code, no launch sets a flag|' \
  $P/chainflag.patch > $T/chainflag0.patch
cmp -s $P/chainflag.patch $T/chainflag0.patch && { echo "chainflag0: the sed did not apply"; exit 1; }
[ -f .v/planknob/libnanoqwen.so ] || nq_build_variant planknob 0 $P/planknob.patch
# chainflag: the build of branch wip/s35-handover (its kernels are chainflag.patch's; its testing library has
# nq_test_decode_flags, which call 1 tests through handover_tests.patch)
if [ ! -f .v/chainflag/libnanoqwen.so ]; then
  wt=/tmp/nq_variant_chainflag; rm -rf $wt; git worktree prune; git worktree add -q --detach $wt wip/s35-handover
  (cd $wt && NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR=$wt/build/csrc90 JOBS=2 bash scripts/build_native.sh)
  mkdir -p .v/chainflag && cp $wt/nanoqwen_rt/lib/libnanoqwen.so $wt/build/lib/libnanoqwen_testing.so .v/chainflag/
  echo "chainflag = $(git rev-parse --short wip/s35-handover) (branch wip/s35-handover) (sm_90a)" > .v/chainflag/SOURCE
  git worktree remove --force $wt
fi
[ -f .v/chainflag0/libnanoqwen.so ] || nq_build_variant chainflag0 0 $T/chainflag0.patch
# chainflag_s256: the waiters poll 8x less often (__nanosleep(256) between polls): whether the polls' traffic on one
# L2 line (~900 loads a µs while gate/up waits on o) costs the producer
sed 's/__nanosleep(32);/__nanosleep(256);/' $P/chainflag.patch > $T/chainflag_s256.patch
cmp -s $P/chainflag.patch $T/chainflag_s256.patch && { echo "chainflag_s256: the sed did not apply"; exit 1; }
[ -f .v/chainflag_s256/libnanoqwen.so ] || nq_build_variant chainflag_s256 0 $T/chainflag_s256.patch
[ -f .v/main34/libnanoqwen.so ] || nq_build_variant main34 0
NQ_PACK=.out/call2.tar.xz nq_pack_variants planknob planknob
for v in l2a l2b l2c; do [ -f .v/$v/libnanoqwen.so ] || { echo "build .v/$v first: bench/runs/2026-12-04_s34_prep/build5.sh"; exit 1; }; done
NQ_PACK=.out/call1.tar.xz nq_pack_variants chainflag chainflag chainflag0 chainflag_s256 main34 l2a l2b l2c
