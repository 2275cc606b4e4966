# Sourced after bench/variants.sh: nq_l2_patches OUTDIR writes the side-branch L2 prefetch's derived variants of
# l2side.patch (l2a is l2side.patch as it is: the fork after q/k/v, gate/up chunks 1-2) into OUTDIR: l2b (the fork
# before q/k/v), l2c (chunks 1-3), l2d (l2a in the short-context graphs only). NOTES "Session 34" §3.
nq_l2_patches() {
  local L=bench/runs/2026-12-04_s34_prep/l2side.patch
  nq_derive_patch $L 's/constexpr bool kL2ForkBeforeQkv = false;/constexpr bool kL2ForkBeforeQkv = true;/' "$1/l2b.patch" &&
  nq_derive_patch $L 's/kL2First = 1, kL2Chunks = 2,/kL2First = 1, kL2Chunks = 3,/' "$1/l2c.patch" &&
  nq_derive_patch $L 's|^+    if (!kL2ForkBeforeQkv) NQ_TRY(fork_l2_prefetch(s, L));|+    if (!kL2ForkBeforeQkv \&\& short_ctx) NQ_TRY(fork_l2_prefetch(s, L));   // l2d: short graphs only|' \
    "$1/l2d.patch"
}
