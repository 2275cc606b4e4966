"""CUDA backend: ctypes binding of libnanoqwen (csrc/, C ABI in csrc/include/nanoqwen.h).

The library is looked up at $NANOQWEN_LIB, else nanoqwen_rt/lib/libnanoqwen.so (built by scripts/build_native.sh).
ctypes keeps the binary independent of the Python version. Every argument is validated here before the call,
and every non-zero status becomes a Python exception carrying the library's message:
NQ_E_CONTEXT_FULL → ContextFull, NQ_E_INVALID_ARG → ValueError, anything else → BackendError.

CudaBackend follows nanoqwen_rt.backend.Backend exactly (same constructor convention, same state rules);
generate_ids samples on the device (same order of operations as nanoqwen_rt.sampling, its own RNG stream).
"""
from __future__ import annotations

import ctypes
import os
import queue
import threading
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ..base import Backend, BackendError, ContextFull, _as_ids
from ...sampling import SamplingParams

__all__ = ["CudaBackend", "UnsupportedModel", "available", "supports", "load_library", "library_path", "NQ_ERRORS"]

NQ_OK = 0
NQ_ERRORS = {-1: "invalid argument", -2: "I/O error", -3: "format error", -4: "unsupported", -5: "CUDA error",
             -6: "context full", -7: "no CUDA device"}
_E_INVALID_ARG, _E_UNSUPPORTED, _E_CONTEXT_FULL = -1, -4, -6


class NqConfig(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "arch", "n_layers", "hidden_size", "intermediate_size", "n_heads", "n_kv_heads", "head_dim", "vocab_rows",
        "max_positions", "tied_embeddings", "qkv_bias", "rope_scaling_type")] + [
        ("rope_theta", ctypes.c_double), ("rope_scaling_factor", ctypes.c_float), ("rms_norm_eps", ctypes.c_float),
        ("bos_token_id", ctypes.c_int32), ("eos_token_id", ctypes.c_int32), ("pad_token_id", ctypes.c_int32)]


class NqSampling(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int32), ("top_p", ctypes.c_float),
                ("seed", ctypes.c_uint64)]


TOKEN_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_void_p)

_P = ctypes.c_void_p
_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
_U32P = ctypes.POINTER(ctypes.c_uint32)
_U16P = ctypes.POINTER(ctypes.c_uint16)
_SIGNATURES = {
    "nq_last_error": (ctypes.c_char_p, []),
    "nq_abi_version": (ctypes.c_int, []),
    "nq_device_count": (ctypes.c_int, []),
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
    "nq_session_free": (None, [_P]),
    "nq_test_gemv_int4": (ctypes.c_int, [_U32P, _U16P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _F32P, _F32P,
                                         ctypes.c_float, ctypes.c_int32, _F32P]),
    "nq_test_gemv_int4_mode": (ctypes.c_int, [_U32P, _U16P, _U32P, _U16P, ctypes.c_int32, ctypes.c_int32,
                                              ctypes.c_int32, _F32P, _F32P, ctypes.c_float, ctypes.c_int32,
                                              ctypes.c_int32, _F32P]),
    "nq_test_gemv_dense": (ctypes.c_int, [_U16P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _F32P, _F32P]),
    "nq_test_gemm_int4": (ctypes.c_int, [_U32P, _U16P, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _F32P,
                                         ctypes.c_int32, _F32P]),
    "nq_bench_gemv_int4": (ctypes.c_int, [ctypes.c_int32] * 5 + [_F32P]),
    "nq_bench_gemv_int4_mode": (ctypes.c_int, [ctypes.c_int32] * 6 + [_I32P, _F32P]),
    "nq_bench_gemm_int4": (ctypes.c_int, [ctypes.c_int32] * 5 + [_F32P]),
    "nq_test_sample": (ctypes.c_int, [_F32P, ctypes.c_int32, ctypes.POINTER(NqSampling), ctypes.c_uint64, _I32P]),
    "nq_test_attention": (ctypes.c_int, [_F32P, _F32P, _F32P] + [ctypes.c_int32] * 5 + [_F32P]),
    "nq_test_attention_prefill": (ctypes.c_int, [_F32P, _F32P, _F32P] + [ctypes.c_int32] * 5 + [_F32P]),
    "nq_bench_attention": (ctypes.c_int, [ctypes.c_int32] * 8 + [_F32P]),
}
EXPORTED_SYMBOLS = tuple(_SIGNATURES)

_lib = None
_lib_error: str | None = None
_lock = threading.Lock()


def library_path() -> Path:
    env = os.environ.get("NANOQWEN_LIB")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "lib" / "libnanoqwen.so"


