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


class _FakeSessionsLib(FakeLib):
    """Sessions whose "logits" are a function of the token history (argmax = (sum of ids + length) % vocab), to
    test the batched API's plumbing on the CUDA backend: one session per sequence, prompts through nq_prefill, the
    decode tokens of a step through one nq_decode_batch, frees. The fake's "device sampler" draws the argmax
    shifted by the session's seed when its temperature is > 0 (so a token shows whose settings drew it)."""

    V = 50

    def __init__(self):
        super().__init__()
        self.sessions: dict[int, list] = {}
        self.shift: dict[int, int] = {}
        self.freed: list[int] = []
        self.calls: list[str] = []
        self._next = 1

    def _draw(self, sid):
        hist = self.sessions[sid]
        return ((sum(hist) + len(hist)) + self.shift[sid]) % self.V

    def nq_session_create(self, model, max_ctx, sampling, out):
        sid, self._next = self._next, self._next + 1
        self.sessions[sid] = []
        self.shift[sid] = 0
        out._obj.value = sid
        return abi.NQ_OK

    def nq_session_set_sampling(self, sess, sampling):
        sp = sampling._obj
        self.calls.append(f"set_sampling {sess.value}")
        self.shift[sess.value] = int(sp.seed) if sp.temperature > 0 else 0
        return abi.NQ_OK

    def nq_prefill(self, sess, ids, n):
        self.calls.append("prefill")
        self.sessions[sess.value] += np.ctypeslib.as_array(ids, shape=(n,)).tolist()
        return abi.NQ_OK

    def nq_decode(self, sess, tok):
        self.calls.append("decode")
        self.sessions[sess.value].append(int(tok))
        return abi.NQ_OK

    def nq_get_logits(self, sess, out, n):
        self.calls.append("get_logits")
        hist = self.sessions[sess.value]
        a = np.ctypeslib.as_array(out, shape=(n,))
        a[:] = 0.0
        a[(sum(hist) + len(hist)) % self.V] = 1.0
        return abi.NQ_OK

    def nq_sample_steered(self, sess, bias_ids, bias_vals, n_bias, mask, n_mask, presence, frequency, top_n, tok,
                          lp, top_ids, top_lps, n_top):
        assert (bias_ids, bias_vals, n_bias, mask, n_mask, presence, frequency, top_n) == \
            (None, None, 0, None, 0, 0.0, 0.0, -1)                 # nothing steered: the sampler alone
        self.calls.append("sample")
        tok._obj.value = self._draw(sess.value)
        return abi.NQ_OK

    def nq_session_free(self, sess):
        self.freed.append(sess.value)

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
            self.sessions[sid].append(int(toks[i]))
            nxt[i] = self._draw(sid)
            if i < n_logits:
                hist = self.sessions[sid]
                lg[i] = 0.0
                lg[i, (sum(hist) + len(hist)) % self.V] = 1.0
        return abi.NQ_OK

    def nq_batch_free(self, batch):
        self.calls.append("batch_free")


def _fake_backend(lib):
    be = object.__new__(cuda_backend.CudaBackend)          # no device: only what the batched API touches
    be._lib, be._model, be._sess = lib, ctypes.c_void_p(1), ctypes.c_void_p()
    be._batch, be._batch_cap = None, 0
    be.config = types.SimpleNamespace(vocab_rows=lib.V)
    be.max_context = 64
    return be


def _expect(lib, prompt, n, shift=0):
    """The tokens the fake gives a sequence: the argmax of its logits, shifted when the device draws them."""
    hist, out = list(prompt), []
    for _ in range(n):
        t = (sum(hist) + len(hist) + shift) % lib.V
        out.append(t)
        hist.append(t)
    return out


