"""Batched decode on the GPU (nq_decode_batch through CudaBackend.decode_batch): n sessions of one model, each at its
own position in its own cache, in one forward pass. Reference: each sequence alone through nq_logits_all (the
single-sequence batched pass, itself checked against the CPU oracle in test_gpu_e2e)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from synth import convert_cases, rel_rows  # noqa: E402  (tests/synth.py)

pytestmark = pytest.mark.gpu

CTX = 128
CASES = {
    "qwen2-int4g64": (dict(arch="qwen2", hidden=128, intermediate=256, n_layers=2, n_heads=2, n_kv_heads=1,
                           vocab=384, seed=21), dict(quant="int4", group_size=64)),
    # 7 query heads per KV head (the kernel's G), an INT4 lm_head
    "qwen2-gqa7-int4": (dict(arch="qwen2", hidden=448, intermediate=384, n_layers=2, n_heads=7, n_kv_heads=1,
                             vocab=448, seed=23), dict(quant="int4", group_size=64, lm_head="int4")),
    "llama-f16": (dict(arch="llama", hidden=256, intermediate=768, n_layers=2, n_heads=4, n_kv_heads=2, vocab=320,
                       qkv_bias=False, seed=25), dict(quant="none")),
}
# Both paths run the same GEMM kernels on the linear layers; attention differs: the batched step runs the split-K
# decode kernel (f32 scores and sums), the reference the tensor-core prefill kernel (f16 probabilities): ~1e-3 on
# the logits after a few layers; 1e-2 leaves room without hiding a wrong cache, position or page table (O(1)).
BATCH_TOL = 1e-2


# INT4 layout 2 (zero points): twins of the INT4 cases (tests/int4_layout2.py), run through every test below as well
ASYM = {f"{name}-layout2": name for name in ("qwen2-int4g64", "qwen2-gqa7-int4")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from int4_layout2 import layout_2_twins  # tests/int4_layout2.py
    d = tmp_path_factory.mktemp("gpu_batch")
    out = convert_cases(d, CASES)
    for i, (name, src) in enumerate(ASYM.items()):
        out[name] = layout_2_twins(out[src], d / f"{name}.nanoqwen", d / f"{name}.f16.nanoqwen", seed=60 + i)[0]
    return out


def _i32(a):
    return np.ascontiguousarray(a, dtype=np.int32).ctypes.data_as(ctypes.POINTER(ctypes.c_int32))


def _prefill(be, sess, ids):
    from nanoqwen_rt.backends.cuda.abi import check
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    check(be._lib, "nq_prefill", sess, _i32(ids), ids.shape[0], what="prefill")


def _alone(be, ids):
    """Logits of every position of `ids` through nq_logits_all on a fresh session: float32 (len(ids), V)."""
    from nanoqwen_rt.backends.cuda.abi import check
    sess = be.new_session(CTX)
    try:
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        out = np.full((ids.shape[0], be.config.vocab_rows), np.nan, dtype=np.float32)
        check(be._lib, "nq_logits_all", sess, _i32(ids), ids.shape[0],
              out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), what="logits_all")
        return out
    finally:
        be.free_session(sess)


# Up to 2 sequences the step runs the decode GEMVs per token row, above that the GEMMs (batch.cu kGemvRowsMax):
# both are checked (the session swap below keeps the count). Six steps: the first runs as is, the second is
# captured as the batch size's graph, the rest replay it.
@pytest.mark.parametrize("lens", [[1, 17], [1, 5, 17, 40, 33]], ids=["gemv-rows", "gemm"])
@pytest.mark.parametrize("name", list(CASES) + list(ASYM))
def test_batched_decode_matches_each_sequence_alone(files, name, lens):
    from nanoqwen_rt.backends.cuda import CudaBackend
    be = CudaBackend(files[name], max_context=CTX)
    try:
        rng = np.random.default_rng()
        V = be.config.vocab_rows
        lens = list(lens)                    # prompt lengths: every sequence at its own position
        steps = 6
        seqs = [rng.integers(0, V, size=n + steps + 1) for n in lens]   # teacher-forced: step t feeds seq[n + t]
        sessions = [be.session] + [be.new_session(CTX) for _ in lens[1:]]
        for sess, seq, n in zip(sessions, seqs, lens):
            _prefill(be, sess, seq[:n])
        got = []
        for t in range(steps):
            toks = np.array([seq[n + t] for seq, n in zip(seqs, lens)], dtype=np.int32)
            nxt, lg = be.decode_batch(sessions, toks, n_logits=len(sessions))
            assert np.isfinite(lg).all()
            # greedy sessions sample the argmax (the sampler breaks ties towards the lower id, as argmax does)
            np.testing.assert_array_equal(nxt, lg.argmax(axis=-1))
            got.append(lg)
        from nanoqwen_rt.backends.cuda.abi import check
        for i, (sess, seq, n) in enumerate(zip(sessions, seqs, lens)):
            p = ctypes.c_int32()
            check(be._lib, "nq_session_position", sess, ctypes.byref(p), what="position")
            assert p.value == n + steps
            ref = _alone(be, seq)[n:n + steps]
            err = rel_rows(np.stack([g[i] for g in got]), ref).max()
            assert err < BATCH_TOL, f"sequence {i} (prompt {n}): relative error {err:.2e}"
        # a session freed and another created (possibly at the same address) is bound afresh
        k = len(lens) - 1                    # not sessions[0], the backend's own
        be.free_session(sessions.pop(k))
        lens.pop(k)
        seqs.pop(k)
        fresh = rng.integers(0, V, size=9)
        sessions.append(be.new_session(CTX))
        _prefill(be, sessions[-1], fresh[:8])
        toks = np.array([seq[n + steps] for seq, n in zip(seqs, lens)] + [fresh[8]], dtype=np.int32)
        _, lg = be.decode_batch(sessions, toks, n_logits=len(sessions))
        refs = [_alone(be, seq)[n + steps] for seq, n in zip(seqs, lens)] + [_alone(be, fresh)[8]]
        err = rel_rows(lg, np.stack(refs)).max()
        assert err < BATCH_TOL, f"after a session change: relative error {err:.2e}"
        for s in sessions[1:]:
            be.free_session(s)
    finally:
        be.close()


def test_batched_decode_refuses_bad_calls(files):
    from nanoqwen_rt.backends.base import ContextFull
    from nanoqwen_rt.backends.cuda import CudaBackend
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    other = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    try:
        _prefill(be, be.session, [1, 2, 3])
        _prefill(other, other.session, [1, 2, 3])
        with pytest.raises(ValueError, match="appears twice"):
            be.decode_batch([be.session, be.session], np.array([1, 2]))
        with pytest.raises(ValueError, match="another model"):
            be.decode_batch([be.session, other.session], np.array([1, 2]))
        with pytest.raises(ValueError, match="out of range"):
            be.decode_batch([be.session], np.array([be.config.vocab_rows]))
        small = be.new_session(4)
        _prefill(be, small, [1, 2, 3, 4])
        with pytest.raises(ContextFull, match="context full"):
            be.decode_batch([be.session, small], np.array([1, 2]))
        be.free_session(small)
        nxt, _ = be.decode_batch([be.session], np.array([5]))     # nothing was done by the refused calls
        assert 0 <= int(nxt[0]) < be.config.vocab_rows
        assert be.position == 4
    finally:
        other.close()
        be.close()


@pytest.mark.parametrize("n", [2, 6], ids=["gemv-rows", "gemm"])
def test_batched_sampler_draws_with_each_sessions_settings(files, n):
    """The batched step draws every sequence's token in one launch (one block each) with its own session's
    settings, seed and draw counter: each token equals the single-row sampler's (nq_test_sample) on the same
    logits with that session's settings and counter."""
    from nq_testing_lib import load_testing_library
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.abi import NqSampling, check
    tlib = load_testing_library()
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    try:
        rng = np.random.default_rng()
        V = be.config.vocab_rows
        sessions = [be.session] + [be.new_session(CTX) for _ in range(n - 1)]
        # settings per session: greedy, plain temperature, top-k, top-p, and their mixes, each with its own seed
        kinds = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 5, 1.0), (1.2, 0, 0.9), (1.0, 8, 0.8), (0.6, 0, 1.0)]
        settings = [NqSampling(*kinds[i % len(kinds)], int(rng.integers(1, 2**31))) for i in range(n)]
        for sess, sp in zip(sessions, settings):
            check(be._lib, "nq_session_set_sampling", sess, ctypes.byref(sp), what="sampling settings")
            _prefill(be, sess, rng.integers(0, V, size=int(rng.integers(1, 20))))
        toks = rng.integers(0, V, size=n).astype(np.int32)
        for step in range(4):                       # the counter of every session advances with each draw
            nxt, lg = be.decode_batch(sessions, toks, n_logits=len(sessions))
            for i, sp in enumerate(settings):
                out = ctypes.c_int32(-1)
                logits = np.ascontiguousarray(lg[i], dtype=np.float32)
                rc = tlib.nq_test_sample(logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), V,
                                         ctypes.byref(sp), step, ctypes.byref(out))
                assert rc == 0
                assert int(nxt[i]) == out.value, f"step {step}, sequence {i} ({sp.temperature}, {sp.top_k}, {sp.top_p})"
            toks = nxt.astype(np.int32)
        for s in sessions[1:]:
            be.free_session(s)
    finally:
        be.close()


