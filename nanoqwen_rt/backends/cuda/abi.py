"""libnanoqwen's C ABI as Python sees it, in one module: the status codes, the ctypes structures, the signature of
every production entry point, loading the library, and turning a status into a Python exception.

The C header is csrc/include/nanoqwen.h; a contract test compares NQ_STATUS, NqConfig and NqSampling field by field
with the library's own nq_abi_describe(). The test/bench entry points (nq_test_*, nq_bench_*) live in a separate
testing library and are not bound here: the product never depends on them.

Thread rule: nq_last_error() is thread-local. Read it on the thread that made the failing call (`call` does), never
later on another thread.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from ..base import BackendError, ContextFull

__all__ = ["NQ_ABI_VERSION", "NQ_STATUS", "NQ_OK", "NqConfig", "NqSampling", "TOKEN_CALLBACK", "SIGNATURES",
           "OPTIONAL_SIGNATURES", "EXPORTED_SYMBOLS", "LibraryUnavailable", "UnsupportedModel", "OutOfDeviceMemory",
           "library_path", "load_library", "has_symbol", "call", "check", "error_for_status", "last_error"]

#: the ABI version this binding is written against (nq_abi_version() must return it)
NQ_ABI_VERSION = 6
#: most sessions one nq_decode_batch step takes (nanoqwen.h NQ_MAX_BATCH)
NQ_MAX_BATCH = 256
#: most pages one nq_kv_pool_create takes (nanoqwen.h NQ_MAX_KV_POOL_PAGES)
NQ_MAX_KV_POOL_PAGES = 1 << 24

# enum nq_status
NQ_OK = 0
NQ_E_INVALID_ARG = -1     # a NULL handle, a size out of range, an id out of range
NQ_E_IO = -2              # open/mmap/read failed
NQ_E_FORMAT = -3          # the file breaks the NANOQWEN v1 spec (message names the rule and field)
NQ_E_UNSUPPORTED = -4     # a valid file with a feature this library does not run
NQ_E_CUDA = -5            # a CUDA call or kernel launch failed
NQ_E_CONTEXT_FULL = -6    # the tokens would not fit in the session's max_context
NQ_E_NO_DEVICE = -7       # no CUDA device
NQ_E_OUT_OF_MEMORY = -8   # host or device allocation failed
NQ_STATUS = {"NQ_OK": NQ_OK, "NQ_E_INVALID_ARG": NQ_E_INVALID_ARG, "NQ_E_IO": NQ_E_IO, "NQ_E_FORMAT": NQ_E_FORMAT,
             "NQ_E_UNSUPPORTED": NQ_E_UNSUPPORTED, "NQ_E_CUDA": NQ_E_CUDA, "NQ_E_CONTEXT_FULL": NQ_E_CONTEXT_FULL,
             "NQ_E_NO_DEVICE": NQ_E_NO_DEVICE, "NQ_E_OUT_OF_MEMORY": NQ_E_OUT_OF_MEMORY}
_STATUS_NAME = {v: k for k, v in NQ_STATUS.items()}


class NqConfig(ctypes.Structure):
    """struct nq_config."""
    _fields_ = [(n, ctypes.c_int32) for n in (
        "arch", "n_layers", "hidden_size", "intermediate_size", "n_heads", "n_kv_heads", "head_dim", "vocab_rows",
        "max_positions", "tied_embeddings", "qkv_bias", "rope_scaling_type")] + [
        ("rope_theta", ctypes.c_double), ("rope_scaling_factor", ctypes.c_float), ("rms_norm_eps", ctypes.c_float),
        ("bos_token_id", ctypes.c_int32), ("eos_token_id", ctypes.c_int32), ("pad_token_id", ctypes.c_int32),
        ("rope_original_max_positions", ctypes.c_int32)]


class NqSampling(ctypes.Structure):
    """struct nq_sampling."""
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int32), ("top_p", ctypes.c_float),
                ("seed", ctypes.c_uint64)]


#: typedef int (*nq_token_callback)(int32_t token, void* user): non-zero asks generation to stop
TOKEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_void_p)

_P = ctypes.c_void_p
_U64P = ctypes.POINTER(ctypes.c_uint64)
_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
#: every production entry point the binding needs: a library without one of them does not load
SIGNATURES = {
    "nq_last_error": (ctypes.c_char_p, []),
    "nq_abi_version": (ctypes.c_int, []),
    "nq_device_count": (ctypes.c_int, []),
    "nq_device_memory": (ctypes.c_int, [_U64P, _U64P]),
    "nq_model_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(_P)]),
    "nq_model_config": (ctypes.c_int, [_P, ctypes.POINTER(NqConfig)]),
    "nq_model_load_stats": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_uint64)]),
    "nq_model_free": (None, [_P]),
    "nq_session_create": (ctypes.c_int, [_P, ctypes.c_int32, ctypes.POINTER(NqSampling), ctypes.POINTER(_P)]),
    "nq_session_set_sampling": (ctypes.c_int, [_P, ctypes.POINTER(NqSampling)]),
    "nq_session_reset": (ctypes.c_int, [_P]),
    "nq_session_position": (ctypes.c_int, [_P, _I32P]),
    "nq_prefill": (ctypes.c_int, [_P, _I32P, ctypes.c_int32]),
    "nq_decode": (ctypes.c_int, [_P, ctypes.c_int32]),
    "nq_get_logits": (ctypes.c_int, [_P, _F32P, ctypes.c_int32]),
    "nq_logits_all": (ctypes.c_int, [_P, _I32P, ctypes.c_int32, _F32P]),
    "nq_generate": (ctypes.c_int, [_P, ctypes.c_int32, _I32P, ctypes.c_int32, TOKEN_CALLBACK, _P, _I32P, _I32P]),
    "nq_sample_steered": (ctypes.c_int, [_P, _I32P, _F32P, ctypes.c_int32, _I32P, ctypes.c_int32, ctypes.c_float,
                                         ctypes.c_float, ctypes.c_int32, _I32P, _F32P, _I32P, _F32P, _I32P]),
    "nq_session_free": (None, [_P]),
    "nq_batch_create": (ctypes.c_int, [_P, ctypes.c_int32, ctypes.POINTER(_P)]),
    "nq_decode_batch": (ctypes.c_int, [_P, ctypes.POINTER(_P), _I32P, ctypes.c_int32, _I32P, _F32P,
                                       ctypes.c_int32]),
    "nq_decode_batch_launch": (ctypes.c_int, [_P, ctypes.POINTER(_P), _I32P, _I32P, ctypes.c_int32]),
    "nq_decode_batch_wait": (ctypes.c_int, [_P, _I32P, ctypes.c_int32]),
    "nq_batch_free": (None, [_P]),
    "nq_kv_page_bytes": (ctypes.c_int, [_P, _U64P]),
    "nq_kv_pool_create": (ctypes.c_int, [_P, ctypes.c_int32, ctypes.POINTER(_P)]),
    "nq_kv_pool_poison": (ctypes.c_int, [_P, _I32P, ctypes.c_int32]),
    "nq_kv_pool_free": (None, [_P]),
    "nq_session_create_pooled": (ctypes.c_int, [_P, _P, ctypes.c_int32, ctypes.POINTER(NqSampling),
                                                ctypes.POINTER(_P)]),
    "nq_session_set_pages": (ctypes.c_int, [_P, _I32P, ctypes.c_int32, ctypes.c_int32]),
}
#: production entry points newer than some libraries in use: bound when present; each caller says what it does
#: without one (supports() names the missing symbol; CudaBackend lets nq_model_open give the reason instead)
OPTIONAL_SIGNATURES = {
    "nq_model_check": (ctypes.c_int, [ctypes.c_char_p]),
    "nq_abi_describe": (ctypes.c_char_p, []),
}
#: the production C ABI as this binding knows it (what `nm -D` of libnanoqwen.so must list)
EXPORTED_SYMBOLS = tuple(SIGNATURES) + tuple(OPTIONAL_SIGNATURES)


class LibraryUnavailable(BackendError):
    """libnanoqwen cannot be used here: missing file, dlopen error, missing symbol or ABI version mismatch."""


class UnsupportedModel(BackendError):
    """A valid file that libnanoqwen does not run (NQ_E_UNSUPPORTED); the CPU backend does."""


class OutOfDeviceMemory(BackendError, MemoryError):
    """NQ_E_OUT_OF_MEMORY: a host or device allocation in libnanoqwen failed (message: what and how much)."""


_lib = None
_lib_error: str | None = None
_lock = threading.Lock()


def library_path() -> Path:
    """$NANOQWEN_LIB, else nanoqwen_rt/lib/libnanoqwen.so (where scripts/build_native.sh puts it)."""
    env = os.environ.get("NANOQWEN_LIB")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "lib" / "libnanoqwen.so"


def _bind(lib, path: Path):
    for name, (res, args) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryUnavailable(f"{path} lacks {name}: it was built from other sources than this binding "
                                     f"(rebuild with scripts/build_native.sh)") from None
        fn.restype, fn.argtypes = res, args
    for name, (res, args) in OPTIONAL_SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = res, args
    version = lib.nq_abi_version()
    if version != NQ_ABI_VERSION:
        raise LibraryUnavailable(f"{path} has ABI version {version}, this binding expects {NQ_ABI_VERSION} "
                                 f"(rebuild with scripts/build_native.sh)")
    return lib


def load_library():
    """The loaded CDLL with every signature set (cached), or LibraryUnavailable saying exactly why not."""
    global _lib, _lib_error
    with _lock:
        if _lib is not None:
            return _lib
        if _lib_error is not None:
            raise LibraryUnavailable(_lib_error)
        path = library_path()
        try:
            if not path.is_file():
                raise LibraryUnavailable(f"libnanoqwen not found at {path} (build it with scripts/build_native.sh, "
                                         f"or point NANOQWEN_LIB at it)")
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                raise LibraryUnavailable(f"cannot load {path}: {e}") from None
            _lib = _bind(lib, path)
        except LibraryUnavailable as e:
            _lib_error = str(e)
            raise
        return _lib


def has_symbol(lib, name: str) -> bool:
    return getattr(lib, name, None) is not None


def last_error(lib) -> str:
    """nq_last_error() of THIS thread, decoded ("" when none)."""
    msg = lib.nq_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def call(lib, name: str, *args) -> tuple[int, str]:
    """Call entry point `name`; return (status, message), the message read on this same thread ("" on NQ_OK)."""
    rc = getattr(lib, name)(*args)
    return rc, (last_error(lib) if rc != NQ_OK else "")


def error_for_status(rc: int, message: str, what: str) -> Exception:
    """The Python exception of a non-zero status: NQ_E_CONTEXT_FULL → ContextFull, NQ_E_INVALID_ARG →
    ValueError, NQ_E_UNSUPPORTED → UnsupportedModel, NQ_E_OUT_OF_MEMORY → OutOfDeviceMemory (a MemoryError),
    anything else → BackendError. The text: `what: message` (the status name when the library gave none)."""
    text = f"{what}: {message or _STATUS_NAME.get(rc, f'status {rc}')}"
    if rc == NQ_E_CONTEXT_FULL:
        return ContextFull(text)
    if rc == NQ_E_INVALID_ARG:
        return ValueError(text)
    if rc == NQ_E_UNSUPPORTED:
        return UnsupportedModel(text)
    if rc == NQ_E_OUT_OF_MEMORY:
        return OutOfDeviceMemory(text)
    return BackendError(text)


def check(lib, name: str, *args, what: str | None = None) -> None:
    """Call entry point `name` and raise error_for_status(...) unless it returns NQ_OK."""
    rc, msg = call(lib, name, *args)
    if rc != NQ_OK:
        raise error_for_status(rc, msg, what or name)
