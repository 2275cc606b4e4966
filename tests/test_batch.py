"""The Engine's batched API (Engine.submit / step / start_loop; nanoqwen_rt/scheduler.py) on the CPU backend with
the embedded trained model (INT4): batch invariance against Engine.generate, prefix-cache hits, cancellation,
a full pool, and the KV pages all coming back."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from nanoqwen_quant.convert import convert_checkpoint
from nanoqwen_rt import Engine
from nanoqwen_rt.engine import EngineClosed, InvalidArgument, KvPoolTooSmall, PromptTooLong
from nanoqwen_rt.kv_pool import KV_PAGE_TOKENS
from nanoqwen_rt.scheduler import PREFILL_CHUNK_TOKENS

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-py"
# Logprobs of the same token, batch vs alone. Same kernels and the same KV values either way, but the batch's
# attention reads rows gathered from pages into a fresh contiguous array (the single sequence reads a strided view
# of its cache: numba compiles another specialization, with another float32 summation order), and a prompt
# computed in PREFILL_CHUNK_TOKENS chunks multiplies other row blocks in its GEMMs: observed ≤ 1.1e-6 on this
# model; 1e-4 leaves a wide margin and still catches a wrong KV row (which moves logprobs by O(0.1..10)).
# The engine runs the oracle numerics: the fast numerics round each product's input to int16, and a
# 1e-6 difference that puts an activation across a rounding boundary moves a logprob by ~1e-4 (tests/test_cpu_fast.py
# bounds the fast numerics against the oracle); this file checks the batching, not the rounding.
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return convert_checkpoint(MODEL, tmp_path_factory.mktemp("batch") / "tiny-py.int4.nanoqwen")


@pytest.fixture(scope="module")
def eng(model_file):
    with Engine(model_file, device="cpu", max_batch=6, cpu_numerics="oracle") as e:
        yield e


def _alone(eng, prompt, **kw):
    chunks = list(eng.generate(prompt, **kw))
    return [t for c in chunks for t in c.token_ids], chunks


def _prompt_ids(eng, n, seed):
    """A real-text prompt of n token ids (Python source from the model's training domain, repeated)."""
    text = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
    ids = eng.tokenizer.encode(text * (n // 10 + 1))
    rng = np.random.default_rng(seed)
    start = int(rng.integers(0, 8))
    return ids[start:start + n]


def _drain(eng, handles, joiners=()):
    """Step until every handle is done; `joiners` [(step index, prompt, kwargs)] are submitted at those steps.
    Returns {handle: [chunks]} in submit order."""
    out = {h: [] for h in handles}
    joiners = sorted(joiners, key=lambda j: j[0])
    step = 0
    while not all(h.done for h in out) or joiners:
        while joiners and joiners[0][0] <= step:
            _, p, kw = joiners.pop(0)
            out[eng.submit(p, **kw)] = []
        eng.step()
        step += 1
        for h in out:
            out[h] += h.poll()
        assert step < 5000, "the batch never finished"
    return out


def test_batch_invariance_mixed_lengths_and_join_times(eng):
    """Each sequence of a batch of mixed prompt lengths (one longer than a prefill chunk) and start steps yields
    the greedy tokens it yields alone, and the same logprobs within LOGPROB_ATOL."""
    kw = dict(max_new_tokens=24, temperature=0.0, stop_token_ids=[], logprobs=3)
    lengths = [5, 40, PREFILL_CHUNK_TOKENS + 70, 17, 3]
    prompts = [_prompt_ids(eng, n, i) for i, n in enumerate(lengths)]
    first = [eng.submit(p, **kw) for p in prompts[:3]]
    got = _drain(eng, first, joiners=[(4, prompts[3], kw), (9, prompts[4], kw)])
    for p, chunks in zip(prompts, got.values()):
        ref_ids, ref_chunks = _alone(eng, p, **kw)
        assert [t for c in chunks for t in c.token_ids] == ref_ids
        a = [lp.logprob for c in chunks for lp in c.logprobs]
        b = [lp.logprob for c in ref_chunks for lp in c.logprobs]
        np.testing.assert_allclose(a, b, rtol=0, atol=LOGPROB_ATOL)
        assert chunks[-1].finish_reason == "length"
    st = eng.batch_stats()
    assert st.running == 0 and st.waiting == 0 and st.kv_pages_used == 0 and st.kv_pages_reserved == 0


def test_a_long_prompt_enters_in_chunks_while_the_others_decode(eng):
    """While a prompt of 3 chunks is computed, a running sequence still gets one token every step."""
    kw = dict(max_new_tokens=30, temperature=0.0, stop_token_ids=[])
    a = eng.submit("def fibonacci(n):", **kw)
    while not a.poll():
        eng.step()
    fresh = np.random.default_rng(99).integers(10, eng.config.vocab_rows, 3 * PREFILL_CHUNK_TOKENS).tolist()
    b = eng.submit(fresh, **kw)                            # ids no other test uses: no prefix-cache hit
    got_b = []
    for i in range(3):
        eng.step()
        assert len(a.poll()) == 1                          # a decoded its token in every step
        got_b.append(len(b.poll()))
    assert got_b == [0, 0, 1]                              # b's prompt took three steps, one chunk each
    a.close()
    b.close()
    assert eng.batch_stats().kv_pages_used == 0


def test_seeded_sampling_and_text_match_generate(eng):
    kw = dict(max_new_tokens=30, temperature=0.9, top_p=0.95, seed=1234, stop=["\n\n"])
    prompts = ["def fibonacci(n):", "import os\n", "class Stack:\n    def push(self, x):"]
    hs = [eng.submit(p, **kw) for p in prompts]
    got = _drain(eng, hs)
    for p, chunks in zip(prompts, got.values()):
        ref = list(eng.generate(p, **kw))
        assert "".join(c.text for c in chunks) == "".join(c.text for c in ref)
        assert chunks[-1].finish_reason == ref[-1].finish_reason


def test_prefix_cache_hit_skips_the_cached_prompt_and_gives_the_same_tokens(eng):
    kw = dict(max_new_tokens=12, temperature=0.0, stop_token_ids=[])
    shared = _prompt_ids(eng, 10 * KV_PAGE_TOKENS + 5, 7)
    a = shared + eng.tokenizer.encode("def first(x):")
    b = shared + eng.tokenizer.encode("class Second:")
    got_a = _drain(eng, [eng.submit(a, **kw)])
    hits1 = eng.batch_stats().prefix_hit_tokens
    got_b = _drain(eng, [eng.submit(b, **kw)])
    hits2 = eng.batch_stats().prefix_hit_tokens
    assert hits2 - hits1 >= 10 * KV_PAGE_TOKENS           # b found the shared pages a left in the cache
    got_a2 = _drain(eng, [eng.submit(a, **kw)])           # a again: its whole prompt but one page is cached
    assert eng.batch_stats().prefix_hit_tokens - hits2 >= 10 * KV_PAGE_TOKENS
    for p, got in ((a, got_a), (b, got_b), (a, got_a2)):
        ids = [t for c in next(iter(got.values())) for t in c.token_ids]
        assert ids == _alone(eng, p, **kw)[0]


def test_cancel_frees_pages_at_once_and_others_go_on(eng):
    kw = dict(max_new_tokens=40, temperature=0.0, stop_token_ids=[])
    p1, p2 = _prompt_ids(eng, 30, 1), _prompt_ids(eng, 50, 2)
    h1, h2 = eng.submit(p1, **kw), eng.submit(p2, **kw)
    for _ in range(5):
        eng.step()
    used = eng.batch_stats().kv_pages_used
    h1.close()                                          # the consumer goes away mid-generation
    st = eng.batch_stats()
    assert st.running == 1 and st.kv_pages_used < used
    rest = _drain(eng, [h2])[h2]                        # h2's chunks of the first steps waited in its handle
    ids = [t for c in rest for t in c.token_ids]
    assert ids == _alone(eng, p2, **kw)[0]
    assert eng.batch_stats().kv_pages_used == 0


def test_iterating_a_handle_steps_the_engine(eng):
    p = "def fibonacci(n):"
    h = eng.submit(p, max_new_tokens=10)
    assert [c.text for c in h] and h.done
    assert "".join(c.text for c in eng.submit(p, max_new_tokens=10)) == \
        "".join(c.text for c in eng.generate(p, max_new_tokens=10))


def test_background_loop_serves_threads(model_file):
    kw = dict(max_new_tokens=16, temperature=0.0, stop_token_ids=[])
    prompts = [f"def f{i}(x):" for i in range(6)]
    with Engine(model_file, device="cpu", max_batch=4) as e:
        refs = [[t for c in e.generate(p, **kw) for t in c.token_ids] for p in prompts]
        e.start_loop()
        results = [None] * len(prompts)

        def consume(i):
            results[i] = [t for c in e.submit(prompts[i], **kw) for t in c.token_ids]
        threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == refs
        e.stop_loop()
        assert e.batch_stats().kv_pages_used == 0
        h = e.submit(prompts[0], **kw)                  # never stepped: still waiting when the engine closes
    with pytest.raises(EngineClosed):
        list(h)


def test_full_pool_queues_and_too_small_pool_refuses(model_file):
    kw = dict(max_new_tokens=30, temperature=0.0, stop_token_ids=[])
    p = "def fibonacci(n):"
    with Engine(model_file, device="cpu", max_batch=8, kv_pages=4) as e:
        n_prompt = len(e.encode(p))
        assert (n_prompt + 30 - 1 + KV_PAGE_TOKENS - 1) // KV_PAGE_TOKENS == 3       # one request fits, not two
        h1, h2 = e.submit(p, **kw), e.submit(p, **kw)
        e.step()
        st = e.batch_stats()
        assert st.running == 1 and st.waiting == 1      # the second waits for pages, the first runs untouched
        out = _drain(e, [h1, h2])
        ref = [t for c in e.generate(p, **kw) for t in c.token_ids]
        assert all([t for c in chunks for t in c.token_ids] == ref for chunks in out.values())
        with pytest.raises(KvPoolTooSmall):
            e.submit(p, max_new_tokens=100)
        assert e.batch_stats().kv_pages_used == 0


def test_bad_arguments_are_named_errors(model_file, eng):
    with pytest.raises(InvalidArgument):
        Engine(model_file, device="cpu", max_batch=0)
    with pytest.raises(InvalidArgument):
        eng.submit("x", max_new_tokens=0)
    with pytest.raises(PromptTooLong):
        eng.submit([1] * eng.max_context)


@pytest.mark.gpu
def test_cuda_batch_runs_sequences_on_their_own_sessions(model_file):
    """The CUDA backend's batched API (a pooled library session per sequence on the device KV pool): each
    sequence of a mixed batch yields the greedy tokens of Engine.generate on the same device, and every sequence's
    session is closed (kept for reuse, without pages) when it ends."""
    kw = dict(max_new_tokens=20, temperature=0.0, stop_token_ids=[])
    with Engine(model_file, device="cuda", max_batch=4) as e:
        prompts = [_prompt_ids(e, n, i) for i, n in enumerate((5, 40, PREFILL_CHUNK_TOKENS + 30))]
        got = _drain(e, [e.submit(p, **kw) for p in prompts[:2]], joiners=[(3, prompts[2], kw)])
        for p, chunks in zip(prompts, got.values()):
            assert [t for c in chunks for t in c.token_ids] == _alone(e, p, **kw)[0]
        assert e.batch_stats().kv_pages_used == 0 and not e._scheduler.kv._sessions