@pytest.mark.parametrize("n", [2, 6], ids=["gemv-rows", "gemm"])
def test_batched_decode_copies_the_logits_of_the_first_rows_only(files, n):
    """nq_decode_batch's n_logits: the logits of sessions 0..n_logits-1 come back, the same as with every row's
    (same sessions, same step: the same numbers), and the tokens are the same; the ABI refuses an n_logits outside
    [0, n] or one that disagrees with the logits pointer."""
    from nanoqwen_rt.backends.base import BackendError
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.abi import check
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    try:
        rng = np.random.default_rng()
        V = be.config.vocab_rows
        prompts = [rng.integers(0, V, size=int(rng.integers(1, 20))) for _ in range(n)]
        a = [be.new_session(CTX) for _ in range(n)]
        b = [be.new_session(CTX) for _ in range(n)]
        for sa, sb, p in zip(a, b, prompts):
            _prefill(be, sa, p)
            _prefill(be, sb, p)
        toks = rng.integers(0, V, size=n).astype(np.int32)
        nxt_all, lg_all = be.decode_batch(a, toks, n_logits=n)
        nxt_few, lg_few = be.decode_batch(b, toks, n_logits=n - 1)
        np.testing.assert_array_equal(nxt_few, nxt_all)
        assert lg_few.shape == (n - 1, V)
        np.testing.assert_array_equal(lg_few, lg_all[:n - 1])
        nxt_none, lg_none = be.decode_batch(a, nxt_all)
        assert lg_none is None and nxt_none.shape == (n,)
        with pytest.raises(BackendError, match="n_logits"):
            be.decode_batch(a, toks, n_logits=n + 1)
        handles = (ctypes.c_void_p * n)(*[s.value for s in b])
        out = np.empty(n, dtype=np.int32)
        with pytest.raises(ValueError, match="n_logits"):       # a count without a buffer
            check(be._lib, "nq_decode_batch", be._batch, handles, _i32(toks), n, _i32(out), None, 1, what="batch")
        for s in a + b:
            be.free_session(s)
    finally:
        be.close()


