"""The device KV page pool on the GPU (nq_kv_pool_create, nq_session_create_pooled, nq_session_set_pages; the CUDA
backend's SessionKv with shares_pages): a prefix-cache hit reuses the device rows of the cached pages and yields the
cold run's tokens and logits; sequences that share prefix pages decode together in one nq_decode_batch step; a
stress run of the Engine's batched API (random arrivals, cancellations, prefix hits) leaves every page free or
cached and never reads a poisoned row; bad page tables are refused by name. Reference for the logits: each
sequence alone on a session with a cache of its own (nq_logits_all; itself checked against the CPU oracle in
test_gpu_e2e)."""
from __future__ import annotations

import ctypes
import random

import numpy as np
import pytest

from synth import convert_cases, rel_rows  # noqa: E402  (tests/synth.py)

pytestmark = pytest.mark.gpu

CTX = 256
CASES = {
    "qwen2-int4g64": (dict(arch="qwen2", hidden=128, intermediate=256, n_layers=2, n_heads=2, n_kv_heads=1,
                           vocab=384, seed=31), dict(quant="int4", group_size=64)),
    "llama-f16": (dict(arch="llama", hidden=256, intermediate=768, n_layers=2, n_heads=4, n_kv_heads=2, vocab=320,
                       qkv_bias=False, seed=33), dict(quant="none")),
}
# A prefix hit against the cold run of the same prompt: the cached pages hold the very f16 rows the cold run wrote,
# so only the prompt's remaining tokens differ in how they are computed (a GEMM over fewer rows, the prefill
# attention over a shorter query block): float32 summation order, ~1e-5 relative on these logits; a wrong page,
# page table or position moves them by O(1). The same tolerance bounds the pooled path against a session with a
# cache of its own (same kernels, other page numbers).
PREFIX_HIT_TOL = 1e-3
# Decode through nq_decode_batch against the reference's prefill pass: as test_gpu_batch.BATCH_TOL (split-K decode
# attention with f32 scores against the tensor-core prefill kernel's f16 probabilities: ~1e-3 after a few layers).
BATCH_TOL = 1e-2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return convert_cases(tmp_path_factory.mktemp("gpu_pool"), CASES)


def _alone(be, ids):
    """Logits of every position of `ids` on a session with a cache of its own (nq_logits_all): (len(ids), V)."""
    from nanoqwen_rt.backends.cuda.abi import check
    sess = be.new_session(CTX)
    try:
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        out = np.full((ids.shape[0], be.config.vocab_rows), np.nan, dtype=np.float32)
        check(be._lib, "nq_logits_all", sess, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), ids.shape[0],
              out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), what="logits_all")
        return out
    finally:
        be.free_session(sess)


class _Runner:
    """What the scheduler does with a KvPool and the backend's SessionKv, one call at a time."""

    def __init__(self, be, n_pages):
        from nanoqwen_rt.kv_pool import KvPool
        self.be, self.pool, self.kv = be, KvPool(n_pages), be.sequence_kv(n_pages)

    def start(self, ids, capacity):
        """Admit and prefill `ids` (the cached prefix skipped): (seq, logits of the last prompt token)."""
        seq = self.pool.admit(list(ids), capacity)
        self.kv.open(seq, capacity)
        p0 = len(seq.tokens)
        rest = np.ascontiguousarray(ids[p0:], dtype=np.int32)
        self.kv.poison(self.pool.grow(seq, rest))
        lg = self.kv.forward(seq, p0, rest)
        self.pool.publish(seq)
        return seq, lg

    def decode(self, seqs, toks):
        """One token for each of seqs in one forward_decode (one nq_decode_batch step; no set_sampling, so every row
        is host-sampled and its logits come back): (n, V) logits."""
        p0s = [len(s.tokens) for s in seqs]
        for s, t in zip(seqs, toks):
            new = self.pool.grow(s, [int(t)])
            if new:
                self.kv.poison(new)
        drawn, lg = self.kv.forward_decode(seqs, p0s, np.asarray(toks, dtype=np.int32))
        assert (drawn == -1).all() and lg.shape[0] == len(seqs)
        for s in seqs:
            self.pool.publish(s)
        return lg

    def end(self, seq):
        self.kv.close(seq)
        self.pool.release(seq)


