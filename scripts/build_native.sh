#!/usr/bin/env bash
# Build libnanoqwen (csrc/) into nanoqwen_rt/lib/libnanoqwen.so and the kernel testing library into
# build/lib/libnanoqwen_testing.so (tests and benchmarks only) when nvcc and cmake are present.
# Without nvcc it prints one line and exits 0: the package then runs on the CPU backend only.
# --if-gpu: build only when this machine has an NVIDIA GPU as well (the quick-start demo: a library that cannot run
# here is not worth its ~50 s compile). Tests and CI call it without the flag, so csrc/ compiles wherever nvcc is.
# Env: NANOQWEN_CUDA_ARCHS (default "90a;80"), NANOQWEN_BUILD_DIR (default build/csrc), JOBS (default nproc).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# An NVIDIA GPU is present when `nvidia-smi -L` lists one: it asks the driver (NVML), so a missing or broken driver
# and a machine with no GPU all answer "none". /dev/nvidia0 alone would be wrong both ways: a container handed only
# GPU 2 has /dev/nvidia2 and no /dev/nvidia0, and a device node can outlive a working driver. Containers given only
# the driver's "compute" capability have no nvidia-smi; there a /dev/nvidia<N> node is the evidence left.
gpu_present() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU '
  else
    compgen -G '/dev/nvidia[0-9]*' >/dev/null
  fi
}
case "${1:-}" in
  "") ;;
  --if-gpu)
    if ! gpu_present; then
      echo "[nanoqwen] no NVIDIA GPU here: skipping the CUDA library (CPU backend; scripts/build_native.sh builds it)" >&2
      exit 0
    fi ;;
  *) echo "build_native.sh: unknown argument '$1' (the only one is --if-gpu)" >&2; exit 2 ;;
esac
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
