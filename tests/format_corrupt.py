"""The corrupt-file corpus of spec §12 for the test suite: one module, spec/vectors/make_corrupt.py, holds the
mutations (Mutator, corrupt_cases); this module re-exports it and builds the base from the shipped golden vector.
The shipped corpus itself is spec/vectors/corrupt/ (written by spec/vectors/make_vectors.py)."""
from __future__ import annotations

import sys
from pathlib import Path

VECTORS = Path(__file__).resolve().parents[1] / "spec" / "vectors"
if str(VECTORS) not in sys.path:
    sys.path.insert(0, str(VECTORS))

from make_corrupt import (  # noqa: E402,F401  (spec/vectors/make_corrupt.py)
    ASYM_BASE_VECTOR, BASE_VECTOR, BLOB_FIELDS, CONFIG_FIELDS, HEADER_FIELDS, KB, L0, LM, MANIFEST, QB, QP, TENSOR_FIELDS, Case, Mutator,
    build_base, case_file, corrupt_cases, header_only_file, write_corpus)

BASE_PATH = VECTORS / f"{BASE_VECTOR}.nanoqwen"
CORRUPT_DIR = VECTORS / "corrupt"


def shipped_base() -> dict:
    """build_base() of the golden vector the corpus derives from."""
    return build_base(BASE_PATH)
