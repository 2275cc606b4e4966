"""The CUDA backend: `backend.py` (CudaBackend; its module docstring names the call path of one decode step down
to the kernels) over `abi.py` (the ctypes binding of libnanoqwen's C ABI: status codes, structures, signatures,
loading; the C header is csrc/include/nanoqwen.h)."""
from .abi import LibraryUnavailable, OutOfDeviceMemory, UnsupportedModel, library_path, load_library
from .backend import CudaBackend, available, supports, unavailable_reason

__all__ = ["CudaBackend", "UnsupportedModel", "OutOfDeviceMemory", "LibraryUnavailable", "available",
           "unavailable_reason", "supports", "load_library", "library_path"]
