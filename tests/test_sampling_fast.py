"""The host sampler's fast path (nanoqwen_rt.sampling._kept_probs: no sort of the whole vocabulary) against its
slow reference (_filtered_probs, the full stable sort): the same kept set and probabilities, and the same draws
for the same seed, over logits with ties, -inf (a grammar's mask) and every top_k / top_p regime."""
from __future__ import annotations

import numpy as np
import pytest

from nanoqwen_rt.sampling import Sampler, SamplingParams, _filtered_probs, _kept_probs, _top_sorted

# Without top_k the fast path normalises the softmax with a sum in token-id order, the reference in sorted order:
# the probabilities differ by float64 rounding of the normaliser (~1e-16 relative); 1e-12 is far above that and
# far below any real difference (a wrong kept set or temperature moves probabilities by > 1e-6).
PROB_RTOL = 1e-12


def _reference_draw(logits, params, rng) -> int:
    """Sampler.__call__ as it was before the fast path: the reference distribution, one uniform, inverse CDF."""
    probs = _filtered_probs(logits, params)
    c = np.cumsum(probs)
    idx = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    return min(idx, int(np.flatnonzero(probs)[-1]))


def _cases(seed: int, n: int):
    rng = np.random.default_rng(seed)
    for trial in range(n):
        V = int(rng.choice([7, 50, 500, 3000, 151936] if trial % 8 == 0 else [7, 50, 500, 3000]))
        x = (rng.standard_normal(V) * rng.choice([0.5, 3.0, 10.0])).astype(np.float32)
        if trial % 3 == 0:
            x[rng.integers(0, V, V // 3)] = -np.inf                       # masked tokens
        if trial % 4 == 0:
            x = np.round(x)                                                # many exact ties
        x[rng.integers(0, V)] = max(float(x.max()), 0.0) + 1.0             # at least one finite logit
        params = SamplingParams(float(rng.choice([0.3, 1.0, 2.0])), int(rng.choice([0, 1, 5, 40, V, V + 3])),
                                float(rng.choice([1.0, 0.9, 0.5, 0.99999, 1e-3])), seed=trial)
        yield x, params


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_probabilities_equal_the_reference(seed):
    for x, params in _cases(seed, 120):
        ref = _filtered_probs(x, params)
        ids, p = _kept_probs(x, params)
        assert np.all(np.diff(ids) > 0)
        got = np.zeros_like(ref)
        got[ids] = p
        if 0 < params.top_k < x.shape[0]:
            np.testing.assert_array_equal(got, ref)      # same kept order and operations: bit-identical
        else:
            assert set(np.flatnonzero(got)) == set(np.flatnonzero(ref))
            np.testing.assert_allclose(got, ref, rtol=PROB_RTOL, atol=0)


@pytest.mark.parametrize("seed", [3, 4])
def test_fast_draws_equal_the_reference_draws(seed):
    for x, params in _cases(seed, 80):
        s = Sampler(params)
        rng = np.random.default_rng(params.seed)                     # the Sampler's own stream, replayed
        for _ in range(6):
            assert s(x) == _reference_draw(x, params, rng)


def test_top_sorted_is_the_stable_descending_sort():
    rng = np.random.default_rng(5)
    for _ in range(200):
        V = int(rng.integers(1, 400))
        x = np.round(rng.standard_normal(V) * 2)                          # ties at every cut
        x[rng.integers(0, V, V // 4)] = -np.inf
        m = int(rng.integers(1, V + 1))
        np.testing.assert_array_equal(_top_sorted(x, m), np.argsort(-x, kind="stable")[:m])
