#!/usr/bin/env bash
# Session 31 call 2 (bench/NOTES.md "Session 31" §2): the merge with a warp a head for the split weights and f16
# partials (mwf = 21c63a5 + that change), and the candidate (cand = mwf + kAttnClusterKeysPerBlock 512), against
# main32 (21c63a5) and cl512 (21c63a5 + 512 keys a cluster block: call 1's winner at 2K). The candidate's attention
# tests, racecheck and synccheck; the merge traced in the decode chain at 8K (ctrace = cand + call 6's attention
# trace + session 30's prep/make_merge_trace.py + session 25's GEMV trace); the decode A/B at 2K, 4,000 tokens (the
# short graph's last length with 512 keys a block), 8K, 32K, 512, and 0.5B at 2K / 4,000.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
python3 bench/make_7b_file.py /tmp/q7b.nanoqwen --quiet > /dev/null 2>&1
NANOQWEN_LIB=$PWD/.v/ctrace/libnanoqwen.so timeout 60 python3 bench/runs/2026-12-04_s30_call6/chain_trace.py \
  /tmp/q7b.nanoqwen 8192 2>&1 | tail -37 | tee -a "$OUT/summary.txt"
nq_use cand
nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "cand " "$m" racecheck synccheck
for rep in 1 2; do
  for v in main32 cl512 cand; do nq_ab "$v" 2048 "$rep"; done
  for v in main32 cl512 mwf cand; do nq_ab "$v" 4000 "$rep"; done
  for v in main32 mwf; do nq_ab "$v" 8192 "$rep"; done
done
for v in main32 mwf; do nq_ab "$v" 32000 1; done
for v in main32 cand; do nq_ab "$v" 512 1; done
python3 bench/make_7b_file.py /tmp/s.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for p in 2048 4000; do for v in main32 cand; do nq_ab "$v" "$p" 1 /tmp/s.nanoqwen 0.5B; done; done
