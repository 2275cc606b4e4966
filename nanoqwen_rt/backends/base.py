"""The Backend interface every compute backend implements (CPU reference: backends/cpu/; CUDA: backends/cuda/).

A backend owns the weights of one .nanoqwen file and ONE sequence's KV cache (batch size 1):

    be = SomeBackend(path, max_context=None, file=None)   # constructor convention, see below
    be.reset()                          # empty the sequence: position = 0
    last = be.prefill(prompt_ids)       # append the ids, return float32 (vocab_rows,) logits of the LAST one
    nxt = be.decode(token_id)           # append one id, return its float32 (vocab_rows,) logits
    all_ = be.logits_all(ids)           # fresh sequence; float32 (n, vocab_rows) logits of every position
    for tid in be.generate_ids(prompt_ids, SamplingParams(...), max_new_tokens, stop_token_ids): ...

Validate once, at the edge: the public methods above check token ids (`check_token_ids`) and the context limit,
then call `_prefill` / `_decode` / `_logits_all` / `_generate_ids`, which a backend implements and which trust
their arguments. Sampling parameters are checked when a SamplingParams is built; max_context by
`resolve_max_context`, called by each backend's constructor. The C library checks its own ABI inputs again.

Constructor convention (Engine relies on it): ``Cls(path: str | os.PathLike, *, max_context: int | None = None,
file: nanoqwen_format.NanoqwenFile | None = None)``. ``file`` is an already opened (and checksum-verified) handle of
the same path that a backend MAY reuse instead of opening the file again. ``max_context`` None → the file's
``config.max_positions``; a bad value raises InvalidMaxContext (a ValueError). The KV cache holds up to
max_context positions (the CUDA backend allocates them up front; the CPU backend grows its cache on demand). Each
backend package also exposes ``available() -> bool`` (CPU: always True).
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

__all__ = ["Backend", "SequenceKv", "ContextFull", "BackendError", "InvalidTokenIds", "InvalidMaxContext", "check_token_ids",
           "resolve_max_context"]


class BackendError(RuntimeError):
    """A backend failed (e.g. could not load the file / device)."""


class ContextFull(ValueError):
    """prefill/decode would write past max_context. Message: position, tokens asked, max_context."""


class InvalidTokenIds(ValueError):
    """Token ids that are not a non-empty 1-D integer sequence within [0, vocab_rows)."""


class InvalidMaxContext(ValueError):
    """max_context is not a positive integer, or exceeds the model's max_positions."""


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

    # -- forward: the public methods validate (the one place on the Python side), the _methods compute -----
    def prefill(self, ids) -> np.ndarray:
        """Append ``ids`` (int (n,), n ≥ 1, each 0 ≤ id < vocab_rows) at positions position..position+n-1.

        Returns float32 (vocab_rows,): the logits after the last id. Raises ContextFull if
        position + n > max_context, InvalidTokenIds (a ValueError) on empty ids or ids out of range.
        """
        ids = check_token_ids(ids, self.config.vocab_rows)
        pos = self.position
        if pos + ids.shape[0] > self.max_context:
            raise ContextFull(f"position {pos} + {ids.shape[0]} tokens > max_context {self.max_context}")
        return self._prefill(ids)

    def decode(self, token_id: int) -> np.ndarray:
        """Append one id; return its float32 (vocab_rows,) logits. Raises ContextFull when full."""
        ids = check_token_ids([token_id], self.config.vocab_rows)
        pos = self.position
        if pos + 1 > self.max_context:
            raise ContextFull(f"position {pos} + 1 token > max_context {self.max_context}")
        return self._decode(int(ids[0]))

    def logits_all(self, ids) -> np.ndarray:
        """Fresh sequence (reset first): float32 (n, vocab_rows) logits of every position of ``ids``.

        The state afterwards: the ids are in the cache, position = n.
        """
        ids = check_token_ids(ids, self.config.vocab_rows)
        if ids.shape[0] > self.max_context:
            raise ContextFull(f"{ids.shape[0]} tokens > max_context {self.max_context}")
        return self._logits_all(ids)

    @abc.abstractmethod
    def _prefill(self, ids: np.ndarray) -> np.ndarray:
        """prefill with ids already checked: int32 (n,) in range, and they fit the context."""

    @abc.abstractmethod
    def _decode(self, token_id: int) -> np.ndarray:
        """decode with token_id already checked (in range, fits the context)."""

    def _logits_all(self, ids: np.ndarray) -> np.ndarray:
        """logits_all with ids already checked. Default: reset, then one decode per id; backends override it
        with a batched pass."""
        self.reset()
        out = np.empty((ids.shape[0], self.config.vocab_rows), dtype=np.float32)  # (n, vocab_rows)
        for i, t in enumerate(ids):
            out[i] = self._decode(int(t))
        return out

    # -- generation -----------------------------------------------------------------------------------
    def generate_ids(self, prompt_ids, params: SamplingParams, max_new_tokens: int,
                     stop_token_ids: Iterable[int] = ()) -> Iterator[int]:
        """Reset, prefill the prompt, then sample/decode. Yields each new token id as soon as it is sampled.

        Ends (the generator returns) after: yielding a stop id (the stop id IS yielded, as the last one);
        or ``max_new_tokens`` ids; or when prompt + generated ids reach max_context (the context is full).
        The caller tells the reasons apart from the last id and the count. The last sampled id is never
        decoded (not needed), so after the loop ``position`` = prompt + generated - 1.
        Closing the generator early is allowed (the caller stops on a stop string).
        Arguments are validated when called (InvalidTokenIds / ValueError / ContextFull raised before the first
        next()): the prompt must leave room for one new token (len(prompt_ids) < max_context when
        max_new_tokens > 0). ``params`` is a SamplingParams, valid by construction.
        Default (``_generate_ids``): host-side sampling with nanoqwen_rt.sampling.Sampler over the logits of
        _prefill/_decode; the CUDA backend overrides it to sample on the device (same semantics, its own RNG).
        """
        ids = check_token_ids(prompt_ids, self.config.vocab_rows)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if max_new_tokens > 0 and ids.shape[0] >= self.max_context:
            raise ContextFull(f"prompt of {ids.shape[0]} tokens leaves no room for a new token in "
                              f"max_context={self.max_context}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        stops = {int(t) for t in stop_token_ids}
        return self._generate_ids(ids, params, int(max_new_tokens), stops)

    def _generate_ids(self, ids: np.ndarray, params: SamplingParams, max_new_tokens: int,
                      stops: set[int]) -> Iterator[int]:
        """generate_ids with every argument already checked: host-side sampling over _prefill/_decode."""
        sampler = Sampler(params)
        if max_new_tokens == 0:
            return
        self.reset()
        logits = self._prefill(ids)
        n_total = ids.shape[0]
        for i in range(max_new_tokens):
            tok = sampler(logits)
            yield tok
            n_total += 1
            if tok in stops or i + 1 == max_new_tokens or n_total >= self.max_context:
                return
            logits = self._decode(tok)

    def generate_steered(self, prompt_ids, params: SamplingParams, max_new_tokens: int,
                         stop_token_ids: Iterable[int], pipeline) -> Iterator[tuple[int, object, bool]]:
        """generate_ids for a request whose logits are processed before sampling (logit_bias, penalties, a
        grammar's token mask) or reported (logprobs): `pipeline` is a nanoqwen_rt.logits.LogitsPipeline. Yields
        (token id, TokenLogprob or None, complete); complete=True (the grammar is satisfied) ends the generation
        like a stop id. Same checks and end rules as generate_ids. Runs on the host over the logits of
        _prefill/_decode on every backend (the CUDA backend copies each step's logits out)."""
        ids = check_token_ids(prompt_ids, self.config.vocab_rows)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if ids.shape[0] >= self.max_context:
            raise ContextFull(f"prompt of {ids.shape[0]} tokens leaves no room for a new token in "
                              f"max_context={self.max_context}")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        return self._generate_steered(ids, params, int(max_new_tokens), {int(t) for t in stop_token_ids},
                                      pipeline)

    def _generate_steered(self, ids: np.ndarray, params: SamplingParams, max_new_tokens: int, stops: set[int],
                          pipeline) -> Iterator[tuple[int, object, bool]]:
        sampler = Sampler(params)
        self.reset()
        raw = self._prefill(ids)
        n_total = ids.shape[0]
        for i in range(max_new_tokens):
            logits = pipeline.process(raw)
            tok = sampler(logits)
            lp, complete = pipeline.after_sample(logits, tok)
            yield tok, lp, complete
            n_total += 1
            if complete or tok in stops or i + 1 == max_new_tokens or n_total >= self.max_context:
                return
            raw = self._decode(tok)

    # -- many sequences (the Engine's batched API: nanoqwen_rt/scheduler.py) -----------------------------
    def sequence_kv(self, n_pages: int) -> "SequenceKv":
        """The KV store of many sequences at once, for the scheduler. A backend that runs no batched sequences
        raises BackendError."""
        raise BackendError(f"the {self.name} backend runs no batched sequences")

    def default_kv_pages(self, max_batch: int) -> int:
        """The batched API's KV pages when none are asked for (Engine(kv_pages=None), serve without --kv-pages):
        max_batch full contexts of float32 rows (the CPU backend's pages), within CPU_KV_BUDGET_BYTES, at least
        one full context. The CUDA backend sizes its device pool from the GPU's free memory instead."""
        from ..kv_pool import KV_PAGE_TOKENS
        from ..scheduler import CPU_KV_BUDGET_BYTES, default_kv_pages
        c = self.config
        page_bytes = 2 * c.n_layers * c.n_kv_heads * KV_PAGE_TOKENS * c.head_dim * 4
        return default_kv_pages(self.max_context, max_batch, page_bytes, CPU_KV_BUDGET_BYTES)

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


class SequenceKv(abc.ABC):
    """The KV rows of many sequences, each named by its nanoqwen_rt.kv_pool.SequencePages (seq_id, page table).
    The scheduler calls open() when it admits a sequence, forward() for each prefill chunk or decode token, and
    close() when the sequence ends. Arguments are checked by the scheduler (ids in range, positions within the
    pages the pool gave the sequence, p0 = the tokens already written)."""

    #: True when forward() reads and writes the rows in the pool's pages, so prefix-cache pages can be shared;
    #: False when the backend keeps each sequence's rows elsewhere (the pool then only counts pages)
    shares_pages: bool = False
    #: True when the store can draw a sequence's tokens itself, where its logits are (CUDA: the device sampler),
    #: for a sequence given set_sampling(): the scheduler then asks forward_token() / forward_decode() for its
    #: tokens and never sees its logits. False: the scheduler samples every sequence on the host from its logits.
    samples_tokens: bool = False
    #: True when the store can run a decode step in two halves, launch_decode() and wait_decode(), with the next
    #: step's tokens taken from the previous step's draws on the store's side (CUDA: nq_decode_batch_launch /
    #: _wait), so that the scheduler prepares one step while the other runs (nanoqwen_rt/scheduler.py)
    pipelines: bool = False
    #: prompt tokens the scheduler may compute in a step in which no sequence decodes (nobody's next token waits
    #: for it): the store's efficient prompt size; None: PREFILL_CHUNK_TOKENS, as in a step with decodes
    idle_prefill_tokens: int | None = None

    def plan_batch(self, max_rows: int) -> None:
        """The most sequences one decode step will hold (the scheduler's max_batch), said once before any step."""

    def launch_decode(self, seqs, p0s, tokens: np.ndarray, chain: np.ndarray) -> None:
        """Start one decode step for `seqs` (every one drawn by the store: set_sampling) and return before it ends:
        seqs[i] takes tokens[i] at position p0s[i], or, where chain[i] >= 0 (int32 (n,)), the token the previous
        step drew for its row chain[i]. At most two steps are started and not yet waited."""
        raise NotImplementedError(f"{type(self).__name__} does not pipeline (pipelines is False)")

    def wait_decode(self, n: int) -> np.ndarray:
        """Wait for the oldest step launch_decode started (n rows) and return its draws, int32 (n,)."""
        raise NotImplementedError(f"{type(self).__name__} does not pipeline (pipelines is False)")

    @abc.abstractmethod
    def open(self, seq, capacity: int) -> None:
        """A new sequence that will hold at most `capacity` positions."""

    @abc.abstractmethod
    def forward(self, seq, p0: int, ids: np.ndarray) -> np.ndarray:
        """Run ids (int32 (T,)) at positions [p0, p0+T) of `seq`; float32 (vocab_rows,) logits of the last one."""

    def extend(self, seq, p0: int, ids: np.ndarray) -> None:
        """forward() when nobody reads the logits (a prompt chunk before the last). This default runs forward()."""
        self.forward(seq, p0, ids)

    def set_sampling(self, seq, params) -> None:
        """From now on the store draws `seq`'s tokens itself with these SamplingParams (forward_token, and
        forward_decode's `drawn`); only on a store with samples_tokens, right after open()."""
        raise NotImplementedError(f"{type(self).__name__} does not draw tokens (samples_tokens is False)")

    def forward_token(self, seq, p0: int, ids: np.ndarray) -> int:
        """forward(), then the next token of `seq` drawn by the store with the settings of its set_sampling()."""
        raise NotImplementedError(f"{type(self).__name__} does not draw tokens (samples_tokens is False)")

    def forward_decode(self, seqs, p0s, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One decode token for each of `seqs` (tokens int32 (n,), token i at position p0s[i] of seqs[i]). Returns
        (drawn, logits): drawn int32 (n,) the next token of each sequence the store samples (set_sampling), -1 for
        the others; logits float32 (m, vocab_rows) the logits of those m others, in the order of `seqs`. This
        default runs forward() per sequence and draws nothing; a backend that computes them in one device step
        (CUDA: nq_decode_batch) overrides it."""
        logits = np.stack([self.forward(s, int(p0), np.asarray([t], dtype=np.int32))
                           for s, p0, t in zip(seqs, p0s, tokens)])
        return np.full(len(seqs), -1, dtype=np.int32), logits

    @abc.abstractmethod
    def close(self, seq) -> None:
        """The sequence ended: free what open() made."""

    def poison(self, pages) -> None:
        """Pages the pool just handed out: fill their rows with NaN (a backend without page rows does nothing)."""


def check_token_ids(ids, vocab_rows: int) -> np.ndarray:
    """The one token-id rule of the Python side → contiguous int32 (n,): a non-empty 1-D integer sequence, every
    id in [0, vocab_rows). Raises InvalidTokenIds naming the first bad id."""
    a = np.asarray(ids)
    if a.ndim != 1 or a.shape[0] == 0:
        raise InvalidTokenIds(f"token ids must be a non-empty 1-D sequence, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise InvalidTokenIds(f"token ids must be integers, got dtype {a.dtype}")
    bad = np.flatnonzero((a < 0) | (a >= vocab_rows))
    if bad.size:
        raise InvalidTokenIds(f"token id {int(a[bad[0]])} outside [0, {vocab_rows})")
    return np.ascontiguousarray(a, dtype=np.int32)


def resolve_max_context(config, max_context) -> int:
    """The one max_context rule: None → config.max_positions; else a positive integer ≤ max_positions.
    Raises InvalidMaxContext."""
    if max_context is None:
        return int(config.max_positions)
    if isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer)) or max_context < 1:
        raise InvalidMaxContext(f"max_context must be a positive integer, got {max_context!r}")
    if max_context > config.max_positions:
        raise InvalidMaxContext(f"max_context={max_context} exceeds the model's max_positions="
                                f"{config.max_positions}")
    return int(max_context)
