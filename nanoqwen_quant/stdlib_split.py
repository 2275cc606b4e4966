"""The train / held-out split of the Python standard library: one rule for the embedded model's training
(models/train_tiny_py.py), the --mode gptq calibration text (nanoqwen_quant.calibrate: training side only) and the
evaluation text (nanoqwen_quant/data/eval_heldout.txt, bench/quality.py: held-out side only).

A file is a relative posix path under the interpreter's stdlib directory, a `.py` file no larger than
MAX_FILE_BYTES outside EXCLUDED_DIRS. It is held out when the first 8 bytes of sha256(path), read little-endian,
mod 10000 are below HELDOUT_PER_10K (about 5 % of files). models/tiny-py was trained with exactly these constants
(models/tiny-py/heldout_files.txt lists its held-out files); changing any of them changes what that model saw.

Standard library only: models/train_tiny_py.py imports it without the rest of the package's dependencies.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__"})
MAX_FILE_BYTES = 200 * 1024
HELDOUT_PER_10K = 500          # 5 % of files, chosen by hash of the relative path


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def path_hash(rel: str) -> int:
    """First 8 bytes of sha256(rel), little-endian."""
    return int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "little")


def is_heldout(rel: str) -> bool:
    return path_hash(rel) % 10000 < HELDOUT_PER_10K


def list_stdlib_files(root: Path | None = None) -> list[str]:
    """Relative posix paths of the selected stdlib `.py` files (both sides of the split), sorted."""
    root = stdlib_root() if root is None else root
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        try:
            if not p.is_file() or p.stat().st_size > MAX_FILE_BYTES:
                continue
        except OSError:
            continue
        out.append(rel.as_posix())
    return sorted(out)


def read_text(root: Path, rel: str) -> str | None:
    """The file's text, or None when it is not UTF-8 or cannot be read."""
    try:
        return (root / rel).read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
