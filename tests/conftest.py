"""Shared pytest setup: the `gpu` marker skips cleanly when no CUDA device is usable."""
import pytest


def _cuda_available() -> bool:
    try:
        from nanoqwen_rt import cuda_backend  # noqa: F401  (arrives with step 4)
        return cuda_backend.available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device / libnanoqwen not built")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
