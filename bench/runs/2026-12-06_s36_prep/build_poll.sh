#!/usr/bin/env bash
# Session 36's poll variants of handover (call 1a found handover slower than main34 by 5 % at 512 and 15 % on the
# 0.5B, with handover0 at main34's time: the counts cost, not the code): handover_spin (no __nanosleep in the poll)
# and handover_relax (the poll by ld.relaxed without sleep, one ld.acquire once the count is reached: one L1
# invalidation a wait instead of one a poll), both from d432b91, packed with handover and main34 into
# .out/call_poll.tar.xz. Carry [".whl", ".out/call_poll.tar.xz"].
set -euo pipefail
cd "$(dirname "$0")/../../.."
source bench/variants.sh
P=bench/runs/2026-12-06_s36_prep
NQ_BASE=d432b91 nq_build_missing handover_spin $P/handover_spin.patch
NQ_BASE=d432b91 nq_build_missing handover_relax $P/handover_relax.patch
NQ_PACK=.out/call_poll.tar.xz nq_pack_variants handover_relax handover_spin handover_relax handover main34
