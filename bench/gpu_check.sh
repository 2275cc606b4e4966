#!/usr/bin/env bash
# One call on the GPU machine: load (or build) libnanoqwen and libnanoqwen_testing, run the GPU tests, the kernel
# and end-to-end benchmarks, compute-sanitizer; full logs under $OUT, a short table last.
#   device: run(command="bash bench/gpu_check.sh [STEPS]", carry=[".whl", "nanoqwen_rt/lib", "build/lib"])
#   (nanoqwen_rt/lib: the product library; build/lib: the testing library the kernel tests and benches load)
# STEPS: comma list of sass,tests,kbench,frag,lmhead,chain,layers,abench,bench,sizes,long,base,ab,ncu,sanitize,hf7b,asym
# (default: all but lmhead, chain, layers, abench, sizes, long, base, ab and asym; ncu, long and base need bench; sizes:
# decode at 512 on every size's shapes, the three smallest also per kernel (~200 s); long: the bench at 2K, 8K and
# 32K-token prompts; base: the bench again with an earlier tree carried in .base/, see the step; ab: decode at 512 /
# 8K / 32K-token prompts, this tree and .base/ alternated, twice (makes the 7B file itself); asym: int4g layout 2
# against layout 1, see the step).
# The kernels that lost are timed by csrc/dev programs: `make -C csrc/dev` then build/dev/<name>. A one-off device
# call (an A/B of variant libraries, a trace) is a script in bench/runs/<date>_<call>/ that sources
# bench/device_prelude.sh (unpacks .out/*.tar.xz, installs .whl/, sets PYTHONPATH and OUT) and may call this script.
# Wheels for packages the image lacks (crc32c, ...) are read from .whl/ (README "Notes" of the device tool); made here
# with `pip download -d .whl --no-deps --only-binary :all: --python-version 3.12 --platform manylinux_2_28_x86_64
# crc32c gguf sse-starlette starlette uvicorn pytest-xdist execnet`, and llguidance (>= 1.9, as pyproject; its wheel is
# manylinux_2_31, which that --platform does not match and would fall back to 1.6.1) with `pip download -d .whl
# --no-deps 'llguidance>=1.9'`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/nq_out}"; mkdir -p "$OUT"
LOG=/tmp/nq_logs; rm -rf "$LOG"; mkdir -p "$LOG"   # full logs and JSON; packed into $OUT/logs.tgz after every step
steps="${1:-sass,tests,kbench,bench,ncu,sanitize,hf7b}"
has() { [[ ",$steps," == *",$1,"* ]]; }
summary="$LOG/summary.txt"; : > "$summary"
note() { echo "$*" | tee -a "$summary"; }
# after every step, so that a run cut short keeps its results: $OUT holds two files (the device tool returns at most
# 8), the summary and logs.tgz (every log and JSON: `tar xzf logs.tgz` gives nq_logs/)
save() { cp "$summary" "$OUT"/ 2>/dev/null; tar czf "$OUT/logs.tgz" -C /tmp nq_logs 2>/dev/null; }
export PYTHONUNBUFFERED=1 NANOQWEN_COMMIT="${NANOQWEN_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$LOG/pip.log" 2>&1 || { note "pip install of .whl failed"; cat "$LOG/pip.log"; }
fi
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$LOG/gpu.txt"
uname -r | tee -a "$LOG/gpu.txt"
libs_load() {  # both libraries load, the product through its binding, the testing one through tests/nq_testing_lib.py
  python3 -c "
import sys
from nanoqwen_rt.backends import cuda as c
from nq_testing_lib import load_testing_library
load_testing_library()
sys.exit(0 if c.available() else 1)"
}
if ! libs_load 2>"$LOG/load.err"; then
  note "carried libraries did not load ($(tail -1 "$LOG/load.err")): building here"
  t0=$(date +%s); NANOQWEN_CUDA_ARCHS=90a JOBS=16 bash scripts/build_native.sh > "$LOG/build.log" 2>&1
  note "device build rc=$? in $(( $(date +%s) - t0 )) s"
  libs_load 2>>"$LOG/load.err" || note "libraries still do not load: $(tail -1 "$LOG/load.err")"
