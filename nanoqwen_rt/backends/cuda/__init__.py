"""The CUDA backend: a ctypes binding of libnanoqwen (csrc/, C ABI in csrc/include/nanoqwen.h)."""
from .backend import CudaBackend, UnsupportedModel, available, load_library, library_path, supports

__all__ = ["CudaBackend", "UnsupportedModel", "available", "load_library", "library_path", "supports"]
