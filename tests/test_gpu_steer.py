"""The steered sampling step on the device (csrc/src/steer.cu via nq_sample_steered) against its CPU reference
(nanoqwen_rt.logits) on the same CUDA logits: penalties, mask, bias, the sampled token, log-softmax and top-N; then
whole steered generations (grammar, logprobs) on the CUDA backend against the host path on the same backend.
Needs CUDA (marked gpu). The per-token cost: bench/steer_bench.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from qwen25_model import build_qwen25_model_file, find_tokenizer_dir

from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings, apply_token_bitmask, token_logprob
from nanoqwen_rt.sampling import SamplingParams

pytestmark = pytest.mark.gpu

# Device log-softmax: float32 with __expf over 151,936 rows vs the reference's float64; the relative error of log Z
# is ~1e-6, so ~1e-5 absolute for logprobs near -10. 1e-4 leaves room; a wrong normaliser or row is off by > 0.1.
GPU_LOGPROB_TOL = 1e-4
CTX = 256


@pytest.fixture(scope="module")
def qpath(tmp_path_factory):
    find_tokenizer_dir()
    return build_qwen25_model_file(tmp_path_factory.mktemp("qwen25"))


@pytest.fixture(scope="module")
def be(qpath):
    from nanoqwen_rt.backends.cuda import CudaBackend
    b = CudaBackend(qpath, max_context=CTX)
    yield b
    b.close()


def _set_sampling(be, params: SamplingParams):
    import ctypes
    from nanoqwen_rt.backends.cuda.abi import check
    from nanoqwen_rt.backends.cuda.backend import _sampling_struct
    check(be._lib, "nq_session_set_sampling", be._live(), ctypes.byref(_sampling_struct(params)))


def test_device_step_matches_reference(be):
    V = be.config.vocab_rows
    rng = np.random.default_rng(0)
    _set_sampling(be, SamplingParams())
    be.reset()
    logits = be.prefill(np.array([9707, 11, 1879, 0, 13], dtype=np.int32))      # (V,) host copy of the logits
    bias = {int(i): float(v) for i, v in zip(rng.choice(V, 40, replace=False), rng.uniform(-5, 5, 40))}
    settings = LogitsSettings(V, bias, presence_penalty=0.7, frequency_penalty=0.3, top_logprobs=5)
    ref = LogitsPipeline(settings)
    ids = np.array(sorted(bias), dtype=np.int32)
    vals = np.array([bias[i] for i in sorted(bias)], dtype=np.float32)
    for step in range(8):
        mask = rng.integers(-2**31, 2**31, size=(V + 31) // 32, dtype=np.int64).astype(np.int32)   # ~half allowed
        x = ref.process(logits)                        # bias and penalties (the reference has no constraint) ...
        apply_token_bitmask(x, mask)                   # ... then this step's mask
        want_tok = int(np.argmax(x))
        want = token_logprob(x, want_tok, 5)
        tok, lp = be.sample_steered(ids, vals, mask, 0.7, 0.3, 5)
        assert tok == want_tok, step
        assert (int(mask[tok // 32]) >> (tok % 32)) & 1
        assert abs(lp.logprob - want.logprob) < GPU_LOGPROB_TOL
        assert [i for i, _ in lp.top] == [i for i, _ in want.top]
        np.testing.assert_allclose([v for _, v in lp.top], [v for _, v in want.top], atol=GPU_LOGPROB_TOL)
        ref.after_sample(x, tok)                       # the reference's counts follow the device's
        logits = be.decode(tok)


def test_device_sampling_respects_mask(be):
    V = be.config.vocab_rows
    rng = np.random.default_rng(1)
    _set_sampling(be, SamplingParams(temperature=1.5, seed=3))
    be.reset()
    be.prefill(np.array([1, 2, 3], dtype=np.int32))
    allowed = rng.choice(V, 50, replace=False)
    mask = np.zeros((V + 31) // 32, dtype=np.int64)
    for t in allowed:
        mask[t // 32] |= 1 << (t % 32)
    mask = mask.astype(np.uint32).view(np.int32)
    empty = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
    seen = {be.sample_steered(*empty, mask, 0.0, 0.0, -1)[0] for _ in range(200)}
    assert seen <= set(int(t) for t in allowed) and len(seen) > 5
    with pytest.raises(ValueError, match="allows no token"):
        be.sample_steered(*empty, np.zeros_like(mask), 0.0, 0.0, -1)
    with pytest.raises(ValueError, match="given twice"):
        be.sample_steered(np.array([5, 5], dtype=np.int32), np.array([1, 2], dtype=np.float32), None, 0.0, 0.0, -1)


def test_steered_generation_device_equals_host_path(qpath):
    pytest.importorskip("llguidance", reason="the grammar engine is not installed on this machine (.whl/)")
    from nanoqwen_rt import Engine
    from nanoqwen_rt.backends.base import Backend
    with Engine(qpath, device="cuda", max_context=CTX) as eng:
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                                   "s": {"type": "string", "maxLength": 8}},
                  "required": ["n", "s"], "additionalProperties": False}
        ids = np.array(eng.tokenizer.encode("JSON:"), dtype=np.int32)
        stops = set(eng.stop_token_ids)
        sp = SamplingParams()
        settings = LogitsSettings(eng.config.vocab_rows, {}, 0.0, 0.0, 3)
        dev = list(eng.backend._generate_steered(ids, sp, 60, stops,
                                                 LogitsPipeline(settings, eng.json_constraint(schema))))
        host = list(Backend._generate_steered(eng.backend, ids, sp, 60, stops,
                                              LogitsPipeline(settings, eng.json_constraint(schema))))
        assert [t for t, _, _ in dev] == [t for t, _, _ in host]
        for (_, a, _), (_, b, _) in zip(dev, host):
            assert abs(a.logprob - b.logprob) < GPU_LOGPROB_TOL
            assert [i for i, _ in a.top] == [i for i, _ in b.top]
        text = "".join(c.text for c in eng.generate("JSON:", max_new_tokens=60, temperature=1.0, seed=4,
                                                    constraint=eng.json_constraint(schema)))
        assert set(json.loads(text)) == {"n", "s"}
