#!/usr/bin/env bash
# Session 29 call 6: every size on cbc9f58's product library (the uniform shared-memory split).
set -uo pipefail
source "$(dirname "$0")/../../device_prelude.sh"
nq_sizes cbc9f58
