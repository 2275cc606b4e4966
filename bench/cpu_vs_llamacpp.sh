#!/usr/bin/env bash
# CPU speed of nanoqwen's CPU backend against llama.cpp's CPU build, same machine, same cores, same 0.5B shapes,
# 4-bit both (ours INT4 g128 round-to-nearest, llama.cpp Q4_0), run in turn (ours, llama.cpp, ours, ...) so that both
# see the same machine load; figures in bench/RESULTS.md, method and history in bench/NOTES.md.
#
#   bash bench/cpu_vs_llamacpp.sh [WORK_DIR] [PAIRS] [NEW_TOKENS] [REPS] [THREADS]
#   (defaults /work/llamacpp, 5 pairs, 64 decode steps after the 128-token prompt, 3 timed repetitions per run,
#   THREADS = nproc: numba's thread count for ours; llama-bench runs with -t 1 and -t THREADS in each pair, because
#   on a shared machine its multi-threaded runs collapse now and then, and the yardstick is its faster setting)
#
# Steps (each skipped when its output exists, so a rerun only measures):
#  1. llama.cpp: the llama-cpp-python sdist from the package index (`pip download --no-binary :all: --no-deps
#     llama-cpp-python`; 0.3.36 when measured), unpacked; its vendor/llama.cpp is built for this CPU (Release, CPU
#     backend only, static; only llama-bench, llama-quantize and llama-simple: llama-cli drags in the whole server).
#     Instruction sets: everything this CPU has (AVX-512 F/BW/DQ/VL/VBMI/VNNI/BF16, AVX-VNNI, AVX2, FMA, F16C) except
#     AMX. -DGGML_NATIVE=ON was tried first: it compiles ggml's AMX path, which dies with SIGILL on the first prompt
#     here (`tilezero`: the VM reports AMX but does not run it), so the ISA list is given explicitly with AMX off.
#     Everything lives under WORK_DIR, outside the repository.
#  2. A random Qwen2.5-0.5B-shaped checkpoint (bench/make_cpu_bench_checkpoint.py: real shapes and tokenizer, random
#     bf16 weights, so SPEED only), converted to ours (nanoqwen-convert defaults: INT4 g128 RTN, f16 embeddings =
#     tied lm_head) and to GGUF (the sdist's convert_hf_to_gguf.py to f16, then llama-quantize Q4_0; llama.cpp keeps
#     the tied token_embd/output matrix at Q8_0 under Q4_0: 896 columns are not a multiple of Q6_K's 256, as for real
#     Qwen2.5-0.5B files). Sizes: ours 462 MB, GGUF 352 MB.
#  3. PAIRS rounds of runs back to back: ours = bench/cpu_speed.py (-p 128 -n NEW_TOKENS, 1 warm-up + REPS timed
#     repetitions in one process) with the fast numerics (what Engine serves with), llama.cpp = llama-bench (-p 128
#     -n NEW_TOKENS -r REPS, its own warm-up) with -t 1 and -t THREADS, then ours with the oracle numerics (float32,
#     for reference). Each run prints its figures and the 1-minute load average as JSON; the ratios are taken round
#     by round against llama.cpp's faster setting (bench/cpu_vs_llamacpp_summary.py). llama-bench's
#     decode ("tg") starts from an empty context, ours after the 128-token prompt (attention over 128-192 positions:
#     ~0.2 % of the 0.5B's per-token multiply-adds).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
W="${1:-/work/llamacpp}"
PAIRS="${2:-5}"
NEW="${3:-64}"
REPS="${4:-3}"
PY="${PYTHON:-python3}"
THREADS="${5:-$(nproc)}"
mkdir -p "$W/models"
cd "$W"

# 1. llama.cpp CPU build
if [ ! -x "$W/build/bin/llama-bench" ]; then
  ls llama_cpp_python-*.tar.gz >/dev/null 2>&1 || "$PY" -m pip download --no-binary :all: --no-deps llama-cpp-python -d .
  SDIST="$(ls llama_cpp_python-*.tar.gz | sort -V | tail -1)"
  tar xzf "$SDIST"
  SRC="$W/${SDIST%.tar.gz}/vendor/llama.cpp"
  cmake -S "$SRC" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON \
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  cmake --build "$W/build" -j"$(nproc)" --target llama-bench llama-quantize llama-simple
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
LLAMA_THREADS="1"
[ "$THREADS" -gt 1 ] && LLAMA_THREADS="1 $THREADS"
for i in $(seq 1 "$PAIRS"); do
  NUMBA_NUM_THREADS="$THREADS" PYTHONPATH="$ROOT" "$PY" "$ROOT/bench/cpu_speed.py" "$OURS" -p 128 -n "$NEW" -r "$REPS" --numerics fast >> "$OUT/ours.jsonl"
  for t in $LLAMA_THREADS; do
    "$W/build/bin/llama-bench" -m "$GGUF" -t "$t" -p 128 -n "$NEW" -r "$REPS" -o jsonl >> "$OUT/llamacpp_t$t.jsonl" 2>/dev/null
  done
  NUMBA_NUM_THREADS="$THREADS" PYTHONPATH="$ROOT" "$PY" "$ROOT/bench/cpu_speed.py" "$OURS" -p 128 -n "$NEW" -r "$REPS" --numerics oracle >> "$OUT/ours_oracle.jsonl"
  echo "{\"pair\": $i, \"loadavg_1m\": $(cut -d' ' -f1 /proc/loadavg)}" >> "$OUT/load.jsonl"
done
"$PY" "$ROOT/bench/cpu_vs_llamacpp_summary.py" "$OUT"
