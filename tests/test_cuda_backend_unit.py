"""CPU tests of the CUDA backend's Python side, against fake libraries (no GPU, no libnanoqwen needed): the error
of a call is read on the thread that made it, statuses map to named exceptions (out of memory → MemoryError),
supports() asks the library, and the reasons why the library cannot load are named."""
from __future__ import annotations

import ctypes
import threading
import types

import numpy as np
import pytest

from nanoqwen_rt.backends import BackendError, ContextFull
from nanoqwen_rt.backends.cuda import abi, backend as cuda_backend


class FakeLib:
    """The few entry points under test, with a thread-local nq_last_error as libnanoqwen keeps it."""

    def __init__(self, model_check_rc=None, model_check_msg=b""):
        self._tls = threading.local()
        if model_check_rc is not None:
            def nq_model_check(path):
                if model_check_rc:
                    self._fail(model_check_msg)
                return model_check_rc
            self.nq_model_check = nq_model_check

    def _fail(self, msg: bytes):
        self._tls.msg = msg

    def nq_last_error(self):
        return getattr(self._tls, "msg", None)

    def nq_generate(self, sess, max_new, stops, n_stop, cb, user, out, n_out):
        for tok in (7, 8):                     # two tokens, then a failure inside "the library"
            cb(tok, None)
        self._fail(b"generate launch: out of resources (from the worker)")
        return abi.NQ_E_CUDA


def test_generation_error_is_read_on_the_worker_thread():
    lib = FakeLib()
    lib._fail(b"stale message of an earlier call on the caller's thread")
    got = []
    with pytest.raises(BackendError) as e:
        for tok in cuda_backend.stream_tokens(lib, None, 5, np.zeros(0, dtype=np.int32)):
            got.append(tok)
    assert got == [7, 8]                       # the tokens produced before the failure arrive first
    assert str(e.value) == "generate: generate launch: out of resources (from the worker)"


def test_call_reads_the_message_only_on_failure():
    lib = FakeLib(model_check_rc=0)
    lib._fail(b"stale")
    assert abi.call(lib, "nq_model_check", b"x") == (abi.NQ_OK, "")


@pytest.mark.parametrize("rc,cls", [(abi.NQ_E_CONTEXT_FULL, ContextFull), (abi.NQ_E_INVALID_ARG, ValueError),
                                    (abi.NQ_E_UNSUPPORTED, abi.UnsupportedModel),
                                    (abi.NQ_E_OUT_OF_MEMORY, MemoryError), (abi.NQ_E_CUDA, BackendError),
                                    (abi.NQ_E_FORMAT, BackendError)])
def test_status_maps_to_a_named_exception(rc, cls):
    e = abi.error_for_status(rc, "the library's words", "open m.nanoqwen")
    assert isinstance(e, cls) and str(e) == "open m.nanoqwen: the library's words"


def test_out_of_memory_is_a_memory_error_and_a_backend_error():
    e = abi.error_for_status(abi.NQ_E_OUT_OF_MEMORY, "", "create session")
    assert isinstance(e, abi.OutOfDeviceMemory) and isinstance(e, MemoryError) and isinstance(e, BackendError)
    assert str(e) == "create session: NQ_E_OUT_OF_MEMORY"      # no message from the library: the status name


def test_status_table_is_the_header_enum():
    assert abi.NQ_STATUS == {"NQ_OK": 0, "NQ_E_INVALID_ARG": -1, "NQ_E_IO": -2, "NQ_E_FORMAT": -3,
                             "NQ_E_UNSUPPORTED": -4, "NQ_E_CUDA": -5, "NQ_E_CONTEXT_FULL": -6,
                             "NQ_E_NO_DEVICE": -7, "NQ_E_OUT_OF_MEMORY": -8}
    assert ctypes.sizeof(abi.NqSampling) == 24


@pytest.fixture
def fake_loaded(monkeypatch):
    """Install a fake as the loaded library."""
    def install(lib):
        monkeypatch.setattr(abi, "_lib", lib)
        monkeypatch.setattr(abi, "_lib_error", None)
    return install


def test_supports_asks_the_library(fake_loaded):
    fake_loaded(FakeLib(model_check_rc=abi.NQ_E_UNSUPPORTED, model_check_msg=b"head_dim 32 (runs 64 or 128)"))
    assert cuda_backend.supports("m.nanoqwen") == "head_dim 32 (runs 64 or 128)"
    fake_loaded(FakeLib(model_check_rc=abi.NQ_OK))
    assert cuda_backend.supports("m.nanoqwen") is None


def test_supports_names_a_library_without_model_check(fake_loaded):
    fake_loaded(FakeLib())
    with pytest.raises(abi.LibraryUnavailable, match="lacks nq_model_check"):
        cuda_backend.supports("m.nanoqwen")


def _complete_fake(version=abi.NQ_ABI_VERSION, drop=()):
    ns = types.SimpleNamespace()
    for name in abi.SIGNATURES:
        if name not in drop:
            setattr(ns, name, types.SimpleNamespace())
    ns.nq_abi_version = lambda: version
    return ns


def test_bind_names_a_missing_symbol_and_an_abi_mismatch(tmp_path):
    with pytest.raises(abi.LibraryUnavailable, match="lacks nq_generate"):
        abi._bind(_complete_fake(drop=("nq_generate",)), tmp_path / "lib.so")
    with pytest.raises(abi.LibraryUnavailable, match=f"ABI version 99, this binding expects {abi.NQ_ABI_VERSION}"):
        abi._bind(_complete_fake(version=99), tmp_path / "lib.so")


def test_load_reasons_are_named_and_available_never_raises(monkeypatch, tmp_path):
    monkeypatch.setattr(abi, "_lib", None)
    monkeypatch.setattr(abi, "_lib_error", None)
    monkeypatch.setenv("NANOQWEN_LIB", str(tmp_path / "missing.so"))
    assert cuda_backend.available() is False
    assert "libnanoqwen not found at" in cuda_backend.unavailable_reason()
    with pytest.raises(abi.LibraryUnavailable, match="missing.so"):
        abi.load_library()
    monkeypatch.setattr(abi, "_lib_error", None)
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF but not really")
    monkeypatch.setenv("NANOQWEN_LIB", str(junk))
    why = cuda_backend.unavailable_reason()
    assert why.startswith(f"cannot load {junk}: ") and len(why) > len(f"cannot load {junk}: ")   # dlopen's text


def test_no_device_is_named(fake_loaded):
    lib = FakeLib()
    lib.nq_device_count = lambda: 0
    fake_loaded(lib)
    assert "sees no CUDA device (nq_device_count() = 0)" in cuda_backend.unavailable_reason()
