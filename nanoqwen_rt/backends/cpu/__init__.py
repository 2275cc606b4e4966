"""The CPU backend: the numpy + numba reference forward pass (`backend.py`) over the streaming kernels of
`kernels.py`. It is the correctness oracle of the CUDA backend and the fallback where no GPU runs."""
from .backend import CPUBackend, available

__all__ = ["CPUBackend", "available"]
