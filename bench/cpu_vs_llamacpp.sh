#!/usr/bin/env bash
# CPU speed of nanoqwen's CPU backend against llama.cpp's CPU build, same machine, same cores, same 0.5B shapes,
# 4-bit both (ours INT4 g128 round-to-nearest, llama.cpp Q4_0), run in turn (ours, llama.cpp, ours, ...) so that both
# see the same machine load; figures in bench/RESULTS.md, method and history in bench/NOTES.md.
#
#   bash bench/cpu_vs_llamacpp.sh [WORK_DIR] [PAIRS]      # WORK_DIR default /work/llamacpp, PAIRS default 5
#
# Steps (each skipped when its output exists, so a rerun only measures):
#  1. llama.cpp: the llama-cpp-python sdist from the package index (`pip download --no-binary :all: --no-deps
#     llama-cpp-python`; 0.3.36 when measured), unpacked; its vendor/llama.cpp is built for this CPU
#     (-DGGML_NATIVE=ON, Release, CPU backend only, static) and only llama-bench, llama-quantize and llama-simple are
#     built (llama-cli drags in the whole server). Everything lives under WORK_DIR, outside the repository.
#  2. A random Qwen2.5-0.5B-shaped checkpoint (bench/make_cpu_bench_checkpoint.py: real shapes and tokenizer, random
#     bf16 weights, so SPEED only), converted to ours (nanoqwen-convert defaults: INT4 g128 RTN, f16 embeddings =
#     tied lm_head) and to GGUF (the sdist's convert_hf_to_gguf.py to f16, then llama-quantize Q4_0; llama.cpp keeps
#     the tied output matrix at Q6_K under Q4_0, as it does for real Qwen2.5-0.5B files).
#  3. PAIRS pairs of runs: ours = bench/cpu_speed.py (-p 128 -n 64, 1 warm-up + 3 timed repetitions in one process),
#     llama.cpp = llama-bench (-p 128 -n 64 -r 3, its own warm-up, -t = the cores this process may use). Each run
#     prints its figures and the 1-minute load average as JSON; the ratios are taken pair by pair.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
W="${1:-/work/llamacpp}"
PAIRS="${2:-5}"
PY="${PYTHON:-python3}"
THREADS="$(nproc)"
mkdir -p "$W/models"
cd "$W"

# 1. llama.cpp CPU build
if [ ! -x "$W/build/bin/llama-bench" ]; then
  ls llama_cpp_python-*.tar.gz >/dev/null 2>&1 || "$PY" -m pip download --no-binary :all: --no-deps llama-cpp-python -d .
  SDIST="$(ls llama_cpp_python-*.tar.gz | sort -V | tail -1)"
  tar xzf "$SDIST"
  SRC="$W/${SDIST%.tar.gz}/vendor/llama.cpp"
  cmake -S "$SRC" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF
  cmake --build "$W/build" -j"$THREADS" --target llama-bench llama-quantize llama-simple
fi
SRC="$(ls -d "$W"/llama_cpp_python-*/vendor/llama.cpp | sort -V | tail -1)"

# 2. the two model files
CKPT="$W/models/q05b-random"
OURS="$W/models/q05b.int4.nanoqwen"
GGUF16="$W/models/q05b.f16.gguf"
GGUF="$W/models/q05b.Q4_0.gguf"
[ -d "$CKPT" ] || PYTHONPATH="$ROOT" "$PY" "$ROOT/bench/make_cpu_bench_checkpoint.py" "$CKPT"
[ -f "$OURS" ] || PYTHONPATH="$ROOT" "$PY" -m nanoqwen_quant.convert "$CKPT" -o "$OURS" --quiet
if [ ! -f "$GGUF" ]; then
  # convert_hf_to_gguf.py needs sentencepiece (kept out of the project's environment)
  [ -d "$W/pydeps/sentencepiece" ] || "$PY" -m pip install --target "$W/pydeps" sentencepiece
  PYTHONPATH="$W/pydeps" "$PY" "$SRC/convert_hf_to_gguf.py" "$CKPT" --outtype f16 --outfile "$GGUF16"
  "$W/build/bin/llama-quantize" "$GGUF16" "$GGUF" Q4_0
fi

# 3. paired runs
OUT="$W/runs/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
for i in $(seq 1 "$PAIRS"); do
  PYTHONPATH="$ROOT" "$PY" "$ROOT/bench/cpu_speed.py" "$OURS" -p 128 -n 64 -r 3 >> "$OUT/ours.jsonl"
  "$W/build/bin/llama-bench" -m "$GGUF" -t "$THREADS" -p 128 -n 64 -r 3 -o jsonl >> "$OUT/llamacpp.jsonl" 2>/dev/null
  echo "{\"pair\": $i, \"loadavg_1m\": $(cut -d' ' -f1 /proc/loadavg)}" >> "$OUT/load.jsonl"
done
"$PY" "$ROOT/bench/cpu_vs_llamacpp_summary.py" "$OUT"
