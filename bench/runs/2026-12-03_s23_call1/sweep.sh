#!/usr/bin/env bash
# Session 23 call 1 (experiment, not a product script): NQ_FRAG_PF="chunks,norm" (a variant knob of this branch's
# gemv_frag_kernel: L2 prefetch of a warp's next chunks, norm_w prefetch into L2 (1) or L1 (2), before the PDL wait)
# swept on 7B decode after a 512-token prompt; chain_read's +fixed rows; session creation time.
set -uo pipefail
cd "$(dirname "$0")/../../.."
tar -xJf .out/libs.tar.xz
OUT="${OUT:-/tmp/nq_out}"; mkdir -p "$OUT"; S="$OUT/sweep.txt"; : > "$S"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$S"
t0=$(date +%s); python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1; echo "make7b rc=$? $(( $(date +%s)-t0 )) s" | tee -a "$S"
run() {  # $1: NQ_FRAG_PF value, $2: prompt tokens
  r=$(NQ_FRAG_PF="$1" timeout 120 python3 -m nanoqwen_bench /tmp/q7b.nanoqwen --device cuda --no-peers \
      --prompt-tokens "$2" --new-tokens 64 --repeats 2 2>&1 | grep -E '^decode' | tr -s ' ')
  echo "pf=$1 prompt=$2: $r" | tee -a "$S"
}
for v in 0,0 1,0 2,0 4,0 0,1 0,2 1,1 2,2 0,0 1,2 8,2 0,0; do run $v 512; done
cp "$S" "$OUT/"
build/dev/chain_read 28 3584 18944 28 4 128 > "$OUT/chain_read_7B.txt" 2>&1; echo "chain_read rc=$?" | tee -a "$S"
python3 - <<'PY' 2>&1 | tee -a "$S"
import time
from nanoqwen_rt.engine import Engine
t = time.perf_counter(); eng = Engine("/tmp/q7b.nanoqwen", device="cuda", max_context=641, verify_checksums=False)
print(f"engine load (641 ctx): {time.perf_counter() - t:.3f} s")
be = eng.backend
for ctx in (641, 641, 8192, 33000):
    t = time.perf_counter(); s = be.new_session(ctx); dt = time.perf_counter() - t; be.free_session(s)
    print(f"new_session({ctx}): {dt * 1e3:.1f} ms")
PY