fi
python3 -c "from nanoqwen_rt.backends import cuda as c; print('cuda available:', c.available(), c.unavailable_reason() or '')" | tee -a "$summary"

if has sass && command -v cuobjdump >/dev/null; then   # SASS check: 16-byte weight loads, tensor-core MMAs
  cuobjdump -sass -arch sm_90a nanoqwen_rt/lib/libnanoqwen.so > "$LOG/sass.txt" 2>&1
  note "SASS sm_90a: LDG.E.128 (16-byte global loads): $(grep -c 'LDG.E.128' "$LOG/sass.txt"), of them .CONSTANT (nc): $(grep -c 'LDG.E.128.CONSTANT' "$LOG/sass.txt"); HMMA: $(grep -c HMMA "$LOG/sass.txt"); LDL/STL (local memory): $(grep -cE 'LDL|STL' "$LOG/sass.txt")"
fi
if has tests; then
  t0=$(date +%s)
  # NQ_TEST_K narrows the selection (pytest -k), e.g. to re-check one kernel quickly. The files are named: the
  # device image has no `openai`, which tests/test_server.py (CPU, CI) imports at collection. The suite's time is
  # mostly the numpy references on the host, so it runs under pytest-xdist (its wheels and execnet's in .whl/), in
  # two runs at once: the kernel files test by test over 8 workers, the rest file by file over 4 (a file's fixtures
  # stay in one worker). Serially it no longer fits one device call (NOTES "Session 18" §4: ~140 s against > 430).
  xk="not 7b_shaped${NQ_TEST_K:+ and ($NQ_TEST_K)}"
  if python3 -c "import xdist" 2>/dev/null; then par_k="-n 8 --dist load"; par_r="-n 4 --dist loadfile"; else
    par_k=""; par_r=""; note "pytest-xdist is not installed (.whl/): the GPU suite runs serially"; fi
  timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 240 -rfEs $par_k --durations=15 \
    tests/test_gpu_frag_repack.py tests/test_gpu_frag_gemv.py tests/test_gpu_frag_gemm.py tests/test_gpu_frag_prefill.py \
    tests/test_gpu_kernels.py tests/test_gpu_gemm.py tests/test_gpu_gemm_qwen_shapes.py tests/test_gpu_sizes.py -k "$xk" \
    > "$LOG/pytest_gpu_kernels.log" 2>&1 &
  pk=$!
  timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 240 -rfEs $par_r --durations=15 \
    tests/test_gpu_e2e.py tests/test_server_gpu.py tests/test_bench.py tests/test_cli.py tests/test_gpu_steer.py \
    tests/test_gpu_batch.py tests/test_batch.py tests/test_gpu_batch_engine.py tests/test_gpu_pool.py -k "$xk" \
    > "$LOG/pytest_gpu.log" 2>&1
  rc=$?
  wait $pk
  rck=$?
  note "pytest -m gpu, kernel files: rc=$rck: $(tail -1 "$LOG/pytest_gpu_kernels.log")"
  note "pytest -m gpu, e2e / server / CLI / bench / batch (not the 7B-shaped one): rc=$rc: $(tail -1 "$LOG/pytest_gpu.log")"
  note "both in $(( $(date +%s) - t0 )) s"
  grep -hE "^(FAILED|ERROR|SKIPPED)" "$LOG/pytest_gpu_kernels.log" "$LOG/pytest_gpu.log" | head -25 | tee -a "$summary"
  save
fi
if has kbench; then
  timeout 120 python3 bench/gpu_kernels_bench.py --json "$LOG/gemv_bench.json" > "$LOG/gemv_bench.log" 2>&1
  note "gemv bench rc=$?"; grep -E "^read|^shape|^7B|^32B|^0.5B|^gemm" "$LOG/gemv_bench.log" | tee -a "$summary"
  tail -3 "$LOG/gemv_bench.log" | grep -v "^gemm" | tee -a "$summary"
  save
fi
if has frag; then   # the INT4 fragment order against the file order per 7B layer: decode GEMVs, GEMMs at 1-512 tokens
  timeout 240 python3 bench/frag_bench.py --json "$LOG/frag_bench.json" > "$LOG/frag_bench.log" 2>&1
  note "frag bench rc=$?"; grep -E "^gemv|^gemm" "$LOG/frag_bench.log" | tee -a "$summary"
  save
