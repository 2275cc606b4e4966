#!/usr/bin/env bash
# Quick start, command 2: set up .venv and run the test suite (GPU tests skip without CUDA).
source "$(dirname "$0")/_env.sh" test
set +e
python -m pytest -q "$@"
rc=$?
# pytest exits 5 when it collected no test: that is not a failure of the code under test.
if [ "$rc" -eq 5 ]; then echo "no tests collected"; exit 0; fi
exit "$rc"
