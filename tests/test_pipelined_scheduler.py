"""The scheduler's pipelined decode (nanoqwen_rt/scheduler.py, "Pipelining") against its one-call decode, on a CPU
store that behaves like the CUDA one: it draws every token itself (a deterministic function of the sequence's
tokens so far, so a token depends on every earlier one) and keeps each sequence's rows by position, and its
pipelined twin starts a step in launch_decode and hands its draws over in wait_decode, taking chained tokens from
the previous step's draws as nq_decode_batch_launch does. The twin also checks the rules the library relies on:
at most two steps in flight, rows written at consecutive positions, chain indices of the previous step, and no
sequence closed (its session reused) while a row of it is in flight."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from nanoqwen_rt.backends.base import SequenceKv
from nanoqwen_rt.sampling import SamplingParams
from nanoqwen_rt.scheduler import Scheduler, _Seq

V = 61          # vocabulary of the fake model
STOP = 5        # a stop id some requests use (the fake model draws it now and then)


def draw(history: list[int]) -> int:
    """The fake model: the next token of a sequence from all its tokens (a rolling hash, so any wrong or missing
    token changes every later one)."""
    h = 17
    for t in history:
        h = (h * 1_000_003 + t + 1) % 2_147_483_647
    return h % V


class FakeKv(SequenceKv):
    """Rows live in pool pages (page -> 16 slots, None when poisoned), as on the device: a prefix-cache hit reads
    the rows another sequence wrote. A launched step's writes land at its wait (a device step's rows are complete
    only then), so a page published or read too early shows as None in a history."""
    shares_pages = True
    samples_tokens = True

    def __init__(self, pipelined: bool, n_pages: int):
        self.pipelines = pipelined
        self.page_rows = [[None] * 16 for _ in range(n_pages)]
        self.written: dict[int, int] = {}          # seq_id -> positions written or being written
        self.flight: list[tuple[list, np.ndarray, list]] = []   # launched steps: (seq ids, draws, writes)
        self.last_draws: np.ndarray | None = None
        self.max_flight = 0

    def _history(self, seq, extra: dict) -> list:
        out = []
        for q in range(self.written[seq.seq_id]):
            page, slot = seq.pages[q // 16], q % 16
            out.append(extra.get((page, slot), self.page_rows[page][slot]))
        assert None not in out, f"sequence {seq.seq_id} reads an unwritten row: {out}"
        return out

    def _reserve(self, seq, p0: int, n: int) -> None:
        assert p0 == self.written[seq.seq_id], f"sequence {seq.seq_id}: row at {p0}, {self.written[seq.seq_id]} written"
        self.written[seq.seq_id] = p0 + n

    def _write(self, seq, p0: int, ids) -> None:
        self._reserve(seq, p0, len(ids))
        for k, t in enumerate(ids):
            self.page_rows[seq.pages[(p0 + k) // 16]][(p0 + k) % 16] = int(t)

    def poison(self, pages) -> None:
        for p in pages:
            self.page_rows[p] = [None] * 16

    def open(self, seq, capacity: int) -> None:
        assert seq.seq_id not in self.written
        self.written[seq.seq_id] = len(seq.tokens)  # a prefix-cache hit: those rows are in its first pages

    def close(self, seq) -> None:
        assert all(seq.seq_id not in ids for ids, _, _ in self.flight), f"sequence {seq.seq_id} closed in flight"
        del self.written[seq.seq_id]

    def set_sampling(self, seq, params) -> None:
        pass

    def forward(self, seq, p0, ids):
        raise AssertionError("every request here is drawn by the store")

    def extend(self, seq, p0, ids) -> None:
        self._write(seq, p0, ids)

    def forward_token(self, seq, p0, ids) -> int:
        self._write(seq, p0, ids)
        return draw(self._history(seq, {}))

    def forward_decode(self, seqs, p0s, tokens):
        assert not self.flight, "a one-call step with a step in flight"
        out = []
        for s, p0, t in zip(seqs, p0s, tokens):
            self._write(s, int(p0), [int(t)])
            out.append(draw(self._history(s, {})))
        self.last_draws = np.array(out, dtype=np.int32)
        return self.last_draws.copy(), np.empty((0, V), dtype=np.float32)

    def launch_decode(self, seqs, p0s, tokens, chain) -> None:
        assert self.pipelines and len(self.flight) < 2
        # rows of the step still in flight are written by the device before this step runs: visible to this one
        pending = {k: v for _, _, writes in self.flight for k, v in writes}
        out, writes = [], []
        for s, p0, t, c in zip(seqs, p0s, tokens, chain):
            if c >= 0:
                assert self.last_draws is not None and c < self.last_draws.shape[0]
                t = self.last_draws[c]
            self._reserve(s, int(p0), 1)
            key = (s.pages[int(p0) // 16], int(p0) % 16)
            pending[key] = int(t)
            writes.append((key, int(t)))
            out.append(draw(self._history(s, pending)))
        self.last_draws = np.array(out, dtype=np.int32)
        self.flight.append(([s.seq_id for s in seqs], self.last_draws.copy(), writes))
        self.max_flight = max(self.max_flight, len(self.flight))

    def wait_decode(self, n: int) -> np.ndarray:
        ids, draws, writes = self.flight.pop(0)
        assert len(ids) == n
        for (page, slot), t in writes:
            self.page_rows[page][slot] = t
        return draws


class FakeBackend:
    def __init__(self, pipelined: bool, max_context: int, n_pages: int):
        self.max_context = max_context
        self.kv = FakeKv(pipelined, n_pages)

    def sequence_kv(self, n_pages):
        return self.kv


def run(pipelined: bool, requests, max_batch: int, cancel_after: dict, rounds_between: int = 3):
    """requests: (prompt, max_new, stops); submitted `rounds_between` steps apart. cancel_after: request -> cancel
    once it has that many tokens. Returns (tokens per request, error per request, the store, the scheduler)."""
    be = FakeBackend(pipelined, max_context=96, n_pages=64)
    sched = Scheduler(be, max_batch=max_batch, kv_pages=64, lock=threading.Lock())
    got = [[] for _ in requests]
    seqs = []
    pending = list(enumerate(requests))
    step = 0
    while pending or sched.has_work:
        if pending and step % rounds_between == 0:
            i, (prompt, max_new, stops) = pending.pop(0)
            seq = _Seq(np.asarray(prompt, dtype=np.int32), SamplingParams(0.0), max_new, set(stops), None,
                       lambda t, lp, c, i=i: got[i].append(int(t)))
            seqs.append(seq)
            sched.add(seq)
        sched.step()
        for i, s in enumerate(seqs):
            if i in cancel_after and len(got[i]) >= cancel_after[i] and not s.cancelled:
                sched.cancel(s)
        step += 1
        assert step < 5000
    sched.pool.check(live=[])
    assert sched.pool.reserved_pages == 0
    return got, [s.error for s in seqs], be.kv, sched


def reference(prompt, max_new, stops, max_context=96):
    """What one sequence yields alone: draw after draw from its own tokens."""
    h, out = list(prompt), []
    while len(out) < max_new:
        t = draw(h)
        out.append(t)
        if t in stops or len(h) + 1 >= max_context:
            break
        h.append(t)
    return out


REQUESTS = [([1, 2, 3], 40, ()), ([4] * 20, 1, ()), ([7, 8], 2, ()), ([9] * 40, 30, (STOP,)), ([3, 1], 25, (STOP,)),
            ([2] * 33, 16, ()), ([6, 6, 6], 70, ()), ([1], 3, (STOP,)), ([5, 4, 3, 2, 1] * 4, 50, (STOP, 11))]


@pytest.mark.parametrize("max_batch", [1, 3, 16])
def test_pipelined_decode_yields_what_each_sequence_yields_alone(max_batch):
    got, errors, kv, sched = run(True, REQUESTS, max_batch, cancel_after={})
    assert errors == [None] * len(REQUESTS)
    for i, (prompt, max_new, stops) in enumerate(REQUESTS):
        assert got[i] == reference(prompt, max_new, stops), f"request {i}"
    # the next step is launched before the previous one is waited: two in flight at that moment, never more
    # (FakeKv.launch_decode asserts it), none at the end
    assert kv.max_flight == 2 and not kv.flight
    plain, _, kv1, sched1 = run(False, REQUESTS, max_batch, cancel_after={})
    assert plain == got and kv1.max_flight == 0
    # the prefix cache holds the same pages by content: every token the pipelined path recorded for a row whose
    # token was still on the device (a placeholder at its launch) was filled in before its page was hashed
    assert set(sched.pool._index) == set(sched1.pool._index)


def test_pipelined_decode_with_cancellations_frees_everything():
    """Consumers that go away mid-stream: their sequences leave (after their row in flight), the others are
    untouched, and no page or reservation is left (run() checks the pool)."""
    cancel = {0: 5, 3: 1, 6: 20}
    got, errors, kv, sched = run(True, REQUESTS, 4, cancel_after=cancel)
    for i, (prompt, max_new, stops) in enumerate(REQUESTS):
        ref = reference(prompt, max_new, stops)
        if i in cancel:
            assert got[i] == ref[:len(got[i])] and len(got[i]) >= min(cancel[i], len(ref))
        else:
            assert got[i] == ref, f"request {i}"
    assert not kv.written and not sched.has_work


def test_prefix_cache_pages_hold_real_tokens_only():
    """A page is offered to the prefix cache once every row in it is written: with pipelining the last token of a
    sequence is in flight when its step is launched, and its page must not be published with a placeholder."""
    prompt = list(range(1, 33))                     # two full pages
    reqs = [(prompt, 20, ()), (prompt + [40], 20, ()), (prompt, 20, ())]
    got, errors, kv, sched = run(True, reqs, 2, cancel_after={}, rounds_between=7)
    assert errors == [None] * 3
    for i, (p, m, st) in enumerate(reqs):
        assert got[i] == reference(p, m, st)
    assert sched.pool.prefix_hit_pages >= 2            # the later prompts found the first one's pages (and read
                                                       # them: FakeKv._history asserts every row was written)


def test_steps_without_decodes_take_the_stores_idle_prompt_budget():
    """A step in which no sequence decodes computes up to the store's idle_prefill_tokens prompt tokens (a long
    prompt alone enters in fewer, larger chunks); a step with decodes at most PREFILL_CHUNK_TOKENS, so a running
    stream is never held back by more than one such chunk. The tokens are what each sequence yields alone."""
    from nanoqwen_rt.scheduler import PREFILL_CHUNK_TOKENS
    idle = 4 * PREFILL_CHUNK_TOKENS
    be = FakeBackend(True, max_context=1800, n_pages=240)
    be.kv.idle_prefill_tokens = idle
    chunks: list[tuple[int, int]] = []                   # (seq_id, prompt tokens computed in one call)
    for name in ("extend", "forward_token"):
        inner = getattr(be.kv, name)

        def wrapped(seq, p0, ids, inner=inner):
            chunks.append((seq.seq_id, len(ids)))
            return inner(seq, p0, ids)
        setattr(be.kv, name, wrapped)
    sched = Scheduler(be, max_batch=4, kv_pages=240, lock=threading.Lock())
    rng = np.random.default_rng(3)
    long_a = rng.integers(0, V, idle + 76).tolist()      # alone: one idle-budget chunk, then the rest
    long_b = rng.integers(0, V, 2 * PREFILL_CHUNK_TOKENS + 88).tolist()   # arrives while A decodes
    got = {0: [], 1: []}
    a = _Seq(np.asarray(long_a, dtype=np.int32), SamplingParams(0.0), 40, set(), None,
             lambda t, lp, c: got[0].append(int(t)))
    sched.add(a)
    b = None
    for step in range(400):
        if step == 3:
            b = _Seq(np.asarray(long_b, dtype=np.int32), SamplingParams(0.0), 5, set(), None,
                     lambda t, lp, c: got[1].append(int(t)))
            sched.add(b)
        if step > 3 and not sched.has_work:
            break
        sched.step()
    assert got[0] == reference(long_a, 40, (), max_context=1800)
    assert got[1] == reference(long_b, 5, (), max_context=1800)
    sizes = sorted([n for s, n in chunks if s == sid] for sid in {s for s, _ in chunks})
    assert sizes == sorted([[idle, 76], [PREFILL_CHUNK_TOKENS, PREFILL_CHUNK_TOKENS, 88]]), sizes
    sched.pool.check(live=[])


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_failing_device_step_ends_its_sequences_with_the_error(pipelined):
    """The store's decode step raises once: every sequence in that step ends with that error (_Seq.fail),
    a sequence not in it goes on to its reference tokens, and no page or reservation is left behind."""
    class Boom(RuntimeError):
        pass

    be = FakeBackend(pipelined, max_context=96, n_pages=64)
    name = "launch_decode" if pipelined else "forward_decode"
    inner, calls = getattr(be.kv, name), [0]

    def failing(*args):
        calls[0] += 1
        if calls[0] == 3:
            raise Boom("device step failed")
        return inner(*args)
    setattr(be.kv, name, failing)
    sched = Scheduler(be, max_batch=4, kv_pages=64, lock=threading.Lock())
    got = [[], []]
    a = _Seq(np.asarray([1, 2, 3], dtype=np.int32), SamplingParams(0.0), 20, set(), None,
             lambda t, lp, c: got[0].append(int(t)))

    def drain():   # steps until the scheduler is idle (bounded: a hang fails the assertions below)
        for _ in range(200):
            if not sched.has_work:
                break
            sched.step()
    sched.add(a)
    drain()
    b = _Seq(np.asarray([4, 5], dtype=np.int32), SamplingParams(0.0), 6, set(), None,
             lambda t, lp, c: got[1].append(int(t)))
    sched.add(b)
    drain()
    assert isinstance(a.error, Boom) and a.done and len(got[0]) < 20
    assert b.error is None and got[1] == reference([4, 5], 6, ())
    sched.pool.check(live=[])
    assert sched.pool.reserved_pages == 0


def _watch_pages(sched, kv, log: list, step: list) -> set:
    """Wrap the scheduler's pool and store so that every page hand-out (pool.grow), poison call and write call is
    checked as it happens: a call that writes rows (extend, forward_token, forward_decode, launch_decode) touches no
    page handed out and not poisoned since, and a poison call lists each page once and only pages handed out and
    not poisoned since (nothing is poisoned twice for one hand-out). log gets (step, "poison", pages) and (step,
    name, n_rows) in call order; step[0] is the caller's step counter. Returns the set of pages handed out and not
    poisoned yet."""
    unpoisoned: set[int] = set()
    grow = sched.pool.grow

    def grow_watched(seq, ids):
        new = grow(seq, ids)
        assert not set(new) & unpoisoned
        unpoisoned.update(new)
        return new
    sched.pool.grow = grow_watched
    poison = kv.poison

    def poison_watched(pages):
        pages = [int(p) for p in pages]
        assert len(set(pages)) == len(pages) and set(pages) <= unpoisoned, \
            f"poisoned {pages}: listed twice, or not handed out since its last poisoning ({sorted(unpoisoned)})"
        unpoisoned.difference_update(pages)
        log.append((step[0], "poison", pages))
        poison(pages)
    kv.poison = poison_watched

    def writes(name, inner, one_row_each):
        def watched(*args):
            rows = zip(args[0], args[1], [1] * len(args[0])) if one_row_each else [(args[0], args[1], len(args[2]))]
            rows = list(rows)
            for seq, p0, n in rows:
                touched = {seq.pages[q // 16] for q in range(int(p0), int(p0) + n)}
                assert not touched & unpoisoned, f"{name} writes pages {sorted(touched & unpoisoned)} not poisoned"
            log.append((step[0], name, len(rows)))
            return inner(*args)
        setattr(kv, name, watched)
    for name in ("extend", "forward_token"):
        writes(name, getattr(kv, name), False)
    for name in ("forward_decode", "launch_decode"):
        writes(name, getattr(kv, name), True)
    return unpoisoned


@pytest.mark.parametrize("fails", [False, True])
@pytest.mark.parametrize("pipelined", [True, False])
def test_a_step_poisons_all_its_new_pages_in_one_call_before_writing_them(pipelined, fails):
    """12 sequences that decode in lockstep cross a page boundary in the same step: that step poisons the 12 new
    pages in ONE SequenceKv.poison call, before the device call that writes them (nq_kv_pool_poison once, not 12
    host-blocking calls). Every page handed out during the run is poisoned exactly once per hand-out before any
    call writes it (_watch_pages checks each call). fails: the device call of the crossing step raises; its
    sequences end with the error (their pages were poisoned once, and are not poisoned again until they are
    handed out again: the two requests after them get them, poisoned once more, and yield their reference tokens)."""
    class Boom(RuntimeError):
        pass

    n_seq, prompt_len, max_new = 12, 14, 10            # positions 14, 15 decode in page 0; 16 needs page 1
    be = FakeBackend(pipelined, max_context=96, n_pages=40)
    sched = Scheduler(be, max_batch=16, kv_pages=40, lock=threading.Lock())
    kv = be.kv
    name = "launch_decode" if pipelined else "forward_decode"
    if fails:
        inner, failed = getattr(kv, name), []

        def failing(seqs, p0s, *rest):
            if not failed and any(int(p0) == 16 for p0 in p0s):
                failed.append(1)
                raise Boom("device step failed")
            return inner(seqs, p0s, *rest)
        setattr(kv, name, failing)
    log, step = [], [0]
    unpoisoned = _watch_pages(sched, kv, log, step)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, V, prompt_len).tolist() for _ in range(n_seq)]
    got = [[] for _ in range(n_seq + 2)]
    seqs = []

    def submit(i, prompt):
        seq = _Seq(np.asarray(prompt, dtype=np.int32), SamplingParams(0.0), max_new, set(), None,
                   lambda t, lp, c, i=i: got[i].append(int(t)))
        seqs.append(seq)
        sched.add(seq)

    def drain():
        for _ in range(100):
            if not sched.has_work:
                return
            step[0] += 1
            sched.step()
        raise AssertionError("the scheduler did not finish")
    for i, p in enumerate(prompts):
        submit(i, p)
    drain()
    # the step whose decodes cross into page 1: one poison call with all 12 new pages, then its one device call
    crossing = [e for e in log if e[1] == "poison" and len(e[2]) == n_seq]
    assert len(crossing) == 1, log
    at = log.index(crossing[0])
    in_step = [e for e in log if e[0] == crossing[0][0]]
    assert [e[1] for e in in_step if e[1] == "poison"] == ["poison"], in_step     # ONE poison call in that step
    assert log[at + 1] == (crossing[0][0], name, n_seq), log[at:at + 2]           # right before the device call
    # the other poison calls: one per prompt (its first page, in step 1), none in any other decode step
    others = [e for e in log if e[1] == "poison" and e is not crossing[0]]
    assert sorted(len(e[2]) for e in others) == [1] * n_seq and {e[0] for e in others} == {1}
    if fails:
        assert all(isinstance(s.error, Boom) and s.done for s in seqs)
        for j, p in enumerate(prompts[:2]):                # the freed pages go out again, poisoned once more
            submit(n_seq + j, p)
        drain()
        for j, p in enumerate(prompts[:2]):
            assert got[n_seq + j] == reference(p, max_new, ())
        assert sum(len(e[2]) for e in log if e[1] == "poison") == 2 * n_seq + 4
    else:
        assert [s.error for s in seqs] == [None] * n_seq
        for i, p in enumerate(prompts):
            assert got[i] == reference(p, max_new, ())
        assert sum(len(e[2]) for e in log if e[1] == "poison") == 2 * n_seq
    assert not unpoisoned
    sched.pool.check(live=[])
    assert sched.pool.reserved_pages == 0
