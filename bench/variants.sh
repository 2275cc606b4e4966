# Sourced by a prepared call's build script (bench/runs/<date>_prep/build.sh), run from the repository root on this
# machine: builds variant libraries of the product for a device call's A/B and packs them for the carry.
# nq_build_variant NAME TRACE PATCH...: HEAD (or the commit $NQ_BASE names) + the patches (+ the attention and GEMV
# traces where TRACE is 1) in a scratch worktree, built for sm_90a, into .v/NAME (product and testing libraries, and
# a SOURCE line)
nq_build_variant() {
  local n=$1 trace=$2 wt=/tmp/nq_variant_$1 base=${NQ_BASE:-HEAD} p; shift 2
  rm -rf "$wt"; git worktree prune; git worktree add -q --detach "$wt" "$base"
  for p in "$@"; do git -C "$wt" apply "$PWD/$p"; done
  if [ "$trace" = 1 ]; then
    python3 bench/runs/2026-12-04_s30_call6/make_attn_trace.py "$wt/csrc/src/attention.cu"
    python3 bench/runs/2026-12-03_s25_prep/make_frag_trace.py "$wt/csrc/src"
  fi
  (cd "$wt" && NANOQWEN_CUDA_ARCHS=90a NANOQWEN_BUILD_DIR="$wt/build/csrc90" JOBS=2 bash scripts/build_native.sh)
  mkdir -p ".v/$n"
  cp "$wt/nanoqwen_rt/lib/libnanoqwen.so" "$wt/build/lib/libnanoqwen_testing.so" ".v/$n/"
  echo "$n = $(git rev-parse --short "$base")${*:+ + $*}$([ "$trace" = 1 ] && echo ' + traces') (sm_90a)" > ".v/$n/SOURCE"
  git worktree remove --force "$wt"
}
# nq_build_missing NAME PATCH...: nq_build_variant NAME 0 PATCH... where .v/NAME has no library yet
nq_build_missing() { [ -f ".v/$1/libnanoqwen.so" ] || nq_build_variant "$1" 0 "${@:2}"; }
# nq_derive_patch SRC SED OUT: OUT = SRC through the sed expression SED (a variant one constant or condition away from
# another); fails where the expression changed nothing
nq_derive_patch() {
  mkdir -p "$(dirname "$3")"
  sed "$2" "$1" > "$3"
  if cmp -s "$1" "$3"; then echo "nq_derive_patch: '$2' changed nothing in $1" >&2; return 1; fi
}
# nq_pack_variants TESTED NAME...: the NAMEs' product libraries and SOURCE lines, and TESTED's testing library (the
# variant whose tests run), into .out/variants.tar.xz, or $NQ_PACK where set (bench/device_prelude.sh unpacks every
# .out/*.tar.xz on the device)
nq_pack_variants() {
  local tested=$1 n stage; shift
  stage=$(mktemp -d); mkdir -p "$stage/.v" .out
  for n in "$@"; do
    mkdir -p "$stage/.v/$n"; cp ".v/$n/libnanoqwen.so" ".v/$n/SOURCE" "$stage/.v/$n/"
  done
  cp ".v/$tested/libnanoqwen_testing.so" "$stage/.v/$tested/"
  (cd "$stage" && tar -cf - .v | xz -2 -T2) > "${NQ_PACK:-.out/variants.tar.xz}"
  rm -rf "$stage"
  ls -la "${NQ_PACK:-.out/variants.tar.xz}"
}
# nq_pack_libs NAME OUT: .v/NAME's product and testing libraries packed into OUT at the paths the tree loads them from
# (nanoqwen_rt/lib/, build/lib/), for a call that runs the suite on them (bench/runs/2026-12-06_s36_suite/)
nq_pack_libs() {
  local stage; stage=$(mktemp -d); mkdir -p "$stage/nanoqwen_rt/lib" "$stage/build/lib" "$(dirname "$2")"
  cp ".v/$1/libnanoqwen.so" "$stage/nanoqwen_rt/lib/" && cp ".v/$1/libnanoqwen_testing.so" "$stage/build/lib/" &&
    (cd "$stage" && tar -cf - nanoqwen_rt build | xz -2 -T2) > "$2"
  rm -rf "$stage"
  ls -la "$2"
}