# The pipelined halves (nq_decode_batch_launch / _wait): greedy sessions decoding their own draws, each step launched
# before the previous one is waited and fed that step's draws on the device (chain), in a changing row order, must
# give the tokens of the same sessions stepped one call at a time (same kernels, same inputs: equal tokens). 2 and 5
# rows: the decode-GEMV and the GEMM steps.
@pytest.mark.parametrize("n", [2, 5])
@pytest.mark.parametrize("name", ["qwen2-int4g64", "llama-f16"])
def test_pipelined_batched_decode_equals_one_call_steps(files, name, n):
    from nanoqwen_rt.backends.cuda import CudaBackend
    be = CudaBackend(files[name], max_context=CTX)
    try:
        rng = np.random.default_rng()
        V = be.config.vocab_rows
        prompts = [rng.integers(0, V, size=int(k)) for k in rng.integers(3, 30, size=n)]
        steps = 12
        ref_s = [be.new_session(CTX) for _ in range(n)]
        for s, p in zip(ref_s, prompts):
            _prefill(be, s, p)
        first = rng.integers(0, V, size=n).astype(np.int32)
        ref, toks = [], first
        for _ in range(steps):
            toks, _ = be.decode_batch(ref_s, toks)
            ref.append(toks.copy())
        pipe_s = [be.new_session(CTX) for _ in range(n)]
        for s, p in zip(pipe_s, prompts):
            _prefill(be, s, p)
        order = np.arange(n)
        be.decode_batch_launch(pipe_s, first)
        got = []
        for t in range(steps):
            if t + 1 < steps:                 # the next step, fed on the device, before this one is waited
                new = rng.permutation(n)      # rows in a new order: chain[i] = the previous row of session new[i]
                chain = np.argsort(order)[new].astype(np.int32)
                be.decode_batch_launch([pipe_s[i] for i in new], np.zeros(n, dtype=np.int32), chain)
            drawn = be.decode_batch_wait(n)
            back = np.empty(n, dtype=np.int32)
            back[order] = drawn
            got.append(back)
            if t + 1 < steps:
                order = new
        np.testing.assert_array_equal(np.stack(got), np.stack(ref))
        for s in ref_s + pipe_s:
            be.free_session(s)
    finally:
        be.close()