fi
# A csrc/dev program that takes a size's widths (layers hidden intermediate heads kv_heads head_dim, from the one shape
# table nanoqwen_format/shapes.py), run at the 7B's and the 0.5B's: dev_sizes NAME TIMEOUT. Carried when built here
# (build/dev/NAME), else built on the device (nvcc is on its image).
dev_sizes() {
  local name=$1 limit=$2 size args
  [ -x "build/dev/$name" ] || make -C csrc/dev "$PWD/build/dev/$name" > "$LOG/${name}_build.log" 2>&1 ||
    note "$name build failed"
  for size in 7B 0.5B; do
    args=$(python3 -c "from nanoqwen_format.shapes import QWEN25_SHAPES as S; s = S['$size']; \
print(s.n_layers, s.hidden, s.intermediate, s.n_heads, s.n_kv_heads, s.head_dim)")
    timeout "$limit" "build/dev/$name" $args > "$LOG/${name}_$size.log" 2>&1
    note "$name $size rc=$?"; grep -vE "^make" "$LOG/${name}_$size.log" | tee -a "$summary"
  done
  save
}
# chain_read: what a kernel boundary costs a 112-stage chain of dependent read-only streams with a decode step's bytes
# (kernels with PDL / one persistent launch / no dependency / one stream); NOTES "Session 18" §6
has chain && dev_sizes chain_read 120
# decode_layers: a decode step's GEMV chain as one persistent kernel streaming every weight through a shared-memory
# ring, against the product's PDL chain and the read ceiling; NOTES "Session 19"
has layers && dev_sizes decode_layers 150
if has lmhead; then   # csrc/dev/lm_head_f16: the f16 lm_head at 1-64 rows, the product's kernel against W fragments
  # loaded straight into the mma (NOTES "Session 15: the final review"); built here (nvcc is on the device image)
  make -C csrc/dev "$PWD/build/dev/lm_head_f16" > "$LOG/lmhead_build.log" 2>&1 && \
    timeout 240 build/dev/lm_head_f16 > "$LOG/lmhead.log" 2>&1
  note "lm_head dev program rc=$?"; grep -E "ceiling|FAIL|^  " "$LOG/lmhead.log" | tee -a "$summary"
  save
fi
if has abench; then
  # the few-token prefill chunks both ways (kernel crossover), decode from 577 to 32K keys at 32 / 64 / 128 keys a
  # split (the session's rule picks the split count), the batched step's attention at 1 / 8 / 32 rows by split count,
  # prefill at 512 tokens
  timeout 240 python3 bench/attn_bench.py --few-tokens 2 5 8 16 32 --batch-contexts 577 2048 \
    --contexts 577 2048 8192 32768 --decode-kps 32 64 128 --batch-rows 1 8 32 --batch-splits 1 4 16 33 64 \
    --json "$LOG/attn_bench.json" > "$LOG/attn_bench.log" 2>&1
  note "attention bench rc=$?"; grep -E "^attn" "$LOG/attn_bench.log" | tee -a "$summary"
  save
