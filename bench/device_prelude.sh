# Sourced by a device call's script (bench/runs/<date>_<call>/call.sh, run as `bash bench/runs/.../call.sh` by the
# device tool): from the repository root, unpack every carried .out/*.tar.xz (libraries built here, a base tree,
# variant libraries), install the carried wheels (.whl/, see bench/gpu_check.sh) into /tmp/site, and export
# PYTHONPATH and OUT (the folder whose files come back).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
for f in .out/*.tar.xz; do tar -xJf "$f"; done
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD:$PWD/tests" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nq_out}"; mkdir -p "$OUT"
