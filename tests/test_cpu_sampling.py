"""Host sampler vs transformers' logits warpers (temperature → top-k → top-p), and its draws vs its distribution."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,  # noqa: E402
                                                    TopPLogitsWarper)

from nanoqwen_rt.sampling import InvalidSamplingParams, Sampler, SamplingParams, sample_reference  # noqa: E402

# float64 (ours) vs float32 softmax (transformers): probabilities agree to ~1e-7 absolute.
PROB_ATOL = 1e-6


def _hf_probs(logits, p: SamplingParams) -> np.ndarray:
    x = torch.from_numpy(logits.astype(np.float32))[None]
    ids = torch.zeros((1, 1), dtype=torch.long)
    x = TemperatureLogitsWarper(p.temperature)(ids, x)
    if p.top_k > 0:
        x = TopKLogitsWarper(p.top_k)(ids, x)
    if p.top_p < 1.0:
        x = TopPLogitsWarper(p.top_p)(ids, x)
    return torch.softmax(x, dim=-1)[0].double().numpy()


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0), (1.0, 0, 0.9), (0.8, 50, 0.8),
                                   (2.0, 5, 0.5), (0.5, 0, 0.3), (1.0, 1, 1.0)])
def test_distribution_matches_transformers_warpers(t, k, p):
    rng = np.random.default_rng(int(t * 100) + k + int(p * 10))
    for _ in range(5):
        logits = (rng.standard_normal(500) * 3).astype(np.float32)
        params = SamplingParams(temperature=t, top_k=k, top_p=p)
        ours = sample_reference(logits, params)
        ref = _hf_probs(logits, params)
        assert set(np.flatnonzero(ours)) == set(np.flatnonzero(ref > 0))
        np.testing.assert_allclose(ours, ref, atol=PROB_ATOL, rtol=0)


def test_draws_follow_the_distribution():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(12).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.95, seed=11)
    probs = sample_reference(logits, params)
    s = Sampler(params)
    n = 20000
    counts = np.bincount([s(logits) for _ in range(n)], minlength=12)
    assert counts[probs == 0].sum() == 0
    # each observed frequency within 5 binomial standard deviations (false-failure odds ~1e-6 per token)
    sd = np.sqrt(n * probs * (1 - probs))
    assert np.all(np.abs(counts - n * probs) <= 5 * sd + 1)


def test_greedy_and_seeded_reproducibility():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(300).astype(np.float32)
    assert Sampler(SamplingParams())(logits) == int(np.argmax(logits))
    a = Sampler(SamplingParams(temperature=1.0, seed=42))
    b = Sampler(SamplingParams(temperature=1.0, seed=42))
    c = Sampler(SamplingParams(temperature=1.0, seed=43))
    ra, rb, rc = [a(logits) for _ in range(50)], [b(logits) for _ in range(50)], [c(logits) for _ in range(50)]
    assert ra == rb and ra != rc


@pytest.mark.parametrize("kw", [{"temperature": -1.0}, {"temperature": float("nan")}, {"top_k": -1},
                                {"top_k": 1.5}, {"top_p": 0.0}, {"top_p": 1.5}, {"seed": -3}, {"seed": "x"}])
def test_invalid_params_are_named(kw):
    with pytest.raises(InvalidSamplingParams, match=next(iter(kw))):
        SamplingParams(**kw).validate()
