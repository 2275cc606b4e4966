# Sourced by demo.sh and test.sh: make (once) and activate the project's virtual environment in .venv/.
# Set NANOQWEN_VENV to use another folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NANOQWEN_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[nanoqwen] creating virtual environment in $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
stamp="$venv/.nanoqwen-installed-$1"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  if [ "$1" = test ]; then
    # torch is a test-only dependency (reference models), installed first on its own (the largest download);
    # its version requirement is the one in pyproject.toml's test extra (one place). The pin matters: 2.13.0 has a
    # CPU-only build on the index, while an unpinned install pulls a newer CUDA build and gigabytes of nvidia-* wheels.
    torch_req="$(grep -E '^test = ' "$root/pyproject.toml" | grep -o '"torch[<>=!~][^"]*"' | head -n1 | tr -d '"')"
    python -c "import torch" 2>/dev/null || pip install -q "${torch_req:?no torch requirement in pyproject.toml}"
    pip install -q -e "$root[test]"
  else
    pip install -q -e "$root"
  fi
  touch "$stamp"
fi
# The CUDA library, built incrementally (~2 s when unchanged) when nvcc is present: for the tests always (the compile
# check and the C loader tests run without a GPU), for the demo only when a GPU can run it.
if [ "$1" = test ]; then
  bash "$root/scripts/build_native.sh"
else
  bash "$root/scripts/build_native.sh" --if-gpu
fi
cd "$root"
