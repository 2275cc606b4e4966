"""One production path (CPU test, reads sources only): the product library picks its kernels by measurement, never by
an environment variable, and exports only the documented C API.

Experiments do the opposite on purpose (session 23 swept a `NQ_FRAG_PF` knob and exported a trace function from a
branch build; bench/trace_inject.py and the make_*trace.py scripts of bench/runs write such traces into scratch copies
of csrc). These checks fail if such a
switch or export reaches csrc/src or csrc/include. csrc/dev (standalone experiments) and csrc/testing (the testing
library) are not the product and are not scanned.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_DIRS = [ROOT / "csrc" / "src", ROOT / "csrc" / "include"]
SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp"}


def _sources():
    files = [p for d in PRODUCT_DIRS for p in sorted(d.rglob("*")) if p.suffix in SUFFIXES]
    assert len(files) > 20, f"expected the product sources under {PRODUCT_DIRS}, found {len(files)}"
    return files


def _code(path: Path) -> str:
    """The file without // and /* */ comments (a comment may name a variable it explains)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def test_product_reads_no_environment_variable():
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in _sources()
            for m in re.finditer(r"\b(?:secure_)?getenv\s*\(", _code(p))]
    assert hits == [], "the product library must not switch on the environment: " + "; ".join(hits)


def test_product_exports_only_through_nq_api():
    # NQ_API (csrc/include/nanoqwen.h) is the one place that sets default visibility; every exported function is
    # declared with it in the public headers. A bare visibility attribute elsewhere would export an undocumented symbol.
    where = [p.relative_to(ROOT).as_posix() for p in _sources()
             for _ in re.finditer(r"visibility\s*\(\s*\"default\"\s*\)", _code(p))]
    assert where == ["csrc/include/nanoqwen.h"], f"default visibility outside NQ_API's one definition: {where}"