@pytest.mark.parametrize("name", list(CASES))
def test_prefix_hit_yields_the_cold_runs_tokens_and_logits(files, name):
    from nanoqwen_rt.backends.cuda import CudaBackend
    be = CudaBackend(files[name], max_context=CTX)
    try:
        r = _Runner(be, 64)
        rng = np.random.default_rng(5)
        ids = rng.integers(0, be.config.vocab_rows, size=45)        # 2 full pages + 13 tokens
        n_new = 20                                                  # decoding crosses into a fresh page

        def run():
            seq, lg = r.start(ids, len(ids) + n_new)
            out, toks = [lg], []
            for _ in range(n_new - 1):
                toks.append(int(out[-1].argmax()))
                out.append(r.decode([seq], [toks[-1]])[0])
            cached = seq.cached_tokens
            r.end(seq)
            return np.stack(out), toks, cached

        cold, cold_toks, cold_cached = run()
        hit, hit_toks, hit_cached = run()
        assert (cold_cached, hit_cached) == (0, 32) and r.pool.prefix_hit_tokens == 32
        assert np.isfinite(cold).all() and np.isfinite(hit).all()
        assert hit_toks == cold_toks
        err = rel_rows(hit, cold).max()
        assert err < PREFIX_HIT_TOL, f"prefix hit vs cold run: relative error {err:.2e}"
        # the pooled path itself against a session with a cache of its own, teacher-forced on the same tokens
        ref = _alone(be, np.concatenate([ids, cold_toks]))[len(ids) - 1:]
        err = rel_rows(cold, ref).max()
        assert err < BATCH_TOL, f"pooled session vs own cache: relative error {err:.2e}"
        r.pool.check([])
    finally:
        be.close()


@pytest.mark.parametrize("n_seqs", [2, 5], ids=["gemv-rows", "gemm"])
def test_sequences_sharing_prefix_pages_decode_in_one_batched_step(files, n_seqs):
    from nanoqwen_rt.backends.cuda import CudaBackend
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    try:
        r = _Runner(be, 96)
        rng = np.random.default_rng(7)
        V = be.config.vocab_rows
        prefix = rng.integers(0, V, size=64)                           # 4 full pages
        first, _ = r.start(np.concatenate([prefix, [1, 2]]), 80)      # computes and publishes the prefix's pages
        prefix_pages = first.pages[:4]
        r.end(first)
        prompts = [np.concatenate([prefix, rng.integers(0, V, size=1 + 3 * i)]) for i in range(n_seqs)]
        steps = 24                                                     # crosses a page boundary for every one
        forced = [rng.integers(0, V, size=steps) for _ in range(n_seqs)]
        seqs, got = [], []
        for p in prompts:
            s, lg = r.start(p, len(p) + steps + 1)
            assert s.cached_tokens == 64 and s.pages[:4] == prefix_pages   # the device rows of the first one
            seqs.append(s)
            got.append([lg])
        for t in range(steps):
            lg = r.decode(seqs, [f[t] for f in forced])
            assert np.isfinite(lg).all()
            for i in range(n_seqs):
                got[i].append(lg[i])
        for i, (p, f) in enumerate(zip(prompts, forced)):
            ref = _alone(be, np.concatenate([p, f]))[len(p) - 1:]
            err = rel_rows(np.stack(got[i]), ref).max()
            assert err < BATCH_TOL, f"sequence {i}: relative error {err:.2e}"
        for s in seqs:
            r.end(s)
        r.pool.check([])
        assert r.pool.used_pages == 0 and not r.kv._sessions
    finally:
        be.close()


