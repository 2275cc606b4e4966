"""The Engine's batched API on the CUDA backend (Engine.submit → nanoqwen_rt/scheduler.py → SessionKv →
nq_decode_batch) with the embedded trained model: plain requests draw their tokens on the device (only the token
comes back), requests with a LogitsPipeline get their logits rows on the host. Checked: greedy batches of 2 (the
decode-GEMV rows of the batched step) and 8 (its GEMMs) against Engine.generate alone; a mixed batch of plain and
constrained rows, each row against itself alone; seeded sampling deterministic per sequence, valid (inside its
top_k), and equal to Engine.generate's device draws where the batched step runs the single stream's kernels
(up to 2 rows: batch.cu kGemvRowsMax)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nanoqwen_quant.convert import convert_checkpoint
from nanoqwen_rt import Engine

pytestmark = pytest.mark.gpu

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-py"
# Greedy tokens, batch vs alone: the batched step's GEMMs (from 3 rows) and the single stream's GEMVs sum in
# different orders, ~1e-3 relative on the logits (tests/test_gpu_batch.py BATCH_TOL); on this model's logits (|x| up
# to ~20) that is ≤ ~0.02. Where the tokens part, the batch's token must be within this of the best logit of the
# alone run at that point (a near tie), else the batch computed something else. 0.1 still catches a wrong KV row,
# position or sampler row (they move the logits by O(1)).
GREEDY_TIE_ATOL = 0.1
# Logprobs of the same token, batch (host log-softmax of the batch's logits) vs alone (the device's steered path):
# the same ~0.02 logit difference as above, through a log-softmax: 0.05.
LOGPROB_ATOL = 0.05


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return convert_checkpoint(MODEL, tmp_path_factory.mktemp("gpu_batch_engine") / "tiny-py.int4.nanoqwen")


@pytest.fixture(scope="module")
def eng(model_file):
    with Engine(model_file, device="cuda", max_batch=16) as e:
        yield e


def _prompt(eng, n, seed):
    text = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
    ids = eng.tokenizer.encode(text * (n // 10 + 1))
    start = int(np.random.default_rng(seed).integers(0, 8))
    return ids[start:start + n]


def _drain(eng, handles):
    out = {h: [] for h in handles}
    steps = 0
    while not all(h.done for h in out):
        eng.step()
        steps += 1
        for h in out:
            out[h] += h.poll()
        assert steps < 5000, "the batch never finished"
    return list(out.values())


def _tokens(chunks):
    return [t for c in chunks for t in c.token_ids]


def _alone(eng, prompt, **kw):
    chunks = list(eng.generate(prompt, **kw))
    return _tokens(chunks), chunks


def _same_greedy(eng, prompt, got, ref, what, pipeline=None):
    """got == ref, or they part at a near tie (GREEDY_TIE_ATOL) of the logits the alone run sampled from (ref's
    raw logits, through a fresh `pipeline` fed ref's tokens when the request has one), after which they may
    differ."""
    raw = eng.logits(list(prompt) + ref[:-1])[len(prompt) - 1:]      # (len(ref), V): the logits of each draw
    for t, (a, b) in enumerate(zip(got, ref)):
        x = raw[t] if pipeline is None else pipeline.process(raw[t])
        if a != b:
            assert x[a] >= x.max() - GREEDY_TIE_ATOL, (
                f"{what}: token {t} is {a} in the batch, {b} alone (logits {x[a]:.4f} vs best {x.max():.4f})")
            return
        if pipeline is not None:
            pipeline.after_sample(x, b)
    assert len(got) == len(ref), f"{what}: {len(got)} tokens in the batch, {len(ref)} alone"


@pytest.mark.parametrize("n", [2, 8], ids=["gemv-rows", "gemm"])
def test_device_sampled_greedy_equals_generate(eng, n):
    """Plain greedy requests draw on the device in the batch: each yields Engine.generate's tokens."""
    kw = dict(max_new_tokens=24, temperature=0.0, stop_token_ids=[])
    prompts = [_prompt(eng, 5 + 23 * i, i) for i in range(n)]
    got = _drain(eng, [eng.submit(p, **kw) for p in prompts])
    for i, (p, chunks) in enumerate(zip(prompts, got)):
        _same_greedy(eng, p, _tokens(chunks), _alone(eng, p, **kw)[0], f"sequence {i} of {n}")
    assert not eng._scheduler.kv._sessions and not eng._scheduler.kv._drawn


def test_mixed_constrained_and_plain_batch(eng):
    """One batch of plain rows (device draws) and rows that need their logits on the host (logprobs, logit_bias,
    a penalty, a JSON grammar): each row yields what it yields alone (greedy), logprobs within LOGPROB_ATOL."""
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    V = int(eng.config.vocab_rows)
    base = dict(max_new_tokens=20, temperature=0.0, stop_token_ids=[])
    asks = [dict(), dict(logprobs=3), dict(), dict(logit_bias={int(eng.tokenizer.encode(" return")[0]): -5.0}),
            dict(frequency_penalty=0.5), dict(), dict(json=True)]
    prompts = [_prompt(eng, 7 + 11 * i, 40 + i) for i in range(len(asks))]

    def kwargs(a):
        kw = dict(base, **{k: v for k, v in a.items() if k != "json"})
        if a.get("json"):
            kw["constraint"] = eng.json_constraint()
        return kw

    def pipeline(a):            # the host's view of what the alone run sampled from (None: the raw logits)
        if not (a.get("json") or a.get("logit_bias") or a.get("frequency_penalty")):
            return None
        settings = LogitsSettings(V, a.get("logit_bias", {}), 0.0, a.get("frequency_penalty", 0.0), None)
        return LogitsPipeline(settings, eng.json_constraint() if a.get("json") else None)
    got = _drain(eng, [eng.submit(p, **kwargs(a)) for p, a in zip(prompts, asks)])
    for i, (p, a, chunks) in enumerate(zip(prompts, asks, got)):
        ref_toks, ref_chunks = _alone(eng, p, **kwargs(a))
        _same_greedy(eng, p, _tokens(chunks), ref_toks, f"row {i} ({sorted(a)})", pipeline(a))
        if "logprobs" in a:
            lp = [x for c in chunks for x in c.logprobs]
            ref_lp = [x for c in ref_chunks for x in c.logprobs]
            assert len(lp) == len(_tokens(chunks))
            for x, y in zip(lp, ref_lp):
                if x.token_id != y.token_id:
                    break
                assert abs(x.logprob - y.logprob) <= LOGPROB_ATOL
    assert not eng._scheduler.kv._sessions and not eng._scheduler.kv._drawn


def test_seeded_sampling_is_deterministic_per_sequence_and_valid(eng):
    """Seeded temperature/top_k/top_p requests draw on the device with their own seed and counter: the same batch
    twice gives the same tokens, different seeds give different streams, every token lies in the top_k of the
    logits alone at its prefix."""
    prompts = [_prompt(eng, 9 + 13 * i, 70 + i) for i in range(6)]
    kw = [dict(max_new_tokens=16, temperature=1.0, top_k=8, top_p=0.95, seed=100 + i, stop_token_ids=[])
          for i in range(6)]
    first = [_tokens(c) for c in _drain(eng, [eng.submit(p, **k) for p, k in zip(prompts, kw)])]
    again = [_tokens(c) for c in _drain(eng, [eng.submit(p, **k) for p, k in zip(prompts, kw)])]
    assert first == again
    reseeded = [_tokens(c) for c in _drain(eng, [eng.submit(p, **dict(k, seed=k["seed"] + 1000))
                                                for p, k in zip(prompts, kw)])]
    assert reseeded != first
    for p, toks in zip(prompts, first):
        lg = eng.logits(list(p) + toks[:-1])[len(p) - 1:]           # (16, V): the logits each token was drawn from
        for t, row in zip(toks, lg):
            # top_k 8 of logits that may differ by ~0.02 from the batch's: inside the top 8 up to a near tie
            assert row[t] >= np.sort(row)[-8] - GREEDY_TIE_ATOL


def test_seeded_batch_of_few_rows_equals_generate(eng):
    """Up to 2 rows the batched step runs the single stream's decode GEMVs, and a plain request's first draw is
    nq_generate's: the same seed yields Engine.generate's tokens on the device (same sampler, same counter)."""
    prompts = [_prompt(eng, 6 + 17 * i, 90 + i) for i in range(2)]
    kw = [dict(max_new_tokens=16, temperature=0.8, top_k=20, seed=7 + i, stop_token_ids=[]) for i in range(2)]
    got = _drain(eng, [eng.submit(p, **k) for p, k in zip(prompts, kw)])
    for i, (p, k, chunks) in enumerate(zip(prompts, kw, got)):
        assert _tokens(chunks) == _alone(eng, p, **k)[0], f"sequence {i}"
