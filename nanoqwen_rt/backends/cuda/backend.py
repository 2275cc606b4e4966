"""CUDA backend: CudaBackend over libnanoqwen (csrc/), through the ctypes binding of abi.py.

CudaBackend follows nanoqwen_rt.backends.base.Backend exactly (same constructor convention, same state rules; the
base class validates every argument once, the methods here trust them); generate_ids samples on the device (same
order of operations as nanoqwen_rt.sampling, its own RNG stream). Every non-zero status becomes a Python exception
carrying the library's message, read on the thread that made the call (abi.error_for_status says which class).

Where one decode step happens (Engine.generate → ... → kernels):
  Engine.generate → Backend.generate_ids (checks) → CudaBackend._generate_ids: nq_session_set_sampling, nq_prefill,
  then `stream_tokens`, which runs ctypes nq_generate on a worker thread and yields each token its callback
  delivers → C++ session_generate (csrc/src/session.cu): `launch_one` replays the decode+sample CUDA graph
  (`step_exec`, captured once in session_create from enqueue_decode + enqueue_sample), up to 8 steps ahead of the
  host → the kernels of one step (enqueue_decode): embed_token, then per layer gemv (RMSNorm + fused QKV),
  attention (RoPE, paged KV write, split-K decode attention), gemv (o_proj, residual add), gemv (RMSNorm +
  gate/up + SwiGLU), gemv (down_proj, residual add); then gemv (final RMSNorm + lm_head), then the sampler.
  `decode()` (one step, logits back to the host) goes ctypes nq_decode → session_decode → the decode-only graph
  (`graph_exec`) → the same kernels.
  A steered generation (logprobs, logit_bias, penalties, a grammar: Backend.generate_steered) goes
  CudaBackend._generate_steered: per token, the grammar's bitmask (host, llguidance) → ctypes nq_sample_steered →
  session_sample_steered (penalties + mask + bias, the device sampler, log-softmax + top-N: csrc/src/steer.cu; only
  the token and its logprobs are copied back) → nq_decode of that token (the decode-only graph), which returns once
  the step is enqueued, so the next token's mask is computed on the host while the device runs the step.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import os
import queue
import threading
from typing import Iterator

import numpy as np

from ..base import Backend, BackendError, SequenceKv, resolve_max_context
from ...logits import TokenLogprob
from ...sampling import SamplingParams
from . import abi
from .abi import (NQ_OK, TOKEN_CALLBACK, LibraryUnavailable, NqConfig, NqSampling, UnsupportedModel, check,
                  error_for_status, has_symbol, load_library)

__all__ = ["CudaBackend", "SessionKv", "UnsupportedModel", "KvPoolDoesNotFit", "KV_FREE_MEMORY_FRACTION", "available",
           "unavailable_reason", "supports", "stream_tokens", "device_memory", "kv_pool_pages"]

_P = ctypes.c_void_p

# Share of the device memory free after the weights and the backend's own session that the batched API's KV page
# pool may take when no --kv-pages is given (default_kv_pages; at most max_batch full contexts). The rest is left
# for what the batch allocates after the pool: nq_batch_create's rows (~0.9 MB per sequence at 7B shapes: logits,
# activations), each sequence's pooled session (~4 MB: logits, sampler and attention buffers, two CUDA graphs), a
# nq_logits_all's logits (512 rows x vocab floats, ~0.3 GB at 7B) and the CUDA context's own growth; a tenth
# of an H200's free memory is ~12 GB, far more than these need at any max_batch.
KV_FREE_MEMORY_FRACTION = 0.9


def device_memory(lib) -> tuple[int, int]:
    """(free, total) bytes of the current device now (nq_device_memory: cudaMemGetInfo)."""
    free, total = ctypes.c_uint64(), ctypes.c_uint64()
    check(lib, "nq_device_memory", ctypes.byref(free), ctypes.byref(total), what="device memory")
    return int(free.value), int(total.value)


def kv_pool_pages(max_context: int, max_batch: int, page_bytes: int, free_bytes: int) -> int:
    """The CUDA backend's default pool: max_batch full contexts within KV_FREE_MEMORY_FRACTION of free_bytes.
    Raises KvPoolDoesNotFit when that budget does not hold one full context."""
    from ...scheduler import default_kv_pages
    budget = int(free_bytes * KV_FREE_MEMORY_FRACTION)
    n = default_kv_pages(max_context, max_batch, page_bytes, budget)
    if n * page_bytes > budget:
        raise KvPoolDoesNotFit(
            f"one full context of {max_context} tokens needs {n} KV pages ({n * page_bytes / 2**30:.2f} GiB); "
            f"the GPU has {free_bytes / 2**30:.2f} GiB free, of which {KV_FREE_MEMORY_FRACTION:.0%} goes to KV "
            f"pages by default: pass a smaller max_context (--max-context) or kv_pages (--kv-pages)")
    return n


class KvPoolDoesNotFit(BackendError):
    """The default KV page pool (KV_FREE_MEMORY_FRACTION of the free device memory) holds less than one full
    context."""


def unavailable_reason() -> str | None:
    """None when libnanoqwen loads and sees a CUDA device, else the reason in one line (missing file, dlopen error
    text, missing symbol, ABI version mismatch, no device). Never raises."""
    try:
        lib = load_library()
    except LibraryUnavailable as e:
        return str(e)
    try:
        n = lib.nq_device_count()
    except Exception as e:     # a library that loads but cannot query: say so rather than guess
        return f"nq_device_count failed: {type(e).__name__}: {e}"
    if n <= 0:
        return f"libnanoqwen ({abi.library_path()}) sees no CUDA device (nq_device_count() = {n})"
    return None


def available() -> bool:
    """True when libnanoqwen loads and at least one CUDA device is visible. Never raises."""
    return unavailable_reason() is None


def supports(path: str | os.PathLike) -> str | None:
    """None when libnanoqwen runs the file at `path`, else the library's one-line reason (nq_model_check: spec
    rules without checksums, and the model features this library runs). Asks the library, so the rules live
    in one place (csrc). Raises LibraryUnavailable when the library cannot load or predates nq_model_check."""
    lib = load_library()
    if not has_symbol(lib, "nq_model_check"):
        raise LibraryUnavailable(f"{abi.library_path()} lacks nq_model_check: built from older sources than this "
                                 f"binding (rebuild with scripts/build_native.sh)")
    rc, msg = abi.call(lib, "nq_model_check", os.fspath(path).encode())
    return None if rc == NQ_OK else (msg or f"status {rc}")


def _ptr(a: np.ndarray, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _sampling_struct(params: SamplingParams) -> NqSampling:
    seed = params.seed
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    return NqSampling(float(params.temperature), int(params.top_k), float(params.top_p), int(seed) & (2**64 - 1))


def stream_tokens(lib, sess, max_new: int, stops: np.ndarray,
                  executor: concurrent.futures.Executor | None = None) -> Iterator[int]:
    """Run nq_generate(sess, max_new, stops) on a worker thread and yield each token as its callback delivers it.

    The worker is `executor`'s (CudaBackend keeps one thread for its session's calls: starting a thread per
    generation cost ~0.1 ms of its time to first token), else a thread of its own. It reads nq_last_error() itself,
    right after the failing call (the message is thread-local), and the failure is raised here, on the caller's
    thread, after the tokens produced before it. Closing the generator early asks the library to stop (the callback
    returns 1) and waits for the worker.
    """
    q: queue.Queue = queue.Queue()
    cancel = threading.Event()
    done = object()

    def on_token(tok, _user):
        q.put(int(tok))
        return 1 if cancel.is_set() else 0

    cb = TOKEN_CALLBACK(on_token)
    n_out = ctypes.c_int32()
    result: list = []          # [(status, message)] once the call returns

    def worker():
        try:
            result.append(abi.call(lib, "nq_generate", sess, int(max_new),
                                   _ptr(stops, ctypes.c_int32) if stops.size else None, int(stops.size), cb, None,
                                   None, ctypes.byref(n_out)))
        finally:
            q.put(done)

    if executor is not None:
        finished = executor.submit(worker).result
    else:
        th = threading.Thread(target=worker, name="nanoqwen-generate", daemon=True)
        th.start()
        finished = th.join
    try:
        while True:
            item = q.get()
            if item is done:
                break
            yield item
    finally:
        cancel.set()
        finished()
    if not result:
        raise BackendError("generate: the worker thread ended without a result")
    rc, msg = result[0]
    if rc != NQ_OK:
        raise error_for_status(rc, msg, "generate")


class CudaBackend(Backend):
    """Backend over libnanoqwen: weights in one device allocation, paged f16 KV cache, one CUDA graph per step."""

    name = "cuda"

    def __init__(self, path: str | os.PathLike, *, max_context: int | None = None, file=None):
        self._lib = lib = load_library()
        self.path = os.fspath(path)
        self._model = _P()
        self._sess = _P()
        self._batch, self._batch_cap = None, 0     # nq_batch of decode_batch, created on first use
        self._in_flight: list[int] = []            # rows of the steps decode_batch_launch started, not yet waited
        self._kv_stores: list[SessionKv] = []      # the batched API's page pools, freed before the model
        self._generate_worker: concurrent.futures.ThreadPoolExecutor | None = None   # stream_tokens' thread
        if file is not None:          # else the C loader checks the file first, and the config is read after
            self.config = file.config
            self.max_context = resolve_max_context(self.config, max_context)
        if has_symbol(lib, "nq_model_check"):
            # the library's own rules, before any upload (an older library: nq_model_open gives the reason)
            check(lib, "nq_model_check", self.path.encode(), what=f"{self.path}: the CUDA backend")
        if lib.nq_device_count() <= 0:
            raise BackendError(unavailable_reason() or "no CUDA device")
        # an already opened handle was checksum-verified by nanoqwen_format: skip the second CRC pass
        verify = 0 if file is not None else 1
        check(lib, "nq_model_open", self.path.encode(), verify, ctypes.byref(self._model), what=f"open {self.path}")
        try:
            if file is None:
                from nanoqwen_format import open_file
                with open_file(self.path, verify_checksums=False) as f:
                    self.config = f.config
                self.max_context = resolve_max_context(self.config, max_context)
            c = NqConfig()
            check(lib, "nq_model_config", self._model, ctypes.byref(c), what="model config")
            if c.vocab_rows != self.config.vocab_rows or c.n_layers != self.config.n_layers:
                raise BackendError("libnanoqwen and nanoqwen_format disagree on the header")
            greedy = NqSampling(0.0, 0, 1.0, 0)
            check(lib, "nq_session_create", self._model, self.max_context, ctypes.byref(greedy),
                  ctypes.byref(self._sess), what="create session")
        except BaseException:
            self.close()
            raise
        secs, nbytes = ctypes.c_double(), ctypes.c_uint64()
        self._lib.nq_model_load_stats(self._model, ctypes.byref(secs), ctypes.byref(nbytes))
        self.load_seconds = secs.value        # libnanoqwen's own open + upload time
        self.device_bytes = nbytes.value

    # -- state ------------------------------------------------------------------------------------------
    def _live(self):
        if not self._sess:
            raise BackendError("the CUDA backend is closed")
        return self._sess

    @property
    def position(self) -> int:
        p = ctypes.c_int32()
        check(self._lib, "nq_session_position", self._live(), ctypes.byref(p), what="position")
        return int(p.value)

    def reset(self) -> None:
        check(self._lib, "nq_session_reset", self._live(), what="reset")

    # -- forward (arguments checked by the Backend edge) -----------------------------------------------------
    def _logits(self) -> np.ndarray:
        V = self.config.vocab_rows
        out = np.empty(V, dtype=np.float32)      # (vocab_rows,) owned by the caller
        check(self._lib, "nq_get_logits", self._live(), _ptr(out, ctypes.c_float), V, what="logits")
        return out

    def _prefill(self, ids: np.ndarray) -> np.ndarray:
        check(self._lib, "nq_prefill", self._live(), _ptr(ids, ctypes.c_int32), ids.shape[0], what="prefill")
        return self._logits()

    def _decode(self, token_id: int) -> np.ndarray:
        """One decode step with its logits: ctypes nq_decode → C++ session_decode (csrc/src/session.cu) →
        cudaGraphLaunch of the decode graph captured in session_create from enqueue_decode (embed_token; per layer
        gemv QKV → attention → gemv o_proj → gemv gate/up/SwiGLU → gemv down; gemv lm_head) → nq_get_logits.
        Generation does not come here: see _generate_ids."""
        check(self._lib, "nq_decode", self._live(), token_id, what="decode")
        return self._logits()

    def _logits_all(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((ids.shape[0], self.config.vocab_rows), dtype=np.float32)   # (n, vocab_rows)
        check(self._lib, "nq_logits_all", self._live(), _ptr(ids, ctypes.c_int32), ids.shape[0],
              _ptr(out, ctypes.c_float), what="logits_all")
        return out

    # -- generation on the device --------------------------------------------------------------------------
    def _generate_ids(self, ids: np.ndarray, params: SamplingParams, max_new_tokens: int,
                      stops: set[int]) -> Iterator[int]:
        """Sampling on the device: nq_prefill, then stream_tokens → ctypes nq_generate (worker thread) → C++
        session_generate → launch_one replays the decode+sample graph (enqueue_decode + enqueue_sample), up to 8
        steps ahead of the host; each sampled id comes back through the token callback."""
        sp = _sampling_struct(params)
        stop_arr = np.array(sorted(stops), dtype=np.int32)
        return self._generate(ids, sp, max_new_tokens, stop_arr)

    def _generate(self, ids: np.ndarray, sp: NqSampling, max_new: int, stops: np.ndarray) -> Iterator[int]:
        if max_new == 0:
            return
        sess = self._live()
        check(self._lib, "nq_session_set_sampling", sess, ctypes.byref(sp), what="sampling settings")
        self.reset()
        check(self._lib, "nq_prefill", sess, _ptr(ids, ctypes.c_int32), ids.shape[0], what="prefill")
        if self._generate_worker is None:
            self._generate_worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nanoqwen-generate")
        yield from stream_tokens(self._lib, sess, max_new, stops, self._generate_worker)

    # -- steered generation on the device -------------------------------------------------------------------
    def sample_steered(self, bias_ids: np.ndarray, bias_vals: np.ndarray, mask: np.ndarray | None,
                       presence: float, frequency: float, top_n: int) -> tuple[int, TokenLogprob | None]:
        """One steered sampling step from the current logits, on the device (nq_sample_steered): bias_ids int32 /
        bias_vals float32 (n,), mask int32 (ceil(vocab_rows / 32),) or None, top_n -1 for no logprobs. The token
        is not decoded. Arguments as LogitsSettings checked them (the library checks them again)."""
        tok = ctypes.c_int32()
        lp = ctypes.c_float()
        n_top = ctypes.c_int32()
        k = max(top_n, 1)
        top_ids = np.zeros(k, dtype=np.int32)          # (top_n,) filled by the library
        top_lps = np.zeros(k, dtype=np.float32)
        n_bias = int(bias_ids.shape[0])
        check(self._lib, "nq_sample_steered", self._live(), _ptr(bias_ids, ctypes.c_int32),
              _ptr(bias_vals, ctypes.c_float), n_bias,
              _ptr(mask, ctypes.c_int32) if mask is not None else None, mask.shape[0] if mask is not None else 0,
              float(presence), float(frequency), int(top_n), ctypes.byref(tok), ctypes.byref(lp),
              _ptr(top_ids, ctypes.c_int32), _ptr(top_lps, ctypes.c_float), ctypes.byref(n_top),
              what="steered sampling")
        if top_n < 0:
            return int(tok.value), None
        n = int(n_top.value)
        return int(tok.value), TokenLogprob(int(tok.value), float(lp.value),
                                            tuple((int(i), float(v)) for i, v in zip(top_ids[:n], top_lps[:n])))

    def _generate_steered(self, ids: np.ndarray, params: SamplingParams, max_new_tokens: int, stops: set[int],
                          pipeline) -> Iterator[tuple[int, TokenLogprob | None, bool]]:
        """The logits step of nanoqwen_rt.logits on the device: only the grammar's mask goes up and the token and
        its logprobs come back per step (the penalties' counts live on the device, reset with the sequence)."""
        s = pipeline.settings
        sess = self._live()
        bias = sorted(s.logit_bias.items())
        bias_ids = np.array([k for k, _ in bias], dtype=np.int32)          # (n_bias,)
        bias_vals = np.array([v for _, v in bias], dtype=np.float32)       # (n_bias,)
        top_n = -1 if s.top_logprobs is None else int(s.top_logprobs)
        constraint = pipeline.constraint
        mask = np.zeros((self.config.vocab_rows + 31) // 32, dtype=np.int32) if constraint is not None else None
        check(self._lib, "nq_session_set_sampling", sess, ctypes.byref(_sampling_struct(params)),
              what="sampling settings")
        self.reset()
        check(self._lib, "nq_prefill", sess, _ptr(ids, ctypes.c_int32), ids.shape[0], what="prefill")
        n_total = ids.shape[0]
        for i in range(max_new_tokens):
            if constraint is not None:
                constraint.fill_bitmask(mask)      # on the host, while the device runs the step enqueued below
            tok, lp = self.sample_steered(bias_ids, bias_vals, mask, s.presence_penalty, s.frequency_penalty, top_n)
            complete = False
            if constraint is not None:
                constraint.accept(tok)
                complete = constraint.complete
            n_total += 1
            if complete or tok in stops or i + 1 == max_new_tokens or n_total >= self.max_context:
                yield tok, lp, complete
                return
            # nq_decode returns once the step is enqueued (nq_sample_steered waits for it): the caller's work on
            # this token and the next mask overlap the device's forward pass
            check(self._lib, "nq_decode", sess, tok, what="decode")
            yield tok, lp, complete

    # -- many sequences in one step ------------------------------------------------------------------------
    def new_session(self, max_context: int):
        """A further library session on this backend's model (its own paged KV cache and decode graph, the shared
        weights), for decode_batch; free it with free_session."""
        sess = _P()
        greedy = NqSampling(0.0, 0, 1.0, 0)
        check(self._lib, "nq_session_create", self._model, int(max_context), ctypes.byref(greedy),
              ctypes.byref(sess), what="create a session")
        return sess

    def free_session(self, sess) -> None:
        if sess:
            self._lib.nq_session_free(sess)

    def decode_batch(self, sessions: list, tokens: np.ndarray, *, n_logits: int = 0):
        """One token for each of these sessions (this backend's own `session` or new_session handles) in ONE forward
        pass (nq_decode_batch: the weights are read once per step for all of them): tokens int32 (n,) are appended at
        each session's position; returns the next tokens sampled on the device with each session's sampling
        settings, int32 (n,), and the logits of the first n_logits sessions, float32 (n_logits, vocab_rows) (None
        when n_logits is 0)."""
        n, handles, toks = self._batch_args("decode_batch", sessions, tokens)
        if not 0 <= n_logits <= n:
            raise BackendError(f"decode_batch: n_logits {n_logits} outside [0, {n}]")
        nxt = np.empty(n, dtype=np.int32)
        logits = np.empty((n_logits, self.config.vocab_rows), dtype=np.float32) if n_logits else None
        check(self._lib, "nq_decode_batch", self._batch, handles, _ptr(toks, ctypes.c_int32), n,
              _ptr(nxt, ctypes.c_int32), _ptr(logits, ctypes.c_float) if logits is not None else None, n_logits,
              what="batched decode")
        return nxt, logits

    def _batch_args(self, what: str, sessions: list, tokens) -> tuple:
        """A batched step's (n, session handle array, contiguous int32 tokens (n,)), the batch object made big
        enough (plan_batch); BackendError for no sessions or a token count that is not n."""
        n = len(sessions)
        if n == 0:
            raise BackendError(f"{what}: no sessions")
        self.plan_batch(n)
        handles = (_P * n)(*[s.value if isinstance(s, _P) else s for s in sessions])
        toks = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        if toks.shape[0] != n:
            raise BackendError(f"{what}: {n} sessions but {toks.shape[0]} tokens")
        return n, handles, toks

    def plan_batch(self, n: int) -> None:
        """A batch object (nq_batch_create) for steps of up to n sessions: made, or remade larger, here (its
        buffers and graphs go with it, so never while a launched step is not waited)."""
        if self._batch is not None and self._batch_cap >= n:
            return
        if self._in_flight:
            raise BackendError(f"decode_batch: a batch of {n} rows needs a larger batch object while "
                               f"{len(self._in_flight)} launched steps are not waited")
        if self._batch is not None:
            self._lib.nq_batch_free(self._batch)
            self._batch = None
        cap = min(abi.NQ_MAX_BATCH, max(8, 1 << (n - 1).bit_length()))
        b = _P()
        check(self._lib, "nq_batch_create", self._model, cap, ctypes.byref(b), what="create the batch")
        self._batch, self._batch_cap = b, cap

    def decode_batch_launch(self, sessions: list, tokens: np.ndarray, chain: np.ndarray | None = None) -> None:
        """decode_batch's step, started and not waited for (nq_decode_batch_launch): session i takes tokens[i], or
        where chain[i] >= 0 the token the previous step drew for its row chain[i] (int32 (n,) each). Every row is
        sampled on the device; decode_batch_wait returns the draws. At most two steps are in flight."""
        n, handles, toks = self._batch_args("decode_batch_launch", sessions, tokens)
        ch = None if chain is None else np.ascontiguousarray(chain, dtype=np.int32).reshape(-1)
        if ch is not None and ch.shape[0] != n:
            raise BackendError(f"decode_batch_launch: {n} sessions but {ch.shape[0]} chain entries")
        check(self._lib, "nq_decode_batch_launch", self._batch, handles, _ptr(toks, ctypes.c_int32),
              _ptr(ch, ctypes.c_int32) if ch is not None else None, n, what="batched decode launch")
        self._in_flight.append(n)

    def decode_batch_wait(self, n: int) -> np.ndarray:
        """The draws of the oldest step decode_batch_launch started (n rows), int32 (n,), once it has run."""
        if not self._in_flight:
            raise ValueError("decode_batch_wait: no launched step to wait for")
        nxt = np.empty(n, dtype=np.int32)
        rc, msg = abi.call(self._lib, "nq_decode_batch_wait", self._batch, _ptr(nxt, ctypes.c_int32), n)
        if rc != abi.NQ_E_INVALID_ARG:   # past the argument checks the library drops the step, ran well or not
            self._in_flight.pop(0)
        if rc != NQ_OK:
            raise error_for_status(rc, msg, "batched decode")
        return nxt

    @property
    def session(self):
        """This backend's own library session (the single-stream API's), e.g. as one of decode_batch's."""
        return self._live()

    # -- many sequences ----------------------------------------------------------------------------------------
    def kv_page_bytes(self) -> int:
        """Device bytes of one KV page of this model (nq_kv_page_bytes: f16 keys and values, all layers)."""
        n = ctypes.c_uint64()
        check(self._lib, "nq_kv_page_bytes", self._model, ctypes.byref(n), what="KV page size")
        return int(n.value)

    def default_kv_pages(self, max_batch: int) -> int:
        """max_batch full contexts, within KV_FREE_MEMORY_FRACTION of the device memory free now (after the
        weights and this backend's own session); KvPoolDoesNotFit when that is less than one full context."""
        free, _ = device_memory(self._lib)
        return kv_pool_pages(self.max_context, max_batch, self.kv_page_bytes(), free)

    def sequence_kv(self, n_pages: int) -> "SessionKv":
        """The batched API's KV store on this backend: a device page pool of n_pages pages, one pooled library
        session per sequence (see SessionKv). Freed by close(). BackendError for a pool the library does not make
        (more than NQ_MAX_KV_POOL_PAGES pages; OutOfDeviceMemory when the device cannot hold it)."""
        if not 1 <= n_pages <= abi.NQ_MAX_KV_POOL_PAGES:
            raise BackendError(f"a KV pool of {n_pages} pages: the CUDA backend makes 1 to {abi.NQ_MAX_KV_POOL_PAGES}")
        kv = SessionKv(self, n_pages)
        self._kv_stores.append(kv)
        return kv

    # -- lifetime ------------------------------------------------------------------------------------------
    def close(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if getattr(self, "_generate_worker", None) is not None:
            self._generate_worker.shutdown(wait=True)   # a generation's worker ends before its session is freed
            self._generate_worker = None
        if getattr(self, "_batch", None):
            lib.nq_batch_free(self._batch)
            self._batch = None
        for kv in getattr(self, "_kv_stores", ()):
            kv.release()
        self._kv_stores = []
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


class SessionKv(SequenceKv):
    """The batched API on libnanoqwen: one device KV page pool (nq_kv_pool_create, n_pages pages) and one pooled
    library session per sequence (nq_session_create_pooled: no cache of its own; its page table lists pool pages).
    The pool's page ids ARE nanoqwen_rt.kv_pool's page ids, so a prefix-cache hit reuses the cached pages' device
    rows (shares_pages True): the session's table lists them and its position starts after them. A sequence's page
    table goes to the device (nq_session_set_pages, which uploads only the entries that changed) before the step
    that needs it, at most once per step and only when the list grew or the position is not the session's: every
    call that hands a session to the library takes it from _sync. Prompt chunks run one sequence after another
    (nq_prefill); the decode tokens of a step run in ONE device step (forward_decode → nq_decode_batch: the weights
    are read once per step for all the sequences). Ended sequences' sessions are kept (with no pages) and reused,
    so a new sequence does not pay for a session's allocations and graph captures.

    Who samples: a sequence given set_sampling (the scheduler does so for every request without a LogitsPipeline:
    temperature / top_k / top_p / seed only, what the device sampler implements, the requests the single-stream
    path sends to nq_generate) draws on the device with its session's settings and draw counter (set_sampling
    restarts the counter, also on a reused session): its first token from its prompt's logits (forward_token), the
    later ones in nq_decode_batch's one sampler launch; only the token comes back. The others (grammar, logprobs,
    logit_bias, penalties) get their logits on the host for the scheduler's LogitsPipeline: they go first in the
    batch, and nq_decode_batch copies only their rows."""

    shares_pages = True
    samples_tokens = True
    pipelines = True
    # one of the library's prefill chunks (NQ_PREFILL_CHUNK_TOKENS, 2,048): a 2,006-token prompt takes one engine
    # step of ~51 ms instead of eight 256-token steps (122 ms, bench/NOTES.md "Session 10"; "Session 14" for the
    # chunk); the cap keeps a cancelled request's pages from waiting long
    idle_prefill_tokens = 2048

    def __init__(self, be: CudaBackend, n_pages: int):
        self.be = be
        self.n_pages = int(n_pages)
        self._pool = _P()
        check(be._lib, "nq_kv_pool_create", be._model, self.n_pages, ctypes.byref(self._pool),
              what=f"KV page pool of {self.n_pages} pages")
        self._sessions: dict[int, list] = {}       # seq_id → [session, entries uploaded, session position]
        self._idle: list = []                      # sessions of ended sequences, no pages, ready for reuse
        self._drawn: set[int] = set()              # seq_ids of the sequences the device samples

    def poison(self, pages) -> None:
        """NaN into the pages the pool just handed out (every layer), so a read of an unwritten row shows. One
        nq_kv_pool_poison for the whole list: it returns without waiting, and the device runs the fill before any
        step launched afterwards on a session of this pool (its own or a batched one)."""
        idx = np.ascontiguousarray(pages, dtype=np.int32)
        check(self.be._lib, "nq_kv_pool_poison", self._pool, _ptr(idx, ctypes.c_int32), idx.shape[0],
              what="poison KV pages")

    def open(self, seq, capacity: int) -> None:
        lib = self.be._lib
        if self._idle:
            sess = self._idle.pop()
            check(lib, "nq_session_reset", sess, what="reset a batch sequence's session")
        else:
            sess = _P()
            greedy = NqSampling(0.0, 0, 1.0, 0)      # until set_sampling; a host-sampled sequence's draws go unread
            # every pooled session spans the backend's whole context, so any ended one serves any new sequence
            check(lib, "nq_session_create_pooled", self.be._model, self._pool, int(self.be.max_context),
                  ctypes.byref(greedy), ctypes.byref(sess), what="create a batch sequence's session")
        self._sessions[seq.seq_id] = [sess, 0, 0]
        self._drawn.discard(seq.seq_id)

    def set_sampling(self, seq, params: SamplingParams) -> None:
        check(self.be._lib, "nq_session_set_sampling", self._sessions[seq.seq_id][0],
              ctypes.byref(_sampling_struct(params)), what="sampling settings")
        self._drawn.add(seq.seq_id)

    def _sync(self, seq, p0: int, n: int):
        """seq's session, its page table on the device and its position p0, before n tokens run from p0."""
        state = self._sessions[seq.seq_id]
        sess, uploaded, pos = state
        if uploaded != len(seq.pages) or pos != p0:
            pages = np.asarray(seq.pages, dtype=np.int32)
            check(self.be._lib, "nq_session_set_pages", sess, _ptr(pages, ctypes.c_int32), pages.shape[0], int(p0),
                  what="set a sequence's KV pages")
            state[1] = pages.shape[0]
        state[2] = p0 + n
        return sess

    def extend(self, seq, p0: int, ids: np.ndarray) -> None:
        lib, sess = self.be._lib, self._sync(seq, p0, ids.shape[0])
        if ids.shape[0] == 1 and p0 > 0:
            check(lib, "nq_decode", sess, int(ids[0]), what="decode")
        else:
            check(lib, "nq_prefill", sess, _ptr(ids, ctypes.c_int32), ids.shape[0], what="prefill")

    def forward(self, seq, p0: int, ids: np.ndarray) -> np.ndarray:
        self.extend(seq, p0, ids)
        V = self.be.config.vocab_rows
        out = np.empty(V, dtype=np.float32)      # (vocab_rows,) owned by the caller
        check(self.be._lib, "nq_get_logits", self._sessions[seq.seq_id][0], _ptr(out, ctypes.c_float), V,
              what="logits")
        return out

    def forward_token(self, seq, p0: int, ids: np.ndarray) -> int:
        """extend(), then one device draw from the session's logits: nq_sample_steered with nothing to steer (no
        bias, mask or penalty: the logits as they are) runs the single-stream path's sampler with the session's
        settings and draw counter, as nq_generate's first draw does; the token is not decoded."""
        self.extend(seq, p0, ids)
        tok = ctypes.c_int32(-1)
        check(self.be._lib, "nq_sample_steered", self._sessions[seq.seq_id][0], None, None, 0, None, 0, 0.0, 0.0,
              -1, ctypes.byref(tok), None, None, None, None, what="sample")
        return int(tok.value)

    def forward_decode(self, seqs, p0s, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The decode tokens of all these sequences in ONE device step (CudaBackend.decode_batch: every weight read
        once for all of them; a CUDA graph per batch size, one row included), the host-sampled ones first so that
        only their logits rows are copied back. Each session comes from _sync, so a page table that grew this step
        is on the device before the step."""
        n = len(seqs)
        host = [i for i, s in enumerate(seqs) if s.seq_id not in self._drawn]
        order = host + [i for i, s in enumerate(seqs) if s.seq_id in self._drawn]
        toks = np.asarray(tokens, dtype=np.int32)[order]
        nxt, logits = self.be.decode_batch([self._sync(seqs[i], int(p0s[i]), 1) for i in order], toks,
                                           n_logits=len(host))
        drawn = np.empty(n, dtype=np.int32)
        drawn[order] = nxt
        drawn[host] = -1
        if logits is None:
            logits = np.empty((0, self.be.config.vocab_rows), dtype=np.float32)
        return drawn, logits

    def plan_batch(self, max_rows: int) -> None:
        self.be.plan_batch(max_rows)

    def launch_decode(self, seqs, p0s, tokens: np.ndarray, chain: np.ndarray) -> None:
        """SequenceKv.launch_decode on the device (CudaBackend.decode_batch_launch); a session whose page table grew
        uploads it first (nq_session_set_pages at its position: allowed while its previous step runs)."""
        self.be.decode_batch_launch([self._sync(s, int(p0), 1) for s, p0 in zip(seqs, p0s)], tokens, chain)

    def wait_decode(self, n: int) -> np.ndarray:
        return self.be.decode_batch_wait(n)

    def close(self, seq) -> None:
        """The sequence ended: its session drops its pages (nothing can run on it until a reuse gives it new ones)
        and waits for the next sequence; the device no longer samples for its seq_id."""
        self._drawn.discard(seq.seq_id)
        state = self._sessions.pop(seq.seq_id, None)
        if state is None:
            return
        sess = state[0]
        rc, _ = abi.call(self.be._lib, "nq_session_set_pages", sess, None, 0, 0)
        if rc == NQ_OK:
            self._idle.append(sess)
        else:                                     # a session in an unknown state is not reused
            self.be._lib.nq_session_free(sess)

    def release(self) -> None:
        """Free every session and then the pool (the backend's close, before the model). Idempotent."""
        lib = self.be._lib
        while self.be._in_flight:             # a launched step still uses the sessions and the pool
            try:
                self.be.decode_batch_wait(self.be._in_flight[0])
            except ValueError:                # the library holds no such step: nothing left to wait for
                self.be._in_flight.clear()
            except Exception:                 # noqa: BLE001 (freeing: a failed step is dropped all the same)
                pass
        for sess in self._idle + [st[0] for st in self._sessions.values()]:
            lib.nq_session_free(sess)
        self._idle, self._sessions, self._drawn = [], {}, set()
        if self._pool:
            lib.nq_kv_pool_free(self._pool)
            self._pool = _P()
