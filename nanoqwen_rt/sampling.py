"""Host-side token sampling (numpy): greedy, top-k, top-p (nucleus), temperature, seeded.

Order of operations (the same order the CUDA backend's device sampler follows):
  1. temperature == 0  → greedy: argmax (lowest index on ties, as np.argmax).
  2. top_k > 0         → keep the k largest logits (ties at the k-th value broken by lower index).
  3. top_p < 1         → of what is left, keep the smallest set of highest-probability tokens whose
                         probability (softmax of logits / temperature) sums to ≥ top_p (always ≥ 1 token).
  4. sample from softmax(kept logits / temperature) with a seeded np.random.Generator.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

#: The smallest positive temperature: below it sampling is argmax in all but name, and x / t overflows (1e-308 gave
#: NaN probabilities, and the sampler then returned the last id every step); 0 is greedy decoding.
MIN_TEMPERATURE = 1e-4
#: top_k crosses the C ABI as an int32 (nq_sampling.top_k); any value >= the vocabulary means "every token".
MAX_TOP_K = 2**31 - 1
_F32_MAX = float(np.finfo(np.float32).max)   # the CUDA sampler takes the temperature as a float32


def is_real(v) -> bool:
    """A Python or numpy real number (np.float32 included), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))

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
        if not is_real(t) or not np.isfinite(t) or t < 0 or float(t) > _F32_MAX:
            raise InvalidSamplingParams(f"temperature must be a number >= 0 and finite in float32, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:
            raise InvalidSamplingParams(f"temperature {t!r} is below {MIN_TEMPERATURE:g}: use 0 for greedy decoding")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= MAX_TOP_K:
            raise InvalidSamplingParams(f"top_k must be an integer in [0, {MAX_TOP_K}], got {k!r}")
        if not is_real(p) or not np.isfinite(p) or not (0.0 < p <= 1.0):
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            raise InvalidSamplingParams(f"seed must be None or an integer >= 0, got {self.seed!r}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _softmax_t(x: np.ndarray, t: float) -> np.ndarray:
    """float64 softmax of x / t (the reference's operations, shared by the fast path so that they agree bitwise)."""
    z = x / t
    z = z - z.max()
    p = np.exp(z)
    p /= p.sum()
    return p


def _nucleus(top: np.ndarray, p: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest prefix of (top, p) (ids by descending probability) whose mass reaches top_p (the first index
    with cumulative mass >= top_p, inclusive), renormalised."""
    m = int(np.searchsorted(np.cumsum(p), top_p, side="left")) + 1
    m = max(1, min(m, top.shape[0]))
    top, p = top[:m], p[:m]
    return top, p / p.sum()


def _filtered_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """float64 probabilities (vocab,) after top-k, top-p and temperature; zeros outside the kept set."""
    x = np.asarray(logits, dtype=np.float64)
    n = x.shape[0]
    order = np.argsort(-x, kind="stable")          # descending, lower index first on ties
    keep = n
    if params.top_k > 0:
        keep = min(keep, int(params.top_k))
    top = order[:keep]
    p = _softmax_t(x[top], float(params.temperature))
    if params.top_p < 1.0:
        top, p = _nucleus(top, p, params.top_p)
    out = np.zeros(n, dtype=np.float64)
    out[top] = p
    return out


def _top_sorted(x: np.ndarray, m: int) -> np.ndarray:
    """The first m entries of np.argsort(-x, kind="stable") (descending, lower index first on ties), without
    sorting all of x: argpartition finds the m-th largest value, and only the entries at or above it are sorted."""
    part = np.argpartition(-x, m - 1)[:m]
    kth = x[part].min()
    above = np.flatnonzero(x > kth)                              # all strictly larger: fewer than m
    cand = np.concatenate([above, np.flatnonzero(x == kth)[:m - above.shape[0]]])
    return cand[np.lexsort((cand, -x[cand]))]                    # by value descending, then by index


# First nucleus size the fast path tries (doubled until the kept mass reaches top_p): a nucleus is usually tens
# of tokens, so one partial sort of this many entries settles most draws.
_NUCLEUS_FIRST_TRY = 256


def _kept_probs(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """_filtered_probs without its full sort: (kept ids ascending, their probabilities). With top_k the kept set,
    its order and every operation on it are the reference's, so the probabilities are bit-identical; without it
    the softmax sums over the vocabulary in index order instead of sorted order (equal up to float64 rounding,
    ~1e-16 relative), and top_p then keeps the same set except where a cumulative mass lies within that rounding
    of top_p."""
    x = np.asarray(logits, dtype=np.float64)
    n = x.shape[0]
    t = float(params.temperature)
    if 0 < params.top_k < n:
        top = _top_sorted(x, int(params.top_k))
        p = _softmax_t(x[top], t)
        if params.top_p < 1.0:
            top, p = _nucleus(top, p, params.top_p)
        order = np.argsort(top)
        return top[order], p[order]
    p = _softmax_t(x, t)                                         # (n,) softmax over the whole vocabulary
    if params.top_p >= 1.0:
        return np.arange(n), p
    m = min(_NUCLEUS_FIRST_TRY, n)
    while True:
        top = _top_sorted(x, m) if m < n else np.argsort(-x, kind="stable")     # the reference's order
        c = np.cumsum(p[top])
        if c[-1] >= params.top_p or m >= n:
            break
        m = min(2 * m, n)
    k = max(1, min(int(np.searchsorted(c, params.top_p, side="left")) + 1, top.shape[0]))
    top = top[:k]
    q = p[top] / p[top].sum()
    order = np.argsort(top)
    return top[order], q[order]


class Sampler:
    """Stateful sampler: one seeded generator per generation call. Draws from _kept_probs (the fast path: no sort
    of the whole vocabulary) exactly as the reference would from _filtered_probs: one uniform, inverse CDF in
    token-id order."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self._rng: np.random.Generator | None = None

    @property
    def rng(self) -> np.random.Generator:
        """The generator, made at the first draw: greedy requests and those the device samples never draw here, and
        default_rng takes ~0.1-0.2 ms (OS entropy when unseeded), which a prefix-cache hit's TTFT would pay."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.params.seed)
        return self._rng

    def __call__(self, logits: np.ndarray) -> int:
        """logits: float32 (vocab,) → token id."""
        if self.params.greedy:
            return int(np.argmax(logits))
        ids, probs = _kept_probs(logits, self.params)
        # inverse-CDF draw with one uniform over the whole vocabulary in id order: easy to reproduce on other
        # backends. Only kept ids add mass, so the cumulative sums at the kept ids are those of the full (vocab,)
        # vector (adding the zeros between them is exact) and the draw lands on the same id.
        u = self.rng.random()
        c = np.cumsum(probs)
        idx = int(np.searchsorted(c, u * c[-1], side="right"))
        # side="right" lands on the first id whose cumulative mass exceeds the draw, which always carries positive
        # probability; past the end only when u * c[-1] == c[-1] from round-off: then the last id with mass
        if idx >= ids.shape[0]:
            idx = int(np.flatnonzero(probs)[-1])
        return int(ids[idx])


def sample_reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The exact distribution the sampler draws from (float64 (vocab,)), for tests."""
    if params.greedy:
        out = np.zeros(np.asarray(logits).shape[0])
        out[int(np.argmax(logits))] = 1.0
        return out
    return _filtered_probs(logits, params)
