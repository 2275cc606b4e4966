"""Compute backends. `base.Backend` is the contract; `cpu/` is the numpy + numba reference, `cuda/` the ctypes
binding of libnanoqwen. The Engine picks one (nanoqwen_rt/engine.py)."""
from .base import Backend, BackendError, ContextFull

__all__ = ["Backend", "BackendError", "ContextFull"]