def test_pipelined_batched_decode_refuses_bad_calls(files):
    from nanoqwen_rt.backends.cuda import CudaBackend
    be = CudaBackend(files["qwen2-int4g64"], max_context=CTX)
    try:
        a, b = be.new_session(CTX), be.new_session(CTX)
        _prefill(be, a, [1, 2, 3])
        _prefill(be, b, [4, 5])
        with pytest.raises(ValueError, match="no launched step"):
            be.decode_batch_wait(2)
        be.decode_batch_launch([a, b], np.array([1, 2]))
        with pytest.raises(ValueError, match="in flight"):
            _prefill(be, a, [7])                             # a session in flight takes no other call
        with pytest.raises(ValueError, match="not waited"):
            be.decode_batch([a, b], np.array([1, 2]))       # nor does the batch a one-call step
        with pytest.raises(ValueError, match="chain"):
            be.decode_batch_launch([a, b], np.array([1, 2]), np.array([0, 0], dtype=np.int32))   # a row twice
        with pytest.raises(ValueError, match="chain"):
            be.decode_batch_launch([a, b], np.array([1, 2]), np.array([2, -1], dtype=np.int32))  # no such row
        be.decode_batch_launch([b, a], np.array([0, 0]), np.array([1, 0], dtype=np.int32))
        with pytest.raises(ValueError, match="in flight already"):
            be.decode_batch_launch([a, b], np.array([0, 0]), np.array([0, 1], dtype=np.int32))
        with pytest.raises(ValueError, match="2 rows"):
            be.decode_batch_wait(3)
        first = be.decode_batch_wait(2)
        second = be.decode_batch_wait(2)
        assert ((0 <= first) & (first < be.config.vocab_rows)).all() and second.shape == (2,)
        _prefill(be, a, [7])                                 # waited: the sessions are free again
        for s in (a, b):
            be.free_session(s)
    finally:
        be.close()