fi
if has bench; then
  t0=$(date +%s)
  timeout 120 python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > "$LOG/make7b.log" 2>&1
  note "make_7b_file rc=$? in $(( $(date +%s) - t0 )) s"
  # peers (copy / read-only ceilings, torch int4 chain, cuBLAS f16 chain) in the same process as the Engine run
  timeout 240 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --json "$LOG/bench7b.json" \
    > "$LOG/bench7b.log" 2>&1
  note "bench 7B rc=$?"; tail -25 "$LOG/bench7b.log" | tee -a "$summary"
  # steered generation (logprobs, bias + penalties, JSON grammar) against plain decoding on the same file
  timeout 240 python3 bench/steer_bench.py /tmp/q7b.nanoqwen --json "$LOG/steer7b.json" > "$LOG/steer7b.log" 2>&1
  note "steer bench 7B rc=$?"
  grep -E "(plain|decode|logprobs5|steer5|host5)_ms:|cost_vs|_tokens:|_decode_ms_per_token|_setup_ms|_host_mask_ms_per_token|suite_ms|skipped" \
    "$LOG/steer7b.log" | tee -a "$summary"
  # many sequences per step (nq_decode_batch) against the single stream, same file
  timeout 240 python3 bench/batch_bench.py /tmp/q7b.nanoqwen --batch 1,2,4,8,32,64 --json "$LOG/batch7b.json" > "$LOG/batch7b.log" 2>&1
  note "batch bench 7B rc=$?"; tail -7 "$LOG/batch7b.log" | tee -a "$summary"
  # the batched API (Engine.submit: device sampling, the server's path) under N concurrent streams, same file
  # --new-tokens 256: a steady window at 64 streams (128 tokens leave 1-7 steps with all 64 decoding: NOTES
  # "Session 10" §9)
  timeout 300 python3 -m nanoqwen_rt.cli bench /tmp/q7b.nanoqwen --device cuda --concurrency 1,8,32,64 --new-tokens 256 \
    --json "$LOG/conc7b.json" > "$LOG/conc7b.log" 2>&1
  note "concurrency bench 7B rc=$?"; tail -9 "$LOG/conc7b.log" | tee -a "$summary"
  # a 2,000-token cached prefix on the device KV pool: TTFT of a hit against a miss (the batched API)
  timeout 200 python3 bench/prefix_cache_ttft.py --device cuda --file /tmp/q7b.nanoqwen --prefix-tokens 2000 \
    --rounds 5 --max-context 8192 > "$LOG/prefix7b.log" 2>&1
  note "prefix-cache TTFT 7B rc=$?"; tail -6 "$LOG/prefix7b.log" | tee -a "$summary"
  # the Engine's host time per steady decode step at 32 and 64 streams: the backend call against the scheduler
  for n in 32 64; do
    timeout 120 python3 bench/profile_engine.py /tmp/q7b.nanoqwen --device cuda --streams $n --steps 48 --top 15 \
      --json "$LOG/engine_prof$n.json" > "$LOG/engine_prof$n.log" 2>&1
    note "engine profile ($n streams) rc=$?"; head -2 "$LOG/engine_prof$n.log" | tee -a "$summary"
  done
  # GPU time per kernel (CUPTI) of the 512-token prefill, of a prefix-cache hit's 5 tokens after 2,000 (the prefix
  # bench's hit), of the 32-row batched step (where TTFT and the step go) and of single-stream decode steps (per
  # step), the decode graph of Engine.generate; "log name:arguments"
  for prof in "prefill:prefill --tokens 512" "hit:prefill --tokens 5 --after 2000" "batch:batch --n 32" \
              "engine:engine --n 32 --tokens 512 --steps 16" "decode:decode --tokens 512 --steps 16"; do
    name=${prof%%:*}; args=${prof#*:}
    timeout 90 python3 bench/profile_kernels.py /tmp/q7b.nanoqwen $args 2>&1 | grep -v -i warn > "$LOG/prof_$name.log"
    note "profile ($args) rc=$?"; head -14 "$LOG/prof_$name.log" | tee -a "$summary"
    grep -E -A4 "^GPU time summed|^first to last" "$LOG/prof_$name.log" | tee -a "$summary"
  done
  save
fi
if has sizes; then   # #15's table: decode on every size's shapes (random files, INT4 g128, f16 lm_head; 512-token
  # prompt, 64 tokens x 2), each against the read ceiling the bench measures in its run; "size SIZE: ..." lines.
  # NQ_SIZES: which sizes, in that order (a short call puts the ones it needs most first)
  for size in ${NQ_SIZES:-0.5B 1.5B 3B 7B 14B 32B}; do
    timeout 150 python3 bench/make_7b_file.py /tmp/size.nanoqwen --shape $size --quiet > "$LOG/make_$size.log" 2>&1 \
      || { note "size $size: make_7b_file failed"; continue; }
    timeout 150 python3 -m nanoqwen_bench /tmp/size.nanoqwen --device cuda --no-peers --prompt-tokens 512 \
      --new-tokens 64 --repeats 2 --json "$LOG/size_$size.json" > "$LOG/size_$size.log" 2>&1
    note "size $size rc=$?: $(grep -E '^(decode|MBU|read-only)' "$LOG/size_$size.log" | tr -s ' ' | tr '\n' ';')"
    case $size in 0.5B|1.5B|3B)   # where fixed costs dominate: GPU time per kernel of a decode step (lm_head share)
      timeout 90 python3 bench/profile_kernels.py /tmp/size.nanoqwen decode --tokens 512 --steps 16 2>&1 |
        grep -v -i warn > "$LOG/prof_decode_$size.log"
      head -8 "$LOG/prof_decode_$size.log" | sed "s/^/size $size profile: /" | tee -a "$summary" ;;
    esac
    rm -f /tmp/size.nanoqwen
  done
  save
