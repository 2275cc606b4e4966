#!/usr/bin/env bash
# Session 41 §2: csrc/dev/mlp_phases (the MLP as one grid-wide phase with its down partials reduced by atomics, or
# by clusters then atomics, against today's two PDL phases; no weight bytes) on the 7B's, 0.5B's and 14B's widths.
# Built here (make -C csrc/dev), carried: carry ["build/dev/mlp_phases"]. ~30 s.
set -uo pipefail
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name --format=csv,noheader
out="${OUT:-/tmp}/mlp_phases.txt"
for args in "28" "24 896 4864 14 2 64" "48 5120 13824 40 8 128"; do
  timeout 120 build/dev/mlp_phases $args 2>&1 | tee -a "$out"
done