def test_pool_stress_arrivals_cancellations_and_hits(files):
    """The Engine's batched API on CUDA over ~1,500 steps: requests arrive at random with prompts drawn from a few
    shared prefixes (hits), some are cancelled mid-way, the pool is small enough that requests wait. Every logprob
    is finite (a read of a poisoned page would make it NaN), and afterwards the pool is consistent with no sequence
    live: no page referenced or reserved, no session open."""
    from nanoqwen_rt import Engine
    rnd = random.Random(11)
    with Engine(files["qwen2-int4g64"], device="cuda", max_context=CTX, max_batch=6, kv_pages=40) as eng:
        V = eng.config.vocab_rows
        prefixes = [[rnd.randrange(V) for _ in range(rnd.choice((16, 33, 50)))] for _ in range(4)]
        live, finished, cancelled = [], 0, 0
        for step in range(1500):
            if rnd.random() < 0.15 and len(live) < 12:
                ids = rnd.choice(prefixes) + [rnd.randrange(V) for _ in range(rnd.randrange(1, 20))]
                live.append([eng.submit(ids, max_new_tokens=rnd.randrange(1, 40), temperature=0.0, logprobs=1,
                                        stop_token_ids=[]), rnd.random() < 0.2])
            eng.step()
            for item in list(live):
                h, cancel = item
                for c in h.poll():
                    assert all(np.isfinite(lp.logprob) for lp in c.logprobs or []), "a poisoned KV row was read"
                if cancel and rnd.random() < 0.05:
                    h.close()
                    live.remove(item)
                    cancelled += 1
                elif h.done:
                    live.remove(item)
                    finished += 1
        for h, _ in live:
            h.close()
        while eng._scheduler.has_work:
            eng.step()
        sched = eng._scheduler
        sched.pool.check([])
        st = eng.batch_stats()
        assert st.kv_pages_used == 0 and st.kv_pages_reserved == 0 and not sched.kv._sessions
        assert st.prefix_hit_tokens > 0 and finished > 50 and cancelled > 0


def test_poisoning_more_pages_than_one_launch_carries(files):
    """nq_kv_pool_poison of 199 pages (the ids go to the kernel by value, 64 a launch: 4 launches) fills every listed
    page and no other, and though it returns without waiting, the fill comes before the next batched step and the
    next step of a session of the pool: a decode that reads a poisoned page gives non-finite logits, one over the page
    not listed stays finite."""
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.abi import NqSampling, check
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    kv = be.sequence_kv(200)
    lib, V = be._lib, be.config.vocab_rows
    made = []

    def i32(a):
        return a.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))

    def session(pages, n_prompt):
        sess = ctypes.c_void_p()
        check(lib, "nq_session_create_pooled", be._model, kv._pool, CTX, ctypes.byref(NqSampling(0.0, 0, 1.0, 0)),
              ctypes.byref(sess))
        made.append(sess)
        pg = np.ascontiguousarray(pages, dtype=np.int32)
        check(lib, "nq_session_set_pages", sess, i32(pg), pg.shape[0], 0)
        ids = np.arange(1, n_prompt + 1, dtype=np.int32)
        check(lib, "nq_prefill", sess, i32(ids), n_prompt)
        return sess

    def logits(sess):
        out = np.empty(V, dtype=np.float32)
        check(lib, "nq_get_logits", sess, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), V)
        return out

    try:
        a = session([150, 199], 20)          # positions 0..15 in page 150 (3rd launch), 16..19 in 199 (4th)
        b = session([7], 10)                 # the page left out
        c = session([120, 121], 18)
        assert all(np.isfinite(logits(s)).all() for s in (a, b, c))
        listed = np.array([p for p in range(200) if p != 7], dtype=np.int32)
        check(lib, "nq_kv_pool_poison", kv._pool, i32(listed), listed.shape[0])
        _, lg = be.decode_batch([a, b], np.array([3, 3], dtype=np.int32), n_logits=2)   # at once: no host wait
        assert not np.isfinite(lg[0]).all(), "the batched step read page 150 before it was poisoned"
        assert np.isfinite(lg[1]).all(), "an unlisted page was poisoned"
        check(lib, "nq_decode", c, 3)        # a pooled session's own step
        assert not np.isfinite(logits(c)).all(), "the session's step read page 120 before it was poisoned"
    finally:
        for s in made:
            lib.nq_session_free(s)
        be.close()


