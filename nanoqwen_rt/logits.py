"""What happens to one step's logits between the forward pass and the sampler, when a request asks for more than
plain sampling: logit_bias, presence/frequency penalties, a grammar's token mask, and the logprobs reported back.

Order (one step):  logits → + logit_bias → − penalties → token mask (disallowed → -inf) → logprobs → sampler.
The logprobs are the log-softmax (temperature 1) of exactly the logits the sampler receives, so a token the mask
forbids never appears in them. Penalties count the tokens generated so far in this sequence (not the prompt), as
vLLM does: presence subtracts `presence_penalty` once from every token that has appeared, frequency subtracts
`frequency_penalty × count`.

The token mask is a bitmask of int32 words, bit i of word i // 32 = token i allowed (the layout llguidance and
xgrammar write). `apply_token_bitmask` is the one masking step; `apply_token_bitmask_reference` is its slow
reference. Every parameter is checked once, when a `LogitsSettings` is built.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol

import numpy as np

from .sampling import is_real

__all__ = ["LogitsSettings", "InvalidLogitsSettings", "TokenLogprob", "TokenConstraint", "LogitsPipeline",
           "apply_token_bitmask", "apply_token_bitmask_reference", "log_softmax", "token_logprob",
           "MAX_TOP_LOGPROBS", "LOGIT_BIAS_RANGE", "PENALTY_RANGE", "MAX_LOGIT_BIAS"]

#: most alternatives one position reports (OpenAI's limit for top_logprobs)
MAX_TOP_LOGPROBS = 20
#: OpenAI's documented range of one logit_bias value
LOGIT_BIAS_RANGE = (-100.0, 100.0)
#: OpenAI's documented range of presence_penalty and frequency_penalty
PENALTY_RANGE = (-2.0, 2.0)
#: most logit_bias entries one request may give (OpenAI documents no limit; clients send a few hundred at most);
#: the same number as NQ_MAX_LOGIT_BIAS (and MAX_TOP_LOGPROBS as NQ_MAX_TOP_LOGPROBS) in csrc/include/nanoqwen.h
MAX_LOGIT_BIAS = 1024


class InvalidLogitsSettings(ValueError):
    """A logit_bias / penalty / logprobs value out of range (the message names it)."""


@dataclass(frozen=True)
class LogitsSettings:
    """Validated when built. top_logprobs None → no logprobs; 0 → the sampled token's logprob only."""
    vocab_rows: int
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.logit_bias, Mapping):
            raise InvalidLogitsSettings(f"logit_bias must be a mapping {{token id: bias}}, got "
                                        f"{type(self.logit_bias).__name__}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidLogitsSettings(f"logit_bias has {len(self.logit_bias)} entries, at most {MAX_LOGIT_BIAS}")
        for k, v in self.logit_bias.items():
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < self.vocab_rows:
                raise InvalidLogitsSettings(f"logit_bias: token id {k!r} outside [0, {self.vocab_rows})")
            if not is_real(v) or not math.isfinite(v) or not LOGIT_BIAS_RANGE[0] <= v <= LOGIT_BIAS_RANGE[1]:
                raise InvalidLogitsSettings(f"logit_bias: value {v!r} for token {k} outside "
                                            f"[{LOGIT_BIAS_RANGE[0]:g}, {LOGIT_BIAS_RANGE[1]:g}]")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not is_real(v) or not math.isfinite(v) or not PENALTY_RANGE[0] <= v <= PENALTY_RANGE[1]:
                raise InvalidLogitsSettings(f"{name} must be in [{PENALTY_RANGE[0]:g}, {PENALTY_RANGE[1]:g}], "
                                            f"got {v!r}")
        n = self.top_logprobs
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer))
                              or not 0 <= n <= MAX_TOP_LOGPROBS):
            raise InvalidLogitsSettings(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {n!r}")

    @property
    def changes_logits(self) -> bool:
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass(frozen=True)
class TokenLogprob:
    """One generated position: the sampled id, its logprob, and the `top` most likely ids (descending)."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class TokenConstraint(Protocol):
    """A grammar that decides which tokens may come next (nanoqwen_rt.grammar implements it)."""

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the allowed-next-token bitmask into `out` (int32 (ceil(vocab_rows / 32),))."""

    def accept(self, token_id: int) -> None:
        """Advance past a sampled token (one the mask allowed)."""

    @property
    def complete(self) -> bool:
        """True once the output is complete (the grammar accepts nothing more but an end token)."""


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """In place: logits[i] = -inf where bit i of the int32 `bitmask` is 0. logits: float32 (n,)."""
    n = logits.shape[0]
    allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little", count=n).view(bool)   # (n,)
    logits[~allowed] = -np.inf


def apply_token_bitmask_reference(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """The same, one token at a time (the reference apply_token_bitmask is tested against)."""
    words = bitmask.astype(np.int64) & 0xFFFFFFFF
    for i in range(logits.shape[0]):
        if not (int(words[i // 32]) >> (i % 32)) & 1:
            logits[i] = -np.inf


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax of float32 (n,) logits (-inf stays -inf)."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x)
    return x - (m + np.log(np.sum(np.exp(x - m))))


def token_logprob(logits: np.ndarray, token_id: int, top_n: int) -> TokenLogprob:
    """The sampled token's logprob and the top_n alternatives (descending; lower id first on ties; only tokens
    with a finite logprob)."""
    lp = log_softmax(logits)
    top: tuple = ()
    if top_n > 0:
        k = min(top_n, lp.shape[0])
        cand = np.argpartition(-lp, k - 1)[:k]
        cand = cand[np.lexsort((cand, -lp[cand]))]
        top = tuple((int(i), float(lp[i])) for i in cand if np.isfinite(lp[i]))
    return TokenLogprob(int(token_id), float(lp[token_id]), top)


class LogitsPipeline:
    """The per-generation state of the steps above: token counts for the penalties, the constraint, the mask
    buffer. `process(logits)` returns the logits to sample from (a new array); `after_sample(logits, token)`
    returns (TokenLogprob or None, complete)."""

    def __init__(self, settings: LogitsSettings, constraint: TokenConstraint | None = None):
        self.settings = settings
        self.constraint = constraint
        n = settings.vocab_rows
        self._bias = None
        if settings.logit_bias:
            self._bias = np.zeros(n, dtype=np.float32)
            for k, v in settings.logit_bias.items():
                self._bias[int(k)] = v
        self._counts = np.zeros(n, dtype=np.int32) if settings.presence_penalty or settings.frequency_penalty \
            else None
        self._mask = np.zeros((n + 31) // 32, dtype=np.int32) if constraint is not None else None

    def process(self, logits: np.ndarray) -> np.ndarray:
        x = np.array(logits, dtype=np.float32)             # (vocab_rows,) a copy: the backend's array stays as is
        if self._bias is not None:
            x += self._bias
        if self._counts is not None:
            s = self.settings
            x -= s.frequency_penalty * self._counts + s.presence_penalty * (self._counts > 0)
        if self.constraint is not None:
            self.constraint.fill_bitmask(self._mask)
            apply_token_bitmask(x, self._mask)
            if not np.isfinite(x).any():
                raise RuntimeError("the grammar allows no next token")
        return x

    def after_sample(self, logits: np.ndarray, token_id: int) -> tuple[TokenLogprob | None, bool]:
        n = self.settings.top_logprobs
        lp = token_logprob(logits, token_id, n) if n is not None else None
        if self._counts is not None:
            self._counts[token_id] += 1
        complete = False
        if self.constraint is not None:
            self.constraint.accept(token_id)
            complete = self.constraint.complete
        return lp, complete
