"""The Backend interface every compute backend implements (CPU reference: cpu_backend.py; CUDA: cuda_backend.py).

A backend owns the weights of one .nanoqwen file and ONE sequence's KV cache (batch size 1):

    be = SomeBackend(path, max_context=None, file=None)   # constructor convention, see below
    be.reset()                          # empty the sequence: position = 0
    last = be.prefill(prompt_ids)       # append the ids, return float32 (vocab_rows,) logits of the LAST one
    nxt = be.decode(token_id)           # append one id, return its float32 (vocab_rows,) logits
    all_ = be.logits_all(ids)           # fresh sequence; float32 (n, vocab_rows) logits of every position
    for tid in be.generate_ids(prompt_ids, SamplingParams(...), max_new_tokens, stop_token_ids): ...

Constructor convention (Engine relies on it): ``Cls(path: str | os.PathLike, *, max_context: int | None = None,
file: nanoqwen_format.NanoqwenFile | None = None)``. ``file`` is an already opened (and checksum-verified) handle of
the same path that a backend MAY reuse instead of opening the file again. ``max_context`` None → the file's
``config.max_positions``; a value larger than that raises ValueError. The KV cache is allocated for max_context
positions up front. Each backend module also exposes ``available() -> bool`` (CPU: always True).
Class names Engine instantiates: ``nanoqwen_rt.cpu_backend.CPUBackend`` and ``nanoqwen_rt.cuda_backend.CudaBackend``
(Engine(device="auto") uses CudaBackend when ``nanoqwen_rt.cuda_backend.available()`` is True, else CPUBackend).
Errors: a backend that cannot load raises BackendError (message says why, one line).

Positions: ``position`` is the number of tokens currently in the KV cache (the next token's RoPE position).
prefill/decode raise ContextFull (a ValueError) instead of writing past max_context, leaving the state unchanged.
Returned logits arrays belong to the caller (a backend never overwrites an array it returned).
"""
from __future__ import annotations

import abc
from typing import Iterable, Iterator

import numpy as np

from ..sampling import Sampler, SamplingParams

__all__ = ["Backend", "ContextFull", "BackendError"]


class BackendError(RuntimeError):
    """A backend failed (e.g. could not load the file / device)."""


class ContextFull(ValueError):
    """prefill/decode would write past max_context. Message: position, tokens asked, max_context."""


class Backend(abc.ABC):
    """Abstract compute backend for one sequence (batch 1). See the module docstring for the contract."""

    #: short name shown by the CLI ("cpu", "cuda")
    name: str = "abstract"

    # -- attributes every subclass sets in __init__ -------------------------------------------------
    config: "object"        # nanoqwen_format.ModelConfig of the file
    max_context: int        # KV cache capacity in tokens (≤ config.max_positions)

    # -- state ----------------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def position(self) -> int:
        """Number of tokens in the KV cache = RoPE position of the next token."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget the sequence (position = 0). Cheap: does not free or zero the cache."""

    # -- forward --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def prefill(self, ids: np.ndarray) -> np.ndarray:
        """Append ``ids`` (int32 (n,), n ≥ 1, each 0 ≤ id < vocab_rows) at positions position..position+n-1.

        Returns float32 (vocab_rows,): the logits after the last id. Raises ContextFull if
        position + n > max_context, ValueError on empty ids or ids out of range.
        """

    @abc.abstractmethod
    def decode(self, token_id: int) -> np.ndarray:
        """Append one id; return its float32 (vocab_rows,) logits. Raises ContextFull when full."""

    def logits_all(self, ids: np.ndarray) -> np.ndarray:
        """Fresh sequence (reset first): float32 (n, vocab_rows) logits of every position of ``ids``.

        Default: reset, then one decode per id. Backends override it with a batched pass; the state
        afterwards is the same either way (the ids are in the cache, position = n).
        """
        ids = _as_ids(ids, self.config.vocab_rows)
        self.reset()
        out = np.empty((ids.shape[0], self.config.vocab_rows), dtype=np.float32)  # (n, vocab_rows)
        for i, t in enumerate(ids):
            out[i] = self.decode(int(t))
        return out

    # -- generation -----------------------------------------------------------------------------------
    def _check_generate_args(self, prompt_ids, max_new_tokens: int) -> np.ndarray:
        """The argument rules of generate_ids, shared by every backend: ids in range, max_new_tokens >= 0, and a
        prompt that leaves room for one new token. Returns the prompt as int32 (n,)."""
        ids = _as_ids(prompt_ids, self.config.vocab_rows)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if max_new_tokens > 0 and ids.shape[0] >= self.max_context:
            raise ContextFull(f"prompt of {ids.shape[0]} tokens leaves no room for a new token in "
                              f"max_context={self.max_context}")
        return ids

    def generate_ids(self, prompt_ids: np.ndarray, params: SamplingParams, max_new_tokens: int,
                     stop_token_ids: Iterable[int] = ()) -> Iterator[int]:
        """Reset, prefill the prompt, then sample/decode. Yields each new token id as soon as it is sampled.

        Ends (the generator returns) after: yielding a stop id (the stop id IS yielded, as the last one);
        or ``max_new_tokens`` ids; or when prompt + generated ids reach max_context (the context is full).
        The caller tells the reasons apart from the last id and the count. The last sampled id is never
        decoded (not needed), so after the loop ``position`` = prompt + generated - 1.
        Closing the generator early is allowed (the caller stops on a stop string).
        Default: host-side sampling with nanoqwen_rt.sampling.Sampler over the logits from prefill/decode;
        the CUDA backend overrides it to sample on the device (same semantics, its own RNG stream).
        Arguments are validated when called (ValueError / ContextFull raised before the first next()):
        the prompt must leave room for one new token (len(prompt_ids) < max_context when max_new_tokens > 0).
        """
        ids = self._check_generate_args(prompt_ids, max_new_tokens)
        sampler = Sampler(params)
        stops = {int(t) for t in stop_token_ids}
        return self._generate_loop(ids, sampler, max_new_tokens, stops)

    def _generate_loop(self, ids: np.ndarray, sampler: Sampler, max_new_tokens: int,
                       stops: set[int]) -> Iterator[int]:
        if max_new_tokens == 0:
            return
        self.reset()
        logits = self.prefill(ids)
        n_total = ids.shape[0]
        for i in range(max_new_tokens):
            tok = sampler(logits)
            yield tok
            n_total += 1
            if tok in stops or i + 1 == max_new_tokens or n_total >= self.max_context:
                return
            logits = self.decode(tok)

    # -- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the file mapping / device memory. Idempotent."""

    def describe(self) -> str:
        """One line for the CLI: backend, device, weight dtypes."""
        return self.name

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _as_ids(ids, vocab_rows: int) -> np.ndarray:
    """Validate token ids → contiguous int32 (n,), n ≥ 1, all in [0, vocab_rows)."""
    a = np.asarray(ids)
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(f"token ids must be a non-empty 1-D sequence, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got dtype {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= vocab_rows:
        raise ValueError(f"token id out of range [0, {vocab_rows}): found min {lo}, max {hi}")
    return np.ascontiguousarray(a, dtype=np.int32)
