#!/usr/bin/env bash
# Session 25 call 6 (the session's last device seconds): qstage = b268507 + the decode attention's q / k / v staging
# with every global load issued before any use (call 4's trace: wait -> q staged 0.82 us at 512 keys). Frag GEMV /
# attention / switch tests and racecheck with qstage; attn_bench obuf (b268507) vs qstage.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"   # helpers factored out after the run, same commands
nq_use qstage
nq_quick_tests
m=$(nq_sanitizer_model tiny); nq_sanitize "qstage " "$m" racecheck
for v in obuf qstage; do nq_attn_bench $v 40; done
