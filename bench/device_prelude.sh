# Sourced by a device call's script (bench/runs/<date>_<call>/call.sh, run as `bash bench/runs/.../call.sh` by the
# device tool): from the repository root, unpack every carried .out/*.tar.xz (libraries built here, a base tree,
# variant libraries), install the carried wheels (.whl/, see bench/gpu_check.sh) into /tmp/site, and export
# PYTHONPATH and OUT (the folder whose files come back).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
for f in .out/*.tar.xz; do [ -f "$f" ] && tar -xJf "$f"; done   # none carried: nothing to unpack
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nq_out}"; mkdir -p "$OUT"

# nq_decode VARIANT PROMPT_TOKENS [FILE]: one decode timing of FILE (default /tmp/q7b.nanoqwen; 64 tokens x 2) with
# .v/VARIANT's library (a variant built here and carried in .out/*.tar.xz); prints the bench's decode and MBU lines on
# one line
nq_decode() {
  NANOQWEN_LIB="$PWD/.v/$1/libnanoqwen.so" timeout 120 python3 -m nanoqwen_bench "${3:-/tmp/q7b.nanoqwen}" \
    --device cuda --no-peers --prompt-tokens "$2" --new-tokens 64 --repeats 2 2>&1 | grep -E '^(decode|MBU)' | tr -s ' ' | tr '\n' ';'
}
# nq_stamp WHAT: a "t SECONDS WHAT" line in $OUT/summary.txt (where a call's time went)
nq_stamp() { echo "t $(date +%s) $*" >> "$OUT/summary.txt"; }
# nq_left S: true while fewer than S seconds have passed since this prelude was sourced (a call's step that its
# time, the device's 600 s limit, may not allow is skipped)
NQ_T0=$(date +%s)
nq_left() { [ $(( $(date +%s) - NQ_T0 )) -lt "$1" ]; }
# nq_graph_fork_pdl: csrc/dev/graph_fork_pdl built and run (does a fork recorded between two PDL launches of a
# captured graph keep their programmatic edge? bench/NOTES.md "Session 34" §3), its log to $OUT/graph_fork_pdl.log,
# the last lines to $OUT/summary.txt
nq_graph_fork_pdl() {
  make -C csrc/dev "$PWD/build/dev/graph_fork_pdl" > "$OUT/graph_fork_pdl.log" 2>&1 &&
    timeout 60 build/dev/graph_fork_pdl >> "$OUT/graph_fork_pdl.log" 2>&1
  tail -4 "$OUT/graph_fork_pdl.log" | sed "s/^/graph_fork_pdl: /" | tee -a "$OUT/summary.txt"
}
# nq_ab VARIANT PROMPT_TOKENS REP [FILE [LABEL]]: nq_decode, recorded in $OUT/summary.txt as "ab VARIANT PROMPT repREP:
# ..." (with LABEL after "ab" where given, e.g. the file's size); bench/ab_table.py makes them one table
nq_ab() { echo "ab ${5:+$5 }$1 $2 rep$3: $(nq_decode "$1" "$2" "${4:-}")" | tee -a "$OUT/summary.txt"; }
# nq_count_tests VARIANT K FILE...: .v/VARIANT's libraries in place (nq_use), the hand-over count test applied from
# call 1's handover_tests.patch where the tree lacks it (branch wip/s35-handover's test), then the GPU tests of FILEs
# selected by K (pytest -k) over 8 workers under a timeout (a wrong count would hang), the log to
# $OUT/tests_VARIANT.log and "VARIANT tests rc=...: its last line" to $OUT/summary.txt; returns pytest's status
nq_count_tests() {
  local v=$1 k=$2 rc; shift 2
  nq_use "$v"
  grep -q test_decode_hand_over_counts tests/test_gpu_e2e.py ||
    git apply --include='tests/*' bench/runs/2026-12-05_s35_call1/handover_tests.patch
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "$k" "$@" > "$OUT/tests_$v.log" 2>&1
  rc=$?
  echo "$v tests rc=$rc: $(tail -1 "$OUT/tests_$v.log")" | tee -a "$OUT/summary.txt"
  return $rc
}
# nq_ab_shape SHAPE LIMIT VARIANT...: a random SHAPE-shaped file (bench/make_7b_file.py --shape), then nq_ab of each
# VARIANT at 512 prompt tokens, labelled SHAPE, while fewer than LIMIT seconds have passed (nq_left); the file removed
nq_ab_shape() {
  local shape=$1 limit=$2 v f=/tmp/ab_shape.nanoqwen; shift 2
  nq_left "$limit" && python3 bench/make_7b_file.py "$f" --shape "$shape" --quiet > /dev/null 2>&1 &&
    for v in "$@"; do nq_left "$limit" && nq_ab "$v" 512 1 "$f" "$shape"; done
  rm -f "$f"
}
# nq_ab_table BASE: the call's A/B lines as one table against BASE (bench/ab_table.py) into $OUT/ab_table.md, printed
nq_ab_table() { python3 bench/ab_table.py "$OUT/summary.txt" --base "$1" > "$OUT/ab_table.md" 2>&1; cat "$OUT/ab_table.md"; }
# nq_quick_tests: the frag GEMV, attention and decode-switch GPU tests over 8 workers (the product library in
# nanoqwen_rt/lib, the testing one in build/lib), the last lines to $OUT/summary.txt
nq_quick_tests() {
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -x -n 8 -k "attn or attention or switch or frag" \
    tests/test_gpu_kernels.py tests/test_gpu_e2e.py tests/test_gpu_frag_gemv.py 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
}
# nq_sanitizer_model [tiny]: writes a 2-layer synthetic INT4 model to /tmp/san.nanoqwen and prints its path; with
# `tiny`, the embedded models/tiny-py converted instead where this tree has it (gpu_check.sh's sanitize step's choice)
nq_sanitizer_model() {
  python3 -c "
import sys; sys.path.insert(0, 'tests')
from synth import make_checkpoint
from nanoqwen_quant.convert import convert_checkpoint
make_checkpoint('/tmp/san_hf', dtype='bf16', n_layers=2, hidden=128, intermediate=256, n_heads=2, n_kv_heads=1, vocab=384, seed=4)
convert_checkpoint('/tmp/san_hf', '/tmp/san.nanoqwen', quant='int4', group_size=64)" > /dev/null 2>&1
  local m=/tmp/san.nanoqwen
  [ "${1:-}" = tiny ] && [ -f models/tiny-py/config.json ] && python3 -c "
from nanoqwen_quant.convert import convert_checkpoint
convert_checkpoint('models/tiny-py', '/tmp/tiny-py.nanoqwen', quant='int4')" > /dev/null 2>&1 && m=/tmp/tiny-py.nanoqwen
  echo "$m"
}
# nq_sanitize LABEL MODEL TOOL...: compute-sanitizer TOOL on bench/sanitize_tiny.py MODEL (the product library in
# nanoqwen_rt/lib), each log to $OUT/san_TOOL.log, one summary line each to $OUT/summary.txt
nq_sanitize() {
  local label=$1 model=$2 tool; shift 2
  for tool in "$@"; do
    timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 bench/sanitize_tiny.py "$model" \
      > "$OUT/san_$tool.log" 2>&1
    echo "${label}sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | head -2 | tr '\n' ' ')" \
      | tee -a "$OUT/summary.txt"
  done
}
# nq_sanitize_tests LABEL SELECTION TOOL...: compute-sanitizer TOOL on the kernel tests test_gpu_kernels.py -k
# SELECTION (the testing library in build/lib), each log to $OUT/san_LABEL_TOOL.log, one line each to $OUT/summary.txt
nq_sanitize_tests() {
  local label=$1 sel=$2 tool; shift 2
  for tool in "$@"; do
    timeout 100 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpu_kernels.py -k "$sel" > "$OUT/san_${label}_$tool.log" 2>&1
    echo "$label kernel tests ($sel) under $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' \
      "$OUT/san_${label}_$tool.log" | tail -2 | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  done
}
# nq_use VARIANT: .v/VARIANT's two libraries as the product (nanoqwen_rt/lib) and testing (build/lib) ones, for
# nq_quick_tests and nq_sanitize
nq_use() {
  mkdir -p nanoqwen_rt/lib build/lib
  cp ".v/$1/libnanoqwen.so" nanoqwen_rt/lib/ && cp ".v/$1/libnanoqwen_testing.so" build/lib/
}
# nq_attn_bench VARIANT [TIMEOUT_S]: bench/attn_bench.py with .v/VARIANT's testing library; the log to
# $OUT/attn_VARIANT.log, its first 20 rows prefixed by VARIANT to $OUT/summary.txt
nq_attn_bench() {
  NANOQWEN_TESTING_LIB="$PWD/.v/$1/libnanoqwen_testing.so" timeout "${2:-90}" python3 bench/attn_bench.py \
    > "$OUT/attn_$1.log" 2>&1
  echo "attn_bench $1 rc=$?" | tee -a "$OUT/summary.txt"
  grep -E "^attn" "$OUT/attn_$1.log" | head -20 | sed "s/^/$1 /" | tee -a "$OUT/summary.txt"
}
# nq_attn_variant_call BASE NEW: an attention change's call (session 25 calls 1 and 5): NEW's frag GEMV / attention /
# switch tests, racecheck and synccheck on tiny-py, attn_bench BASE and NEW, and the 7B decode A/B at 512 and 8K x 2
nq_attn_variant_call() {
  local base=$1 new=$2 v rep p m
  nq_use "$new"
  nq_quick_tests
  m=$(nq_sanitizer_model tiny); nq_sanitize "$new " "$m" racecheck synccheck
  for v in "$base" "$new"; do nq_attn_bench "$v"; done
  python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
  for p in 512 8192; do for rep in 1 2; do for v in "$base" "$new"; do nq_ab "$v" "$p" "$rep"; done; done; done
}

# nq_sizes LABEL: gpu_check.sh's sizes step (decode on every size's shapes at 512) with the product library, its lines
# to $OUT/summary.txt as "size SIZE (LABEL): ..."
nq_sizes() {
  OUT=/tmp/nq_sizes bash bench/gpu_check.sh sizes > /dev/null 2>&1
  grep '^size ' /tmp/nq_sizes/summary.txt | sed "s/^size \([^ ]*\) rc=[0-9]*:/size \1 ($1):/" | tee -a "$OUT/summary.txt"
}
# nq_ab_plan LABEL NAME SPEC PROMPT REP FILE: nq_ab's line for .v/$NQ_KNOB (a planknob build: NQ_FRAG_PLAN replaces the
# plans of the decode GEMV launches it names) with NQ_FRAG_PLAN=SPEC, as variant NAME
nq_ab_plan() {
  echo "ab $1 $2 $4 rep$5: $(NQ_FRAG_PLAN="$3" nq_decode "${NQ_KNOB:-planknob}" "$4" "$6")" | tee -a "$OUT/summary.txt"
}
# nq_plan_sweep LABEL FILE "NAME=SPEC ..." : at 512, the default plans, each change, the default again, then the best
# change of each GEMV (NAME's part before "_"; > 0.5 % better) combined, alternated with the default (x2); each step
# skipped past 520-540 s (nq_left)
nq_plan_sweep() {
  local label=$1 file=$2 kv name spec
  nq_ab_plan "$label" default "" 512 1 "$file"
  for kv in $3; do nq_left 520 && nq_ab_plan "$label" "${kv%%=*}" "${kv#*=}" 512 1 "$file"; done
  nq_ab_plan "$label" default "" 512 2 "$file"
  spec=$(python3 - "$OUT/summary.txt" "$label" "$3" <<'PY'
import sys
sys.path.insert(0, "bench")
from ab_table import parse   # the nq_ab lines' one parser
summary, label, pairs = sys.argv[1], sys.argv[2], sys.argv[3].split()
with open(summary) as f:
    runs = parse(f)[0].get((label, 512), {})
ms = {v: [x for x, _ in r if x is not None] for v, r in runs.items()}
if not ms.get("default"):
    sys.exit(0)
base = sum(ms["default"]) / len(ms["default"])
best = {}   # GEMV name (the part before the first '_') -> (ms, spec)
for kv in pairs:
    name, spec = kv.split("=", 1)
    if ms.get(name) and min(ms[name]) < 0.995 * base:
        g = name.split("_")[0]
        if g not in best or min(ms[name]) < best[g][0]: best[g] = (min(ms[name]), spec)
print(",".join(s for _, s in best.values()))
PY
)
  echo "sweep $label: best combination '${spec}'" | tee -a "$OUT/summary.txt"
  [ -n "$spec" ] && for rep in 1 2; do nq_left 540 || break
    nq_ab_plan "$label" combo "$spec" 512 $rep "$file"; nq_ab_plan "$label" default "" 512 $((rep + 2)) "$file"
  done
}