def load_library():
    """The loaded CDLL with argtypes set (cached), or raise BackendError saying why not."""
    global _lib, _lib_error
    with _lock:
        if _lib is not None:
            return _lib
        if _lib_error is not None:
            raise BackendError(_lib_error)
        path = library_path()
        try:
            lib = ctypes.CDLL(str(path))
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
        except (OSError, AttributeError) as e:
            _lib_error = f"cannot load libnanoqwen from {path}: {e} (build it with scripts/build_native.sh)"
            raise BackendError(_lib_error) from None
        _lib = lib
        return lib


class UnsupportedModel(BackendError):
    """A valid file that libnanoqwen does not run (e.g. head_dim 32); the CPU backend does."""


def supports(config, tensor_dtypes=None) -> str | None:
    """None when libnanoqwen runs a model of this ModelConfig, else the reason (one line). Mirrors the C loader's
    checks (csrc/src/model.cu load_model), so Engine(device="auto") can pick the CPU backend up front.
    tensor_dtypes: optional {name: DType} of the file's linear weights (f32 linear weights are not run)."""
    c = config
    if c.head_dim not in (64, 128):
        return f"head_dim {c.head_dim} (the CUDA backend runs 64 or 128)"
    if c.rope_scaling_type == "yarn":
        return "yarn rope scaling"
    for name, v in (("hidden_size", c.hidden_size), ("intermediate_size", c.intermediate_size),
                    ("n_heads*head_dim", c.n_heads * c.head_dim)):
        if v % 64:
            return f"{name} = {v} is not a multiple of 64"
    if c.n_heads % c.n_kv_heads or c.n_heads // c.n_kv_heads > 8:
        return f"{c.n_heads} query heads over {c.n_kv_heads} KV heads (at most 8 per KV head)"
    if tensor_dtypes:
        for name, dt in tensor_dtypes.items():
            if name.endswith("proj.weight") or name == "lm_head.weight":
                if int(dt) == 0:
                    return f"{name} is f32 (linear weights must be int4, f16 or bf16)"
    return None


def available() -> bool:
    """True when libnanoqwen loads and at least one CUDA device is visible. Never raises."""
    try:
        return load_library().nq_device_count() > 0
    except Exception:
        return False


def _check(rc: int, what: str) -> None:
    if rc == NQ_OK:
        return
    msg = load_library().nq_last_error()
    msg = msg.decode("utf-8", "replace") if msg else NQ_ERRORS.get(rc, f"status {rc}")
    text = f"{what}: {msg}"
    if rc == _E_CONTEXT_FULL:
        raise ContextFull(text)
    if rc == _E_INVALID_ARG:
        raise ValueError(text)
    if rc == _E_UNSUPPORTED:
        raise UnsupportedModel(text)
    raise BackendError(text)