def test_bad_page_tables_are_refused_by_name(files):
    from nanoqwen_rt.backends.base import ContextFull
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.abi import NqSampling, check
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    other = CudaBackend(files["llama-f16"], max_context=CTX)
    lib = be._lib
    kv = be.sequence_kv(8)
    try:
        sess = ctypes.c_void_p()
        greedy = NqSampling(0.0, 0, 1.0, 0)
        check(lib, "nq_session_create_pooled", be._model, kv._pool, 64, ctypes.byref(greedy), ctypes.byref(sess))

        def set_pages(pages, pos):
            a = np.ascontiguousarray(pages, dtype=np.int32)
            check(lib, "nq_session_set_pages", sess, a.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), a.shape[0],
                  pos, what="set_pages")

        def prefill(ids):
            a = np.ascontiguousarray(ids, dtype=np.int32)
            check(lib, "nq_prefill", sess, a.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), a.shape[0],
                  what="prefill")

        with pytest.raises(ContextFull, match="the positions its pages hold: 0"):
            prefill([1, 2, 3])                                        # no pages yet
        with pytest.raises(ValueError, match=r"page id 8 at index 1 out of range \[0, 8\)"):
            set_pages([0, 8], 0)
        with pytest.raises(ValueError, match="page id 3 listed twice"):
            set_pages([3, 1, 3], 0)
        with pytest.raises(ValueError, match=r"position 33 outside \[0, 32\]"):
            set_pages([0, 1], 33)
        with pytest.raises(ValueError, match=r"5 pages outside \[0, 4\]"):
            set_pages([0, 1, 2, 3, 4], 0)
        set_pages([5, 6], 0)
        prefill(list(range(1, 31)))
        with pytest.raises(ContextFull, match="the positions its pages hold: 32"):
            prefill([1, 2, 3])
        with pytest.raises(ValueError, match="a KV cache of its own"):
            check(lib, "nq_session_set_pages", be.session, None, 0, 0, what="set_pages")
        with pytest.raises(ValueError, match="another model"):
            check(lib, "nq_session_create_pooled", other._model, kv._pool, 64, ctypes.byref(greedy),
                  ctypes.byref(ctypes.c_void_p()))
        with pytest.raises(ValueError, match=r"page id -1 at index 0"):
            idx = np.array([-1], dtype=np.int32)
            check(lib, "nq_kv_pool_poison", kv._pool, idx.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), 1)
        lib.nq_session_free(sess)
    finally:
        other.close()
        be.close()


def test_generate_on_a_pooled_session_stops_at_the_end_of_its_pages(files):
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.backend import stream_tokens
    from nanoqwen_rt.backends.cuda.abi import NqSampling, check
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    kv = be.sequence_kv(8)
    try:
        lib = be._lib
        sess = ctypes.c_void_p()
        check(lib, "nq_session_create_pooled", be._model, kv._pool, CTX, ctypes.byref(NqSampling(0.0, 0, 1.0, 0)),
              ctypes.byref(sess))
        pages = np.array([2, 7], dtype=np.int32)
        check(lib, "nq_session_set_pages", sess, pages.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), 2, 0)
        ids = np.arange(1, 21, dtype=np.int32)
        check(lib, "nq_prefill", sess, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), 20)
        toks = list(stream_tokens(lib, sess, 100, np.zeros(0, dtype=np.int32)))
        # prompt + generated reaches the 32 positions its 2 pages hold: 12 tokens (11 decoded into positions 20..30;
        # the last one is produced, not decoded)
        assert len(toks) == 12
        # the same greedy tokens as a session with a cache of its own
        ref = be.new_session(CTX)
        check(lib, "nq_prefill", ref, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), 20)
        assert list(stream_tokens(lib, ref, 12, np.zeros(0, dtype=np.int32))) == toks
        be.free_session(ref)
        lib.nq_session_free(sess)
    finally:
        be.close()


def test_device_memory_and_the_default_pool(files):
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.backend import device_memory, kv_pool_pages
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    try:
        free, total = device_memory(be._lib)
        assert 0 < free <= total
        c = be.config
        assert be.kv_page_bytes() == 2 * c.n_layers * c.n_kv_heads * 16 * c.head_dim * 2
        # a tiny model: max_batch full contexts fit easily
        assert be.default_kv_pages(8) == kv_pool_pages(CTX, 8, be.kv_page_bytes(), free) == 8 * CTX // 16
    finally:
        be.close()
