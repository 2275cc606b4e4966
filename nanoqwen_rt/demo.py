"""The embedded model, ready to run: `demo_model_path()` (and `nanoqwen run --demo`, `chat --demo`, ...).

The package carries the embedded model's source (models/tiny-py, Hugging Face format, f16): the wheel has it in
nanoqwen_rt/demo_model/tiny-py/ (CMakeLists.txt installs it), a checkout or an editable install in models/tiny-py.
On first use it is converted to INT4 (the converter's defaults, as scripts/demo.sh does) into the user's cache,
once; later calls return the cached file. The cache key is the source's bytes and the package version, so an
upgrade that changes either converts again instead of reusing a file made by another version.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

DEMO_MODEL_NAME = "tiny-py"
DEMO_FILE_NAME = f"{DEMO_MODEL_NAME}.int4.nanoqwen"     # served as model id "tiny-py.int4", like the demo's file
_PACKAGED = Path(__file__).resolve().parent / "demo_model" / DEMO_MODEL_NAME       # inside an installed wheel
_CHECKOUT = Path(__file__).resolve().parent.parent / "models" / DEMO_MODEL_NAME    # a checkout / editable install


class DemoModelUnavailable(Exception):
    """The embedded model cannot be found or converted here; the message is one line, meant for the user."""


def demo_source_dir() -> Path:
    """The embedded model's Hugging Face directory: the wheel's copy, else the checkout's models/tiny-py."""
    for d in (_PACKAGED, _CHECKOUT):
        if (d / "model.safetensors").is_file():
            return d
    raise DemoModelUnavailable(f"the embedded model is not installed (looked in {_PACKAGED} and {_CHECKOUT})")


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/nanoqwen, else ~/.cache/nanoqwen (the XDG rule; the package is Linux-only)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nanoqwen"


def _package_version() -> str:
    try:
        from importlib.metadata import version
        return version("nanoqwen")
    except Exception:       # a source tree that was never installed
        return "0+unknown"


def _source_key(src: Path) -> str:
    """A digest of every file of the source and of the package version: what the converted file depends on."""
    h = hashlib.sha256(_package_version().encode())
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def demo_model_path(log=None) -> Path:
    """The embedded model as an INT4 .nanoqwen file, converted into the cache on first use (8 s on 2 cores, up to
    ~40 s in a fresh install, where numba compiles the quantizer first); `log(message)` hears about that conversion. Raises DemoModelUnavailable (one line) when the source is missing
    or the cache cannot be written."""
    src = demo_source_dir()
    out = cache_dir() / "demo" / _source_key(src) / DEMO_FILE_NAME
    if out.is_file():
        return out
    if log is not None:
        log(f"converting the embedded model to INT4 once, into {out}")
    from nanoqwen_quant.convert import ConvertError, convert_checkpoint   # only on first use: it loads numba
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # force: a concurrent first use may have renamed its file into place meanwhile; both are the same model
        return convert_checkpoint(src, out, force=True)
    except ConvertError as e:
        raise DemoModelUnavailable(f"converting the embedded model into {out.parent}: {e}") from None
    except OSError as e:
        raise DemoModelUnavailable(f"cannot write the embedded model's INT4 file into {out.parent}: "
                                   f"{e.strerror or e}") from None
