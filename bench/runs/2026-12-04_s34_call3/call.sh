#!/usr/bin/env bash
# Session 34 call 3 (lost: the machine stopped answering; run it next): the GPU suite, the decode bench with peers, the
# long prompts and the sanitizers on main with branch wip/s34-b256's commit applied (the short-context cluster bound
# at 2,048 keys at D 128: `git cherry-pick 00edda7`, then `JOBS=2 bash scripts/build_native.sh`, then pack
# build/lib/libnanoqwen_testing.so into .out/testing.tar.xz and main34 / b256 into .out/variants.tar.xz with
# bench/variants.sh; set NQ_REV to the tree's commit; both archs built here, the product library
# carried in nanoqwen_rt/lib, the testing one packed in .out/testing.tar.xz), then the 0.5B bound check. Carry [".whl", ".out", "nanoqwen_rt/lib"].
set -uo pipefail
cd "$(dirname "$0")/../../.."
for f in .out/*.tar.xz; do tar -xJf "$f"; done
NANOQWEN_COMMIT="${NQ_REV:-unknown}" bash bench/gpu_check.sh tests,bench,long,sanitize
# the bound's check on the 0.5B (D 64: 4,096 keys with b256, 6,144 with main34), .v/ from .out/variants.tar.xz
source bench/device_prelude.sh
python3 bench/make_7b_file.py /tmp/s05.nanoqwen --shape 0.5B --quiet > /dev/null 2>&1
for p in 4500 5500; do for v in main34 b256; do nq_ab "$v" "$p" 1 /tmp/s05.nanoqwen 0.5B; done; done