fi
if has long && [ -f /tmp/q7b.nanoqwen ]; then   # long prompts on the same file: TTFT and decode at 2K, 8K and 32K
  for n in 2048 8192 32000; do
    timeout 200 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens $n \
      --new-tokens 64 --repeats 2 --json "$LOG/bench7b_$n.json" > "$LOG/bench7b_$n.log" 2>&1
    note "bench 7B, $n-token prompt rc=$?: $(grep -E '^(TTFT|decode|bytes read|MBU)' "$LOG/bench7b_$n.log" | tr -s ' ' | tr '\n' ';')"
  done
  save
fi
if has ab && [ -d "${NANOQWEN_BASE_DIR:-.base}" ]; then
  # before / after on one machine: the 7B decode (64 tokens, 2 repeats) after 512 / 8K / 32K-token prompts, this tree
  # and the base tree (as the base step's) alternated, two runs of each (session 21's calls 4 and 6)
  base="${NANOQWEN_BASE_DIR:-.base}"
  base_mod=nanoqwen_rt.bench; [ -d "$base/nanoqwen_bench" ] && base_mod=nanoqwen_bench
  [ -f /tmp/q7b.nanoqwen ] || timeout 120 python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > "$LOG/make7b.log" 2>&1
  for n in 512 8192 32000; do
    for run in new base new base; do
      if [ $run = new ]; then
        timeout 200 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers --prompt-tokens $n \
          --new-tokens 64 --repeats 2 > "$LOG/ab_${run}_$n.log" 2>&1
      else
        (cd "$base" && PYTHONPATH="/tmp/site:$PWD" timeout 200 python3 -m $base_mod /tmp/q7b.nanoqwen --device cuda \
           --no-peers --prompt-tokens $n --new-tokens 64 --repeats 2) > "$LOG/ab_${run}_$n.log" 2>&1
      fi
      rc=$?
      note "ab $run (base $(cat "$base/.commit" 2>/dev/null || echo '?')), $n-token prompt rc=$rc: $(grep -E '^(decode|MBU)' "$LOG/ab_${run}_$n.log" | tr -s ' ' | tr '\n' ';')"
    done
  done
  save
fi
if has base && [ -d "${NANOQWEN_BASE_DIR:-.base}" ]; then
  # The same 7B bench with an earlier tree carried in NANOQWEN_BASE_DIR (default .base/: `git archive REV
  # nanoqwen_rt nanoqwen_format nanoqwen_quant | tar -x` plus its own built nanoqwen_rt/lib), for before/after
  # figures measured in one run on one machine.
  base="${NANOQWEN_BASE_DIR:-.base}"
  base_mod=nanoqwen_rt.bench; [ -d "$base/nanoqwen_bench" ] && base_mod=nanoqwen_bench
  (cd "$base" && PYTHONPATH="/tmp/site:$PWD" timeout 200 python3 -m $base_mod /tmp/q7b.nanoqwen --no-peers \
     --device cuda --json "$LOG/bench7b_base.json") > "$LOG/bench7b_base.log" 2>&1
  note "bench 7B, base tree $(cat "$base/.commit" 2>/dev/null || echo '?') rc=$?: $(grep -E '^(TTFT|decode|load)' "$LOG/bench7b_base.log" | tr -s ' ' | tr '\n' ';')"
  save
fi
if has ncu; then
  timeout 100 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
    --kernel-name regex:"gemv|attn|embed_token|advance_pos|sample" \
    python3 bench/profile_decode.py run /tmp/q7b.nanoqwen > "$LOG/ncu_decode.csv" 2> "$LOG/ncu_decode.err"
  note "ncu rc=$?"
  python3 bench/profile_decode.py summarize "$LOG/ncu_decode.csv" 2>&1 | tee -a "$summary"
