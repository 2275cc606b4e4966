"""CPU tests of the CUDA backend's Python side, against fake libraries (no GPU, no libnanoqwen needed): the error
of a call is read on the thread that made it, statuses map to named exceptions (out of memory → MemoryError),
supports() asks the library, and the reasons why the library cannot load are named."""
from __future__ import annotations

import ctypes
import threading
import types

import numpy as np
import pytest

from nanoqwen_rt.backends import BackendError, ContextFull
from nanoqwen_rt.backends.cuda import abi, backend as cuda_backend


class FakeLib:
    """The few entry points under test, with a thread-local nq_last_error as libnanoqwen keeps it."""

    def __init__(self, model_check_rc=None, model_check_msg=b""):
        self._tls = threading.local()
        if model_check_rc is not None:
            def nq_model_check(path):
                if model_check_rc:
                    self._fail(model_check_msg)
                return model_check_rc
            self.nq_model_check = nq_model_check

    def _fail(self, msg: bytes):
        self._tls.msg = msg

    def nq_last_error(self):
        return getattr(self._tls, "msg", None)

    def nq_generate(self, sess, max_new, stops, n_stop, cb, user, out, n_out):
        for tok in (7, 8):                     # two tokens, then a failure inside "the library"
            cb(tok, None)
        self._fail(b"generate launch: out of resources (from the worker)")
        return abi.NQ_E_CUDA


def test_generation_error_is_read_on_the_worker_thread():
    lib = FakeLib()
    lib._fail(b"stale message of an earlier call on the caller's thread")
    got = []
    with pytest.raises(BackendError) as e:
        for tok in cuda_backend.stream_tokens(lib, None, 5, np.zeros(0, dtype=np.int32)):
            got.append(tok)
    assert got == [7, 8]                       # the tokens produced before the failure arrive first
    assert str(e.value) == "generate: generate launch: out of resources (from the worker)"


def test_call_reads_the_message_only_on_failure():
    lib = FakeLib(model_check_rc=0)
    lib._fail(b"stale")
    assert abi.call(lib, "nq_model_check", b"x") == (abi.NQ_OK, "")


@pytest.mark.parametrize("rc,cls", [(abi.NQ_E_CONTEXT_FULL, ContextFull), (abi.NQ_E_INVALID_ARG, ValueError),
                                    (abi.NQ_E_UNSUPPORTED, abi.UnsupportedModel),
                                    (abi.NQ_E_OUT_OF_MEMORY, MemoryError), (abi.NQ_E_CUDA, BackendError),
                                    (abi.NQ_E_FORMAT, BackendError)])
def test_status_maps_to_a_named_exception(rc, cls):
    e = abi.error_for_status(rc, "the library's words", "open m.nanoqwen")
    assert isinstance(e, cls) and str(e) == "open m.nanoqwen: the library's words"


def test_out_of_memory_is_a_memory_error_and_a_backend_error():
    e = abi.error_for_status(abi.NQ_E_OUT_OF_MEMORY, "", "create session")
    assert isinstance(e, abi.OutOfDeviceMemory) and isinstance(e, MemoryError) and isinstance(e, BackendError)
    assert str(e) == "create session: NQ_E_OUT_OF_MEMORY"      # no message from the library: the status name


def test_status_table_is_the_header_enum():
    assert abi.NQ_STATUS == {"NQ_OK": 0, "NQ_E_INVALID_ARG": -1, "NQ_E_IO": -2, "NQ_E_FORMAT": -3,
                             "NQ_E_UNSUPPORTED": -4, "NQ_E_CUDA": -5, "NQ_E_CONTEXT_FULL": -6,
                             "NQ_E_NO_DEVICE": -7, "NQ_E_OUT_OF_MEMORY": -8}
    assert ctypes.sizeof(abi.NqSampling) == 24


@pytest.fixture
def fake_loaded(monkeypatch):
    """Install a fake as the loaded library."""
    def install(lib):
        monkeypatch.setattr(abi, "_lib", lib)
        monkeypatch.setattr(abi, "_lib_error", None)
    return install