def test_batched_api_runs_one_library_session_per_sequence():
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakeSessionsLib()
    be = _fake_backend(lib)
    sched = Scheduler(be, max_batch=2, kv_pages=16, lock=threading.Lock())
    assert sched.kv.shares_pages is False                   # the library's pages are its own: no prefix reuse
    got = {0: [], 1: [], 2: []}
    prompts = [[3, 4, 5], [7] * 20, [1, 2]]
    for i, p in enumerate(prompts):
        sched.add(_Seq(np.array(p, dtype=np.int32), SamplingParams(0.0, 0, 1.0, None), 6, set(),
                       None, lambda t, lp, c, i=i: got[i].append(t)))
    for _ in range(40):
        sched.step()
    assert [got[i] for i in range(3)] == [_expect(lib, p, 6) for p in prompts]
    assert sorted(lib.freed) == [1, 2, 3] and sched.pool.used_pages == 0 and not sched.kv._sessions
    # the library's pages are not the pool's: no full page was offered to the prefix cache, all came back free
    assert sched.pool.cached_pages == 0 and sched.pool.free_pages == sched.pool.n_pages
    # plain requests: sampled on the device (settings set once per sequence), so no logits ever come back; the
    # prompts one at a time, the first token by one device draw (nq_sample_steered, nothing steered), the decode
    # tokens of a step in one batched call (2 sequences run at once), a lone decoding sequence in a batch of one
    assert lib.calls.count("get_logits") == 0 and lib.calls.count("decode") == 0
    assert sum(c.startswith("set_sampling") for c in lib.calls) == 3
    assert lib.calls.count("prefill") == 3 and lib.calls.count("sample") == 3
    batched = [c for c in lib.calls if c.startswith("decode_batch")]
    assert set(batched) <= {"decode_batch 2 logits 0", "decode_batch 1 logits 0"}
    assert sum(int(c.split()[1]) for c in batched) == 3 * 5 and "decode_batch 2 logits 0" in batched


def test_mixed_batch_copies_only_the_host_sampled_rows():
    """Requests with a LogitsPipeline (here: logprobs) sample on the host from their logits, plain ones on the
    device with their own settings: in one step the host rows go first and only their logits rows come back."""
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakeSessionsLib()
    be = _fake_backend(lib)
    sched = Scheduler(be, max_batch=4, kv_pages=32, lock=threading.Lock())
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
    for _ in range(20):
        sched.step()
    assert got[0] == _expect(lib, prompts[0], 5)
    assert got[1] == _expect(lib, prompts[1], 5) and all(lp is not None for lp in lps[1])
    assert got[2] == _expect(lib, prompts[2], 5, shift=7) and lps[2] == [None] * 5
    assert got[3] == _expect(lib, prompts[3], 5) and all(len(lp.top) == 2 for lp in lps[3])
    assert sum(c.startswith("set_sampling") for c in lib.calls) == 2      # the two plain sequences
    assert lib.calls.count("sample") == 2 and lib.calls.count("get_logits") == 2   # first tokens
    batched = [c for c in lib.calls if c.startswith("decode_batch")]
    assert batched and set(batched) == {"decode_batch 4 logits 2"}
    assert sorted(lib.freed) == [1, 2, 3, 4] and not sched.kv._sessions and not sched.kv._drawn


def test_a_lone_host_sampled_sequence_takes_the_batched_step_with_its_logits():
    """One decoding sequence with a LogitsPipeline: a batch of one (the step's graph for one row) with its logits row;
    the session's own nq_decode is not used."""
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakeSessionsLib()
    sched = Scheduler(_fake_backend(lib), max_batch=2, kv_pages=16, lock=threading.Lock())
    got = []
    sched.add(_Seq(np.array([4, 4, 1], dtype=np.int32), SamplingParams(0.0), 4, set(),
                   LogitsPipeline(LogitsSettings(lib.V, top_logprobs=1), None), lambda t, lp, c: got.append(t)))
    for _ in range(6):
        sched.step()
    assert got == _expect(lib, [4, 4, 1], 4)
    assert [c for c in lib.calls if c.startswith("decode")] == ["decode_batch 1 logits 1"] * 3


def test_a_sequence_whose_sampling_cannot_be_set_ends_and_frees_its_session():
    from nanoqwen_rt.sampling import SamplingParams
    from nanoqwen_rt.scheduler import Scheduler, _Seq
    lib = _FakeSessionsLib()

    def refuse(sess, sampling):
        lib._fail(b"sampling upload: out of memory")
        return abi.NQ_E_OUT_OF_MEMORY
    lib.nq_session_set_sampling = refuse
    be = _fake_backend(lib)
    sched = Scheduler(be, max_batch=2, kv_pages=16, lock=threading.Lock())
    seq = _Seq(np.array([1, 2, 3], dtype=np.int32), SamplingParams(0.0), 4, set(), None, lambda *a: None)
    sched.add(seq)
    sched.step()
    assert seq.done and isinstance(seq.error, MemoryError) and "out of memory" in str(seq.error)
    assert lib.freed == [1] and not sched.kv._sessions and sched.pool.used_pages == 0


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