fi
if has hf7b; then
  t0=$(date +%s)
  timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 280 -rfE tests/test_gpu_e2e.py \
    -k 7b_shaped > "$LOG/pytest_hf7b.log" 2>&1
  note "7B-shaped vs transformers: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$LOG/pytest_hf7b.log")"
  save
fi
if has asym; then
  # int4g layout 2 (zero points) against layout 1 in one run: the 7B decode/TTFT bench on two files holding the same
  # weights (make_7b_file.py --quant int4-asym), the kernel bench of the layout-2 builds, and compute-sanitizer
  # memcheck on a tiny layout-2 model (tests/int4_layout2.py twin of a converted checkpoint)
  [ -f /tmp/q7b.nanoqwen ] || timeout 120 python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > "$LOG/make7b.log" 2>&1
  timeout 120 python3 bench/make_7b_file.py /tmp/q7b_asym.nanoqwen --quant int4-asym --quiet > "$LOG/make7b_asym.log" 2>&1
  note "make_7b_file --quant int4-asym rc=$?"
  for f in q7b q7b_asym; do
    timeout 200 python3 -m nanoqwen_bench /tmp/$f.nanoqwen --device cuda --no-peers --json "$LOG/bench_$f.json" \
      > "$LOG/bench_$f.log" 2>&1
    note "bench 7B $f rc=$?: $(grep -E '^(TTFT|decode|bytes read|MBU)' "$LOG/bench_$f.log" | tr -s ' ' | tr '\n' ';')"
  done
  timeout 150 python3 bench/gpu_kernels_bench.py --layout 2 --json "$LOG/gemv_bench_layout2.json" \
    > "$LOG/gemv_bench_layout2.log" 2>&1
  note "gemv bench layout 2 rc=$?"; grep -E "^7B|^gemm" "$LOG/gemv_bench_layout2.log" | tee -a "$summary"
  python3 -c "
import sys; sys.path.insert(0, 'tests')
from pathlib import Path
from synth import make_checkpoint
from int4_layout2 import layout_2_twins
from nanoqwen_quant.convert import convert_checkpoint
make_checkpoint('/tmp/san2_hf', dtype='bf16', n_layers=2, hidden=128, intermediate=256, n_heads=2, n_kv_heads=1, vocab=384, seed=4)
convert_checkpoint('/tmp/san2_hf', '/tmp/san2.nanoqwen', quant='int4', group_size=32)
layout_2_twins(Path('/tmp/san2.nanoqwen'), Path('/tmp/san2_l2.nanoqwen'), Path('/tmp/san2_l2f16.nanoqwen'), seed=7)" \
    > "$LOG/sanitize_l2_model.log" 2>&1
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/sanitize_tiny.py /tmp/san2_l2.nanoqwen \
    > "$LOG/sanitize_l2_memcheck.log" 2>&1
  note "compute-sanitizer memcheck, layout-2 model: rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/sanitize_l2_memcheck.log" | head -1)"
  save
fi
if has sanitize; then
  python3 -c "
import sys; sys.path.insert(0, 'tests')
from synth import make_checkpoint
from nanoqwen_quant.convert import convert_checkpoint
make_checkpoint('/tmp/san_hf', dtype='bf16', n_layers=2, hidden=128, intermediate=256, n_heads=2, n_kv_heads=1, vocab=384, seed=4)
convert_checkpoint('/tmp/san_hf', '/tmp/san.nanoqwen', quant='int4', group_size=64)" > "$LOG/sanitize_model.log" 2>&1
  san_model=/tmp/san.nanoqwen
  [ -f models/tiny-py/config.json ] && python3 -c "
from nanoqwen_quant.convert import convert_checkpoint
convert_checkpoint('models/tiny-py', '/tmp/tiny-py.nanoqwen', quant='int4')" >> "$LOG/sanitize_model.log" 2>&1 \
    && san_model=/tmp/tiny-py.nanoqwen
  note "sanitizer model: $san_model"
  for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 bench/sanitize_tiny.py "$san_model" \
      > "$LOG/sanitize_$tool.log" 2>&1
    note "compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|not supported' "$LOG/sanitize_$tool.log" | head -2 | tr '\n' ' ')"
  done
fi
save
echo "================ summary ================"
cat "$summary"