def test_supports_asks_the_library(fake_loaded):
    fake_loaded(FakeLib(model_check_rc=abi.NQ_E_UNSUPPORTED, model_check_msg=b"head_dim 32 (runs 64 or 128)"))
    assert cuda_backend.supports("m.nanoqwen") == "head_dim 32 (runs 64 or 128)"
    fake_loaded(FakeLib(model_check_rc=abi.NQ_OK))
    assert cuda_backend.supports("m.nanoqwen") is None


def test_supports_names_a_library_without_model_check(fake_loaded):
    fake_loaded(FakeLib())
    with pytest.raises(abi.LibraryUnavailable, match="lacks nq_model_check"):
        cuda_backend.supports("m.nanoqwen")


def _complete_fake(version=abi.NQ_ABI_VERSION, drop=()):
    ns = types.SimpleNamespace()
    for name in abi.SIGNATURES:
        if name not in drop:
            setattr(ns, name, types.SimpleNamespace())
    ns.nq_abi_version = lambda: version
    return ns


def test_bind_names_a_missing_symbol_and_an_abi_mismatch(tmp_path):
    with pytest.raises(abi.LibraryUnavailable, match="lacks nq_generate"):
        abi._bind(_complete_fake(drop=("nq_generate",)), tmp_path / "lib.so")
    with pytest.raises(abi.LibraryUnavailable, match=f"ABI version 99, this binding expects {abi.NQ_ABI_VERSION}"):
        abi._bind(_complete_fake(version=99), tmp_path / "lib.so")


def test_load_reasons_are_named_and_available_never_raises(monkeypatch, tmp_path):
    monkeypatch.setattr(abi, "_lib", None)
    monkeypatch.setattr(abi, "_lib_error", None)
    monkeypatch.setenv("NANOQWEN_LIB", str(tmp_path / "missing.so"))
    assert cuda_backend.available() is False
    assert "libnanoqwen not found at" in cuda_backend.unavailable_reason()
    with pytest.raises(abi.LibraryUnavailable, match="missing.so"):
        abi.load_library()
    monkeypatch.setattr(abi, "_lib_error", None)
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF but not really")
    monkeypatch.setenv("NANOQWEN_LIB", str(junk))
    why = cuda_backend.unavailable_reason()
    assert why.startswith(f"cannot load {junk}: ") and len(why) > len(f"cannot load {junk}: ")   # dlopen's text


def test_no_device_is_named(fake_loaded):
    lib = FakeLib()
    lib.nq_device_count = lambda: 0
    fake_loaded(lib)
    assert "sees no CUDA device (nq_device_count() = 0)" in cuda_backend.unavailable_reason()


