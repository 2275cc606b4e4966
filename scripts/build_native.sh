#!/usr/bin/env bash
# Build libnanoqwen (csrc/) into nanoqwen_rt/lib/libnanoqwen.so and the kernel testing library into
# build/lib/libnanoqwen_testing.so (tests and benchmarks only) when nvcc and cmake are present.
# Without nvcc it prints one line and exits 0: the package then runs on the CPU backend only.
# Env: NANOQWEN_CUDA_ARCHS (default "90a;80"), NANOQWEN_BUILD_DIR (default build/csrc), JOBS (default nproc).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "[nanoqwen] nvcc not found: skipping the CUDA library (CPU backend only)" >&2
  exit 0
fi
if ! command -v cmake >/dev/null 2>&1; then
  echo "[nanoqwen] cmake not found: skipping the CUDA library (CPU backend only)" >&2
  exit 0
fi
build="${NANOQWEN_BUILD_DIR:-$root/build/csrc}"
archs="${NANOQWEN_CUDA_ARCHS:-90a;80}"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
mkdir -p "$build"
cmake -S "$root/csrc" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log" >&2; exit 1; }
cmake --build "$build" -j "$jobs" >"$build.build.log" 2>&1 || { grep -E "error|Error" "$build.build.log" >&2 || cat "$build.build.log" >&2; exit 1; }
install_lib() {  # $1 built file, $2 destination: copy to a temp name, then rename (never a partial library)
  mkdir -p "$(dirname "$2")"
  local tmp="$(dirname "$2")/.$(basename "$2").tmp.$$"
  cp "$1" "$tmp" && mv -f "$tmp" "$2"
}
install_lib "$build/libnanoqwen.so" "$root/nanoqwen_rt/lib/libnanoqwen.so"
install_lib "$build/libnanoqwen_testing.so" "$root/build/lib/libnanoqwen_testing.so"
echo "[nanoqwen] built nanoqwen_rt/lib/libnanoqwen.so and build/lib/libnanoqwen_testing.so (archs $archs)" >&2