def _ptr(a: np.ndarray, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _sampling_struct(params: SamplingParams) -> NqSampling:
    params.validate()
    seed = params.seed
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    return NqSampling(float(params.temperature), int(params.top_k), float(params.top_p), int(seed) & (2**64 - 1))


class CudaBackend(Backend):
    """Backend over libnanoqwen: weights in one device allocation, paged f16 KV cache, one CUDA graph per step."""

    name = "cuda"

    def __init__(self, path: str | os.PathLike, *, max_context: int | None = None, file=None):
        self._lib = load_library()
        if self._lib.nq_device_count() <= 0:
            raise BackendError("no CUDA device")
        self.path = os.fspath(path)
        self._model = _P()
        self._sess = _P()
        if file is not None:
            why = supports(file.config, {n: t.dtype for n, t in file.tensors.items()})
            if why is not None:
                raise UnsupportedModel(f"{self.path}: not supported by the CUDA backend: {why}")
        # an already opened handle was checksum-verified by nanoqwen_format: skip the second CRC pass
        verify = 0 if file is not None else 1
        _check(self._lib.nq_model_open(self.path.encode(), verify, ctypes.byref(self._model)),
               f"open {self.path}")
        try:
            if file is not None:
                self.config = file.config
            else:
                from nanoqwen_format import open_file
                with open_file(self.path, verify_checksums=False) as f:
                    self.config = f.config
            c = NqConfig()
            _check(self._lib.nq_model_config(self._model, ctypes.byref(c)), "model config")
            if c.vocab_rows != self.config.vocab_rows or c.n_layers != self.config.n_layers:
                raise BackendError("libnanoqwen and nanoqwen_format disagree on the header")
            if max_context is None:
                max_context = int(self.config.max_positions)
            if isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer)) or max_context < 1:
                raise ValueError(f"max_context must be a positive integer, got {max_context!r}")
            if max_context > self.config.max_positions:
                raise ValueError(f"max_context={max_context} exceeds max_positions={self.config.max_positions}")
            self.max_context = int(max_context)
            greedy = NqSampling(0.0, 0, 1.0, 0)
            _check(self._lib.nq_session_create(self._model, self.max_context, ctypes.byref(greedy),
                                               ctypes.byref(self._sess)), "create session")
        except BaseException:
            self.close()
            raise
        secs, nbytes = ctypes.c_double(), ctypes.c_uint64()
        self._lib.nq_model_load_stats(self._model, ctypes.byref(secs), ctypes.byref(nbytes))
        self.load_seconds = secs.value        # libnanoqwen's own open + upload time
        self.device_bytes = nbytes.value
        self._pos = 0

    # -- state ------------------------------------------------------------------------------------------
    def _live(self):
        if not self._sess:
            raise BackendError("the CUDA backend is closed")
        return self._sess

    @property
    def position(self) -> int:
        p = ctypes.c_int32()
        _check(self._lib.nq_session_position(self._live(), ctypes.byref(p)), "position")
        return int(p.value)

    def reset(self) -> None:
        _check(self._lib.nq_session_reset(self._live()), "reset")

    # -- forward ----------------------------------------------------------------------------------------
    def _logits(self) -> np.ndarray:
        V = self.config.vocab_rows
        out = np.empty(V, dtype=np.float32)      # (vocab_rows,) owned by the caller
        _check(self._lib.nq_get_logits(self._live(), _ptr(out, ctypes.c_float), V), "logits")
        return out

    def prefill(self, ids) -> np.ndarray:
        ids = _as_ids(ids, self.config.vocab_rows)
        if self.position + ids.shape[0] > self.max_context:
            raise ContextFull(f"position {self.position} + {ids.shape[0]} tokens > max_context {self.max_context}")
        _check(self._lib.nq_prefill(self._live(), _ptr(ids, ctypes.c_int32), ids.shape[0]), "prefill")
        return self._logits()

    def decode(self, token_id: int) -> np.ndarray:
        t = int(token_id)
        if not 0 <= t < self.config.vocab_rows:
            raise ValueError(f"token id {t} out of range [0, {self.config.vocab_rows})")
        if self.position + 1 > self.max_context:
            raise ContextFull(f"position {self.position} + 1 token > max_context {self.max_context}")
        _check(self._lib.nq_decode(self._live(), t), "decode")
        return self._logits()

    def logits_all(self, ids) -> np.ndarray:
        ids = _as_ids(ids, self.config.vocab_rows)
        if ids.shape[0] > self.max_context:
            raise ContextFull(f"{ids.shape[0]} tokens > max_context {self.max_context}")
        out = np.empty((ids.shape[0], self.config.vocab_rows), dtype=np.float32)   # (n, vocab_rows)
        _check(self._lib.nq_logits_all(self._live(), _ptr(ids, ctypes.c_int32), ids.shape[0],
                                       _ptr(out, ctypes.c_float)), "logits_all")
        return out

    # -- generation on the device --------------------------------------------------------------------------
    def generate_ids(self, prompt_ids, params: SamplingParams, max_new_tokens: int,
                     stop_token_ids: Iterable[int] = ()) -> Iterator[int]:
        ids = self._check_generate_args(prompt_ids, max_new_tokens)
        sp = _sampling_struct(params)
        stops = np.array(sorted({int(t) for t in stop_token_ids}), dtype=np.int32)
        return self._generate(ids, sp, int(max_new_tokens), stops)

    def _generate(self, ids: np.ndarray, sp: NqSampling, max_new: int, stops: np.ndarray) -> Iterator[int]:
        if max_new == 0:
            return
        sess = self._live()
        _check(self._lib.nq_session_set_sampling(sess, ctypes.byref(sp)), "sampling settings")
        self.reset()
        _check(self._lib.nq_prefill(sess, _ptr(ids, ctypes.c_int32), ids.shape[0]), "prefill")
        q: queue.Queue = queue.Queue()
        cancel = threading.Event()
        done = object()

        def on_token(tok, _user):
            q.put(int(tok))
            return 1 if cancel.is_set() else 0

        cb = TOKEN_CALLBACK(on_token)
        n_out = ctypes.c_int32()
        result: list = []

        def worker():
            try:
                rc = self._lib.nq_generate(sess, max_new, _ptr(stops, ctypes.c_int32) if stops.size else None,
                                           int(stops.size), cb, None, None, ctypes.byref(n_out))
                result.append(rc)
            finally:
                q.put(done)

        th = threading.Thread(target=worker, name="nanoqwen-generate", daemon=True)
        th.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    break
                yield item
        finally:
            cancel.set()
            th.join()
        if result and result[0] != NQ_OK:
            _check(result[0], "generate")

    # -- lifetime ------------------------------------------------------------------------------------------
    def close(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if getattr(self, "_sess", None):
            lib.nq_session_free(self._sess)
            self._sess = _P()
        if getattr(self, "_model", None):
            lib.nq_model_free(self._model)
            self._model = _P()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def describe(self) -> str:
        return (f"cuda (libnanoqwen), {self.device_bytes / 1e9:.2f} GB of weights on the device, "
                f"kv f16 paged, max_context {self.max_context}")
