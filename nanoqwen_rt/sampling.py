"""Host-side token sampling (numpy): greedy, top-k, top-p (nucleus), temperature, seeded.

Order of operations (the same order the CUDA backend's device sampler follows):
  1. temperature == 0  → greedy: argmax (lowest index on ties, as np.argmax).
  2. top_k > 0         → keep the k largest logits (ties at the k-th value broken by lower index).
  3. top_p < 1         → of what is left, keep the smallest set of highest-probability tokens whose
                         probability (softmax of logits / temperature) sums to ≥ top_p (always ≥ 1 token).
  4. sample from softmax(kept logits / temperature) with a seeded np.random.Generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SamplingParams", "Sampler", "InvalidSamplingParams", "sample_reference"]


class InvalidSamplingParams(ValueError):
    """A sampling parameter is out of range (message names it, with the value found)."""


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 → greedy; top_k 0 → off; top_p 1.0 → off; seed None → fresh OS entropy.

    Checked once, when built (InvalidSamplingParams): a SamplingParams that exists is valid, so the backends and
    the sampler take it as it is.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "SamplingParams":
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or not np.isfinite(t) or t < 0:
            raise InvalidSamplingParams(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise InvalidSamplingParams(f"top_k must be an integer >= 0, got {k!r}")
        if not isinstance(p, (int, float)) or not np.isfinite(p) or not (0.0 < p <= 1.0):
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            raise InvalidSamplingParams(f"seed must be None or an integer >= 0, got {self.seed!r}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _filtered_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """float64 probabilities (vocab,) after top-k, top-p and temperature; zeros outside the kept set."""
    x = np.asarray(logits, dtype=np.float64)
    n = x.shape[0]
    order = np.argsort(-x, kind="stable")          # descending, lower index first on ties
    keep = n
    if params.top_k > 0:
        keep = min(keep, int(params.top_k))
    top = order[:keep]
    z = x[top] / float(params.temperature)
    z = z - z.max()
    p = np.exp(z)
    p /= p.sum()
    if params.top_p < 1.0:
        c = np.cumsum(p)
        # smallest prefix whose mass reaches top_p: first index with c >= top_p, inclusive
        m = int(np.searchsorted(c, params.top_p, side="left")) + 1
        m = max(1, min(m, keep))
        top, p = top[:m], p[:m]
        p = p / p.sum()
    out = np.zeros(n, dtype=np.float64)
    out[top] = p
    return out


class Sampler:
    """Stateful sampler: one seeded generator per generation call."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """logits: float32 (vocab,) → token id."""
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = _filtered_probs(logits, self.params)
        # inverse-CDF draw with one uniform: easy to reproduce on other backends
        u = self.rng.random()
        c = np.cumsum(probs)
        idx = int(np.searchsorted(c, u * c[-1], side="right"))
        # side="right" lands on the first index whose cumulative mass exceeds the draw, which always
        # carries positive probability; the min() only guards u * c[-1] == c[-1] from round-off.
        return min(idx, int(np.flatnonzero(probs)[-1]))


def sample_reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The exact distribution the sampler draws from (float64 (vocab,)), for tests."""
    if params.greedy:
        out = np.zeros(np.asarray(logits).shape[0])
        out[int(np.argmax(logits))] = 1.0
        return out
    return _filtered_probs(logits, params)
