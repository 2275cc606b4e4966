"""Shared pytest setup: the `gpu` marker skips cleanly when no CUDA device is usable; the CLI/server tests' model
file and CPU engine fixtures (one definition for test_cli, test_server and test_server_gpu)."""
import pytest


def _cuda_available() -> bool:
    try:
        from nanoqwen_rt.backends import cuda as cuda_backend  # noqa: F401  (the CUDA binding; available() never raises)
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


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """The CLI/server test model (tests/test_server_model.py: built once per session, then cached)."""
    from test_server_model import build_model_file
    return build_model_file(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def engine(model_path):
    """An in-process CPU Engine on model_path, the reference the CLI/server output is compared with."""
    from nanoqwen_rt import Engine
    eng = Engine(model_path, device="cpu")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def no_fim_model_path(tmp_path_factory):
    """A model file whose tokenizer lacks the FIM tokens (tests/test_server_model.py: built once per session)."""
    from test_server_model import build_no_fim_model_file
    return build_no_fim_model_file(tmp_path_factory.mktemp("no-fim"))
