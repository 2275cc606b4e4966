#!/usr/bin/env bash
# The H200 half of this folder's call.sh, trimmed to fit session 42's last ~400 s of device time: only on an H200
# (exits at once elsewhere), main42 against nowait42 at 512 once each, on the sizes whose #15 verdict rests on the
# H100's ceilings (3B, 1.5B, then the 7B and 0.5B, which session 34 measured on an H200 with older plans).
# carry [".whl", ".out/ceiling42.tar.xz"]; ~150 s.
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu" | tee -a "$OUT/summary.txt"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing to measure"; exit 0 ;; esac
export NANOQWEN_COMMIT="${NQ_REV:-unknown}"
nq_use main42   # the testing library's read probe beside torch's
nq_ab_shape 3B 150 main42 nowait42
nq_ab_shape 1.5B 230 main42 nowait42
nq_ab_shape 7B 330 main42 nowait42
nq_ab_shape 0.5B 380 main42 nowait42
nq_ab_table main42