class _FakePoolLib(FakeLib):
    """A KV page pool and pooled sessions whose "logits" are a function of the tokens READ BACK THROUGH EACH
    SESSION'S PAGE TABLE (argmax = (sum of the ids at positions [0, pos) + pos) % vocab; a row nobody wrote since
    its page was poisoned gives NaN logits), so a page table, position or page sharing the binding got wrong shows
    in the tokens. Prompts go through nq_prefill, the decode tokens of a step through one nq_decode_batch; the
    argument rules of nq_session_set_pages are checked as the library checks them. The fake's "device sampler"
    draws that argmax shifted by the session's seed when its temperature is > 0 (so a token shows whose settings
    drew it); a draw from a poisoned row fails the test."""

    V = 50
    P = 16

    def __init__(self):
        super().__init__()
        self.rows: dict[int, list] = {}
        self.sessions: dict[int, dict] = {}
        self.shift: dict[int, int] = {}
        self.created = 0
        self.freed: list[int] = []
        self.calls: list = []
        self.set_pages: list[tuple] = []          # (session, n_pages, position) of every nq_session_set_pages
        self.pool_freed = False
        self._next = 1

    def nq_kv_pool_create(self, model, n_pages, out):
        self.rows = {p: [None] * self.P for p in range(n_pages)}
        out._obj.value = 77
        return abi.NQ_OK

    def nq_kv_pool_poison(self, pool, pages, n):
        ids = np.ctypeslib.as_array(pages, shape=(n,)).tolist()
        self.calls.append(("poison", ids))
        for p in ids:
            self.rows[p] = [None] * self.P
        return abi.NQ_OK

    def nq_kv_pool_free(self, pool):
        self.pool_freed = True

    def nq_session_create_pooled(self, model, pool, max_ctx, sampling, out):
        sid, self._next = self._next, self._next + 1
        self.created += 1
        self.sessions[sid] = {"pages": [], "pos": 0}
        self.shift[sid] = 0
        out._obj.value = sid
        return abi.NQ_OK

    def nq_session_reset(self, sess):
        self.sessions[sess.value]["pos"] = 0
        return abi.NQ_OK

    def nq_session_set_sampling(self, sess, sampling):
        sp = sampling._obj
        self.calls.append(f"set_sampling {sess.value}")
        self.shift[sess.value] = int(sp.seed) if sp.temperature > 0 else 0
        return abi.NQ_OK

    def nq_session_set_pages(self, sess, pages, n, position):
        ids = np.ctypeslib.as_array(pages, shape=(n,)).tolist() if n else []
        if any(p < 0 or p >= len(self.rows) for p in ids) or len(set(ids)) != n or not 0 <= position <= n * self.P:
            self._fail(b"set_pages: bad arguments")
            return abi.NQ_E_INVALID_ARG
        self.set_pages.append((sess.value, n, position))
        self.sessions[sess.value].update(pages=ids, pos=position)
        return abi.NQ_OK

    def _write(self, sid, tok):
        s = self.sessions[sid]
        p = s["pos"]
        if p >= len(s["pages"]) * self.P:
            raise AssertionError(f"session {sid} writes position {p} past its {len(s['pages'])} pages")
        self.rows[s["pages"][p // self.P]][p % self.P] = int(tok)
        s["pos"] += 1

    def _next_token(self, sid):
        s = self.sessions[sid]
        toks = [self.rows[s["pages"][i // self.P]][i % self.P] for i in range(s["pos"])]
        return None if None in toks else (sum(toks) + len(toks)) % self.V

    def _draw(self, sid):
        t = self._next_token(sid)
        if t is None:
            raise AssertionError(f"session {sid} drew from a row nobody wrote (a poisoned page)")
        return (t + self.shift[sid]) % self.V

    def nq_prefill(self, sess, ids, n):
        self.calls.append("prefill")
        for t in np.ctypeslib.as_array(ids, shape=(n,)):
            self._write(sess.value, t)
        return abi.NQ_OK

    def nq_decode(self, sess, tok):
        self.calls.append("decode")
        self._write(sess.value, tok)
        return abi.NQ_OK

    def nq_get_logits(self, sess, out, n):
        self.calls.append("get_logits")
        a = np.ctypeslib.as_array(out, shape=(n,))
        t = self._next_token(sess.value)
        a[:] = np.nan if t is None else 0.0
        if t is not None:
            a[t] = 1.0
        return abi.NQ_OK

    def nq_sample_steered(self, sess, bias_ids, bias_vals, n_bias, mask, n_mask, presence, frequency, top_n, tok,
                          lp, top_ids, top_lps, n_top):
        assert (bias_ids, bias_vals, n_bias, mask, n_mask, presence, frequency, top_n) == \
            (None, None, 0, None, 0, 0.0, 0.0, -1)                 # nothing steered: the sampler alone
        self.calls.append("sample")
        tok._obj.value = self._draw(sess.value)
        return abi.NQ_OK

    def nq_session_free(self, sess):
        self.freed.append(sess if isinstance(sess, int) else sess.value)

    def nq_batch_create(self, model, max_batch, out):
        out._obj.value = 999
        return abi.NQ_OK

    def nq_decode_batch(self, batch, sessions, tokens, n, next_tokens, logits, n_logits):
        self.calls.append(f"decode_batch {n} logits {n_logits}")
        assert (n_logits > 0) == bool(logits)
        toks = np.ctypeslib.as_array(tokens, shape=(n,))
        nxt = np.ctypeslib.as_array(next_tokens, shape=(n,))
        lg = np.ctypeslib.as_array(logits, shape=(n_logits, self.V)) if n_logits else None
        for i in range(n):
            sid = sessions[i]
            self._write(sid, toks[i])
            if i < n_logits:                                   # a host-sampled row: its logits, its draw unread
                t = self._next_token(sid)
                lg[i] = np.nan if t is None else 0.0
                if t is not None:
                    lg[i, t] = 1.0
                nxt[i] = -7
            else:
                nxt[i] = self._draw(sid)
        return abi.NQ_OK

    # the pipelined halves (nq_decode_batch_launch / _wait): a launched step's rows are written and drawn at once
    # (the fake has no device time); a chained row takes the previous step's draw for that row, as the library does
    _last_draws: list = []
    _flight: list = []

    def nq_decode_batch_launch(self, batch, sessions, tokens, chain, n):
        self.calls.append(f"decode_batch {n} logits 0")
        assert len(self._flight) < 2, "a third step launched before the first was waited"
        toks = np.ctypeslib.as_array(tokens, shape=(n,))
        ch = np.ctypeslib.as_array(chain, shape=(n,)) if chain else np.full(n, -1)
        draws = []
        for i in range(n):
            t = self._last_draws[ch[i]] if ch[i] >= 0 else toks[i]
            self._write(sessions[i], t)
            draws.append(self._draw(sessions[i]))
        self._last_draws = draws
        self._flight.append(draws)
        return abi.NQ_OK

    def nq_decode_batch_wait(self, batch, next_tokens, n):
        draws = self._flight.pop(0)
        assert len(draws) == n
        np.ctypeslib.as_array(next_tokens, shape=(n,))[:] = draws
        return abi.NQ_OK

    def nq_batch_free(self, batch):
        self.calls.append("batch_free")


def _fake_backend(lib, max_context=256):
    be = object.__new__(cuda_backend.CudaBackend)          # no device: only what the batched API touches
    be._lib, be._model, be._sess = lib, ctypes.c_void_p(1), ctypes.c_void_p()
    be._batch, be._batch_cap, be._kv_stores, be._in_flight = None, 0, [], []
    be.config = types.SimpleNamespace(vocab_rows=lib.V)
    be.max_context = max_context
    return be


def _expect(lib, prompt, n, shift=0):
    """The tokens the fake gives a sequence after `prompt`, n of them: the argmax of its logits, shifted when the
    device draws them with a seed."""
    hist, out = list(prompt), []
    for _ in range(n):
        t = (sum(hist) + len(hist) + shift) % lib.V
        out.append(t)
        hist.append(t)
    return out


def _submit(sched, prompt, n, got, key):
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import _Seq
    sched.add(_Seq(np.array(prompt, dtype=np.int32), SamplingParams(0.0, 0, 1.0, None), n, set(), None,
                   lambda t, lp, c: got.setdefault(key, []).append(t)))


def _run(sched, steps=200):
    for _ in range(steps):
        if not sched.has_work:
            return
        sched.step()
    raise AssertionError("the scheduler did not finish")


def test_batched_api_runs_pooled_sessions_with_decode_batches():
    from nanoqwen_rt.scheduler import Scheduler
    lib = _FakePoolLib()
    be = _fake_backend(lib)
    sched = Scheduler(be, max_batch=2, kv_pages=32, lock=threading.Lock())
    assert sched.kv.shares_pages is True                    # the pool's page ids are the device's
    got: dict = {}
    prompts = [[3, 4, 5], [7] * 20, [1, 2]]
    for i, p in enumerate(prompts):
        _submit(sched, p, 30, got, i)
    _run(sched)
    assert [got[i] for i in range(3)] == [_expect(lib, p, 30) for p in prompts]
    assert sched.pool.used_pages == 0 and not sched.kv._sessions
    # 2 sequences ran at once: 2 sessions made, the third sequence reused one; none freed before close
    assert lib.created == 2 and lib.freed == []
    batched = [int(c.split()[1]) for c in lib.calls if isinstance(c, str) and c.startswith("decode_batch")]
    assert lib.calls.count("prefill") == 3 and batched and max(batched) == 2
    # page tables go up only when they grew (or at the start), never twice for one length: 3 + 29 positions
    # written by the first sequence = 2 pages, so its session saw (1, 0), (2, 16) and, at its end, (0, 0)
    first = [(n, pos) for sid, n, pos in lib.set_pages if sid == 1]
    assert first[:3] == [(1, 0), (2, 16), (0, 0)]
    for kv in be._kv_stores:                                # what CudaBackend.close does before the model
        kv.release()
    assert sorted(lib.freed) == [1, 2] and lib.pool_freed


def test_plain_requests_draw_on_the_device_and_no_logits_come_back():
    """Plain requests (no LogitsPipeline) on pooled sessions: their settings set once per sequence, the prompt by
    nq_prefill, the first token by one device draw (nq_sample_steered, nothing steered), the decode tokens of a
    step in one batched call without logits rows (a lone decoding sequence in a batch of one, never nq_decode)."""
    from nanoqwen_rt.scheduler import Scheduler
    lib = _FakePoolLib()
    sched = Scheduler(_fake_backend(lib), max_batch=2, kv_pages=16, lock=threading.Lock())
    got: dict = {}
    prompts = [[3, 4, 5], [7] * 20, [1, 2]]
    for i, p in enumerate(prompts):
        _submit(sched, p, 6, got, i)
    _run(sched)
    assert [got[i] for i in range(3)] == [_expect(lib, p, 6) for p in prompts]
    assert lib.calls.count("get_logits") == 0 and lib.calls.count("decode") == 0
    assert sum(isinstance(c, str) and c.startswith("set_sampling") for c in lib.calls) == 3
    assert lib.calls.count("prefill") == 3 and lib.calls.count("sample") == 3
    batched = [c for c in lib.calls if isinstance(c, str) and c.startswith("decode_batch")]
    assert set(batched) <= {"decode_batch 2 logits 0", "decode_batch 1 logits 0"}
    assert sum(int(c.split()[1]) for c in batched) == 3 * 5 and "decode_batch 2 logits 0" in batched
    assert sched.pool.used_pages == 0 and not sched.kv._sessions and not sched.kv._drawn


def test_mixed_batch_copies_only_the_host_sampled_rows():
    """Requests with a LogitsPipeline (here: logprobs) sample on the host from their logits, plain ones on the
    device with their own settings: in one step the host rows go first and only their logits rows come back."""
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakePoolLib()
    sched = Scheduler(_fake_backend(lib), max_batch=4, kv_pages=32, lock=threading.Lock())
    prompts = [[3, 4, 5], [9, 1], [7] * 5, [2, 2, 2, 2]]
    # 0: plain greedy, 1: logprobs (host), 2: seeded temperature 1 (device, the fake shifts by the seed),
    # 3: logprobs (host)
    kinds = [(SamplingParams(0.0), None), (SamplingParams(0.0), 0), (SamplingParams(1.0, seed=7), None),
             (SamplingParams(0.0), 2)]
    got = {i: [] for i in range(4)}
    lps = {i: [] for i in range(4)}
    for i, (p, (params, top)) in enumerate(zip(prompts, kinds)):
        pipe = LogitsPipeline(LogitsSettings(lib.V, top_logprobs=top), None) if top is not None else None

        def on_token(t, lp, c, i=i):
            got[i].append(t)
            lps[i].append(lp)
        sched.add(_Seq(np.array(p, dtype=np.int32), params, 5, set(), pipe, on_token))
    _run(sched)
    assert got[0] == _expect(lib, prompts[0], 5)
    assert got[1] == _expect(lib, prompts[1], 5) and all(lp is not None for lp in lps[1])
    assert got[2] == _expect(lib, prompts[2], 5, shift=7) and lps[2] == [None] * 5
    assert got[3] == _expect(lib, prompts[3], 5) and all(len(lp.top) == 2 for lp in lps[3])
    assert sum(isinstance(c, str) and c.startswith("set_sampling") for c in lib.calls) == 2   # the plain ones
    assert lib.calls.count("sample") == 2 and lib.calls.count("get_logits") == 2   # first tokens
    batched = [c for c in lib.calls if isinstance(c, str) and c.startswith("decode_batch")]
    assert batched and set(batched) == {"decode_batch 4 logits 2"}
    # every session kept for reuse, none device-sampled any more
    assert lib.created == 4 and lib.freed == [] and len(sched.kv._idle) == 4
    assert not sched.kv._sessions and not sched.kv._drawn


def test_a_reused_session_forgets_that_the_device_sampled_for_it():
    """A seeded plain request ends; the next sequence, with logprobs, reuses its pooled session: it is host-sampled
    (its logits row comes back, the seed's shift does not show), and a plain one after it gets its own settings."""
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakePoolLib()
    sched = Scheduler(_fake_backend(lib), max_batch=1, kv_pages=8, lock=threading.Lock())
    got: dict = {}

    def add(prompt, params, pipe, key):
        sched.add(_Seq(np.array(prompt, dtype=np.int32), params, 4, set(), pipe,
                       lambda t, lp, c: got.setdefault(key, []).append(t)))
    add([1, 2, 3], SamplingParams(1.0, seed=5), None, "a")
    _run(sched)
    n_calls = len(lib.calls)
    add([6, 6], SamplingParams(0.0), LogitsPipeline(LogitsSettings(lib.V, top_logprobs=1), None), "b")
    _run(sched)
    b_calls = [c for c in lib.calls[n_calls:] if isinstance(c, str)]
    add([4], SamplingParams(1.0, seed=3), None, "c")
    _run(sched)
    assert got["a"] == _expect(lib, [1, 2, 3], 4, shift=5)
    assert got["b"] == _expect(lib, [6, 6], 4)
    assert got["c"] == _expect(lib, [4], 4, shift=3)
    assert lib.created == 1                                  # one session served all three
    assert [c for c in b_calls if c.startswith("decode_batch")] == ["decode_batch 1 logits 1"] * 3
    assert "sample" not in b_calls and not any(c.startswith("set_sampling") for c in b_calls)
    assert not sched.kv._drawn


def test_a_lone_host_sampled_sequence_takes_the_batched_step_with_its_logits():
    """One decoding sequence with a LogitsPipeline: a batch of one (the step's graph for one row) with its logits
    row; the session's own nq_decode is not used."""
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakePoolLib()
    sched = Scheduler(_fake_backend(lib), max_batch=2, kv_pages=16, lock=threading.Lock())
    got = []
    sched.add(_Seq(np.array([4, 4, 1], dtype=np.int32), SamplingParams(0.0), 4, set(),
                   LogitsPipeline(LogitsSettings(lib.V, top_logprobs=1), None), lambda t, lp, c: got.append(t)))
    _run(sched)
    assert got == _expect(lib, [4, 4, 1], 4)
    assert [c for c in lib.calls if isinstance(c, str) and c.startswith("decode")] == ["decode_batch 1 logits 1"] * 3


def test_a_sequence_whose_sampling_cannot_be_set_ends_and_frees_its_pages():
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakePoolLib()

    def refuse(sess, sampling):
        lib._fail(b"sampling upload: out of memory")
        return abi.NQ_E_OUT_OF_MEMORY
    lib.nq_session_set_sampling = refuse
    sched = Scheduler(_fake_backend(lib), max_batch=2, kv_pages=16, lock=threading.Lock())
    seq = _Seq(np.array([1, 2, 3], dtype=np.int32), SamplingParams(0.0), 4, set(), None, lambda *a: None)
    sched.add(seq)
    sched.step()
    assert seq.done and isinstance(seq.error, MemoryError) and "out of memory" in str(seq.error)
    assert not sched.kv._sessions and not sched.kv._drawn and sched.pool.used_pages == 0
    assert lib.freed == [] and len(sched.kv._idle) == 1      # the session dropped its pages and waits for reuse


def test_prefix_hit_reuses_the_cached_pages_on_the_device():
    from nanoqwen_rt.scheduler import Scheduler
    lib = _FakePoolLib()
    sched = Scheduler(_fake_backend(lib), max_batch=4, kv_pages=64, lock=threading.Lock())
    prefix = [(i * 7) % 50 for i in range(40)]              # 2 full pages + 8 tokens
    got: dict = {}
    _submit(sched, prefix + [1, 2, 3], 5, got, "a")
    _run(sched)
    n_prefill_rows = sum(1 for c in lib.calls if c == "prefill")
    _submit(sched, prefix + [9, 9], 5, got, "b")
    _submit(sched, prefix + [4], 5, got, "c")              # both hit; they decode together in one batch
    _run(sched)
    assert got["a"] == _expect(lib, prefix + [1, 2, 3], 5)
    assert got["b"] == _expect(lib, prefix + [9, 9], 5)     # tokens read back through the shared pages
    assert got["c"] == _expect(lib, prefix + [4], 5)
    assert sched.pool.prefix_hit_tokens == 2 * 32
    # b and c started at position 32 (the cached pages), on tables that list the cached pages first
    starts = [(n, pos) for _, n, pos in lib.set_pages if pos == 32]
    assert starts == [(3, 32), (3, 32)]
    assert "decode_batch 2 logits 0" in lib.calls and lib.calls.count("prefill") == n_prefill_rows + 2
    sched.pool.check([])


def test_pooled_pages_are_poisoned_when_handed_out():
    """Every page the pool hands a sequence is poisoned on the device first (a row read before it is written gives
    NaN logits), and an ended sequence's session keeps no pages."""
    from nanoqwen_rt.scheduler import Scheduler
    lib = _FakePoolLib()
    sched = Scheduler(_fake_backend(lib), max_batch=1, kv_pages=8, lock=threading.Lock())
    got: dict = {}
    _submit(sched, [5] * 17, 3, got, 0)
    _run(sched)
    assert got[0] == _expect(lib, [5] * 17, 3)
    poisoned = [c[1] for c in lib.calls if isinstance(c, tuple)]
    assert sorted(p for ps in poisoned for p in ps) == [0, 1]   # 19 positions: 2 pages, each poisoned once
    assert lib.sessions[1]["pages"] == []


def test_pages_taken_in_one_step_go_to_one_nq_kv_pool_poison_before_the_step():
    """8 pooled sequences cross a page boundary in the same (pipelined) decode step: their 8 new pages reach the
    library in ONE nq_kv_pool_poison call, made before the nq_decode_batch_launch that writes them (the fake draws
    from a poisoned row fail the test), not one call per sequence."""
    from nanoqwen_rt.scheduler import Scheduler
    lib = _FakePoolLib()
    sched = Scheduler(_fake_backend(lib), max_batch=8, kv_pages=32, lock=threading.Lock())
    got: dict = {}
    prompts = [[k + 1] * 15 for k in range(8)]            # positions 15 in page 0, 16 in a new page
    for k, p in enumerate(prompts):
        _submit(sched, p, 5, got, k)
    _run(sched)
    for k, p in enumerate(prompts):
        assert got[k] == _expect(lib, p, 5)
    poisons = [(i, c[1]) for i, c in enumerate(lib.calls) if isinstance(c, tuple)]
    assert sorted(len(ps) for _, ps in poisons) == [1] * 8 + [8]      # each prompt's page, then the 8 in one call
    i = next(i for i, ps in poisons if len(ps) == 8)
    assert lib.calls[i + 1] == "decode_batch 8 logits 0"              # the step that writes them comes next
    assert sorted(p for _, ps in poisons for p in ps) == list(range(16))   # every page handed out, once


def test_set_pages_refusal_is_a_named_error():
    lib = _FakePoolLib()
    kv = cuda_backend.SessionKv(_fake_backend(lib), 4)
    seq = types.SimpleNamespace(seq_id=0, pages=[0, 0])     # a page listed twice
    kv.open(seq, 32)
    with pytest.raises(ValueError, match="set a sequence's KV pages: set_pages: bad arguments"):
        kv.forward(seq, 0, np.array([1, 2], dtype=np.int32))


def test_a_pool_beyond_the_library_limit_is_a_backend_error():
    be = _fake_backend(_FakePoolLib())
    with pytest.raises(BackendError, match=r"a KV pool of 16777217 pages: the CUDA backend makes 1 to 16777216"):
        be.sequence_kv(abi.NQ_MAX_KV_POOL_PAGES + 1)
    assert be._kv_stores == []


def test_default_kv_pages_from_free_device_memory():
    page = 2 * 28 * 4 * 16 * 128 * 2                       # 7B shapes, f16 rows: 0.875 MiB
    per_ctx = 32768 // 16
    # plenty free: max_batch full contexts
    assert cuda_backend.kv_pool_pages(32768, 16, page, 130 * 2**30) == 16 * per_ctx
    # less: KV_FREE_MEMORY_FRACTION of what is free
    free = 40 * 2**30
    n = cuda_backend.kv_pool_pages(32768, 64, page, free)
    assert n == int(free * cuda_backend.KV_FREE_MEMORY_FRACTION) // page and per_ctx <= n < 64 * per_ctx
    # not even one full context: a one-line error naming the way out
    with pytest.raises(cuda_backend.KvPoolDoesNotFit, match=r"one full context of 32768 tokens needs 2048 KV pages "
                                                            r"\(1\.75 GiB\); the GPU has 1\.00 GiB free"):
        cuda_backend.kv_pool_pages(32768, 16, page, 2**30)
    assert "\n" not in str(pytest.raises(cuda_backend.KvPoolDoesNotFit, cuda_backend.kv_pool_pages, 32768, 1,
                                         page, 2**30).value)


def test_engine_kv_pool_that_does_not_fit_is_one_line(monkeypatch):
    """Engine._batch turns the backend's refusal into DeviceUnavailable, which serve prints as one line."""
    from nanoqwen_rt.engine import DeviceUnavailable
    from nanoqwen_rt.backends.base import BackendError

    class Be:
        max_context = 32768

        def default_kv_pages(self, max_batch):
            raise cuda_backend.KvPoolDoesNotFit("one full context of 32768 tokens needs 2048 KV pages")
    eng = object.__new__(__import__("nanoqwen_rt.engine", fromlist=["Engine"]).Engine)
    eng._batch_lock, eng._scheduler, eng._kv_pages, eng._max_batch = threading.Lock(), None, None, 16
    eng._check_open = lambda: Be()
    with pytest.raises(DeviceUnavailable, match="needs 2048 KV pages"):
        eng._batch()
    assert issubclass(cuda_backend.KvPoolDoesNotFit, BackendError)


def test_header_constants_are_the_bindings():
    """nanoqwen.h's limits that the binding copies (no library needed: read from the header's text; the ABI version
    and the signatures: test_binding_matches_the_c_header)."""
    import re
    from pathlib import Path
    from nanoqwen_rt.kv_pool import KV_PAGE_TOKENS
    header = (Path(__file__).resolve().parents[1] / "csrc" / "include" / "nanoqwen.h").read_text()

    def define(name):
        m = re.search(rf"^#define {name} (\(1 << \d+\)|\d+)", header, re.M)
        assert m, name
        v = m.group(1)
        return 1 << int(v[6:-1]) if v.startswith("(1 <<") else int(v)
    assert define("NQ_MAX_BATCH") == abi.NQ_MAX_BATCH
    assert define("NQ_MAX_KV_POOL_PAGES") == abi.NQ_MAX_KV_POOL_PAGES
    assert define("NQ_KV_PAGE_TOKENS") == KV_PAGE_TOKENS


def test_cpu_default_kv_pages_is_max_batch_contexts_within_the_f32_budget():
    """Backend.default_kv_pages (the CPU backend's): max_batch full contexts of float32 rows within 1 GiB, at least
    one full context: the rule the Engine applied before the CUDA backend sized its own pool."""
    from nanoqwen_rt.backends.base import Backend
    small = types.SimpleNamespace(config=types.SimpleNamespace(n_layers=2, n_kv_heads=1, head_dim=64),
                                  max_context=1024)
    assert Backend.default_kv_pages(small, 16) == 16 * 64           # 16 KiB pages: 1,024 of them are 16 MiB
    big = types.SimpleNamespace(config=types.SimpleNamespace(n_layers=28, n_kv_heads=4, head_dim=128),
                                max_context=32768)
    page = 2 * 28 * 4 * 16 * 128 * 4
    assert Backend.default_kv_pages(big, 16) == max(2048, (1 << 30) // page) == 2048   # one context: 3.5 GiB
    assert Backend.default_kv_pages(types.SimpleNamespace(config=big.config, max_context=256), 64) == (1 << 30) // page


def test_binding_matches_the_c_header():
    """abi.py's ABI version and every entry point's argument count are the header's (csrc/include/nanoqwen.h), so a
    changed C signature cannot go unnoticed on a machine without the library."""
    import re
    from pathlib import Path
    header = (Path(__file__).resolve().parent.parent / "csrc" / "include" / "nanoqwen.h").read_text()
    assert int(re.search(r"#define NQ_ABI_VERSION (\d+)", header).group(1)) == abi.NQ_ABI_VERSION
    decls = {m.group(1): m.group(2) for m in re.finditer(r"NQ_API [\w\s\*]+?\b(nq_\w+)\(([^)]*)\);", header)}
    for name, (_, args) in {**abi.SIGNATURES, **abi.OPTIONAL_SIGNATURES}.items():
        assert name in decls, f"{name} is not declared in nanoqwen.h"
        params = decls[name].strip()
        n = 0 if params in ("", "void") else params.count(",") + 1
        assert n == len(args), f"{name}: {n} parameters in nanoqwen.h, {len(args)} in abi.py"
