"""The scheduler behind the Engine's batched API (Engine.submit / Engine.step): many sequences share one backend
and one KV page pool (nanoqwen_rt/kv_pool.py).

One step (Scheduler.step), under the engine's step lock:
  1. sequences cancelled since the last step leave, and their pages go back to the pool;
  2. waiting requests are admitted in arrival order while fewer than max_batch run and the pool can reserve their
     pages (prompt + max new tokens); the first one that does not fit waits, and so do the ones behind it (FIFO);
     a prefix-cache hit gives a new sequence the KV rows of its prompt's cached leading pages;
  3. every decoding sequence decodes its last token and samples the next one;
  4. prefilling sequences compute their prompts in chunks, in arrival order, at most PREFILL_CHUNK_TOKENS prompt
     tokens per step in all, so a long prompt never holds the decodes of step 3 back for longer than one chunk
     (in a step where no sequence decodes, the store's idle_prefill_tokens if it has one: nobody waits then);
     a sequence whose prompt is done samples its first token;
  5. finished sequences (stop id, max new tokens, full context, a grammar that completed) leave at once.

Pipelining (a SequenceKv with `pipelines`, CUDA, when every decoding sequence's tokens are drawn by the store): step 3
launches the batch's next device step BEFORE it waits for the one launched by the previous Engine.step, so the
device runs one step while the host delivers the other's tokens and prepares the next. A sequence whose row is in
flight continues from that row's draw (still on the device, `chain`), unless its in-flight token is certain to be
its last (max new tokens, full context); a sequence that ends on a stop id its in-flight row could not know has one
wasted row in the next step, and keeps its pages and session until that step is waited (the device still writes
them). Tokens reach consumers one step after their step was launched. Prefix-cache pages are offered only once the
step that wrote their last row has been waited. Anything else in the batch (a host-sampled request, a store
without pipelining) lands the step in flight first and runs the step as one call.

Who samples. A request with a LogitsPipeline (grammar, logprobs, logit_bias, penalties) samples on the host from
its logits, exactly as Backend._generate_steered does (same Sampler, same pipeline). A plain request (temperature /
top_k / top_p / seed) samples where its logits are: on a backend whose SequenceKv draws tokens itself
(samples_tokens: CUDA, the device sampler that Engine.generate uses for the same request) the scheduler gives the
sequence its settings (set_sampling) and receives only tokens; elsewhere (the CPU backend) on the host as
Backend._generate_ids does. Either way a greedy or seeded request yields what Engine.generate yields for it on the
same backend, up to the float32 differences of computing its prompt in chunks and its decode tokens in a batch
(see tests/test_batch.py, tests/test_gpu_batch_engine.py).

How the backend computes a step: through its SequenceKv (Backend.sequence_kv). The decode tokens of all decoding
sequences go in one forward_decode call: the CUDA backend runs them as ONE device step (nq_decode_batch: each weight
read once for all of them, attention per sequence in its own cache), the CPU backend (the oracle) one sequence after
another with the kernels of the single-sequence path over its pages. Prompt chunks run one sequence at a time.

Poisoning. The pages the pool hands out are poisoned (SequenceKv.poison: NaN, so a read of a row nobody wrote shows)
before the device work that writes them is launched: the decodes of a step in ONE call for all their new pages,
just before their forward_decode / launch_decode (32 streams that cross a page boundary together make one
nq_kv_pool_poison, not 32); a prompt chunk its own pages, just before it runs. A failed poison call fails the device
call it precedes; a page stays with its sequence when that call fails, so nothing is poisoned twice for one hand-out.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

import numpy as np

from .kv_pool import KV_PAGE_TOKENS, KvPool, PoolFull, PoolTooSmall, SequencePages, pages_for
from .sampling import Sampler

__all__ = ["Scheduler", "BatchStats", "DEFAULT_MAX_BATCH", "PREFILL_CHUNK_TOKENS", "default_kv_pages"]

# Sequences that run at once unless the caller says otherwise: enough for a small team on one CPU or GPU, and
# what the server's --max-batch defaults to.
DEFAULT_MAX_BATCH = 16
# Prompt tokens computed per step, over all prefilling sequences: one chunk of a long prompt costs a CPU step about
# as much as a few dozen decode tokens, so running decodes still advance every step while a long prompt enters.
PREFILL_CHUNK_TOKENS = 256
# The KV pages a CPU engine takes when none are asked for: max_batch full contexts, but at most this many bytes
# of f32 rows (1 GiB: fits next to the weights on a laptop), and never less than one full context.
CPU_KV_BUDGET_BYTES = 1 << 30
# Steps whose tokens and time the tokens/s figure averages: recent enough to follow the load.
RATE_WINDOW_STEPS = 32


def default_kv_pages(max_context: int, max_batch: int, page_bytes: int,
                     budget_bytes: int = CPU_KV_BUDGET_BYTES) -> int:
    """Pages for max_batch sequences of max_context positions, within budget_bytes, at least one full context."""
    per_seq = pages_for(max_context)
    return max(per_seq, min(per_seq * max_batch, budget_bytes // page_bytes))


class BatchStats:
    """A snapshot of the scheduler for monitoring (the server's /metrics)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _Seq:
    """One request in the scheduler: its prompt, sampling state, pages and the tokens it produced."""

    def __init__(self, ids: np.ndarray, params, max_new: int, stops: set[int], pipeline, on_token: Callable):
        self.ids = ids                      # int32 (n_prompt,), checked
        self.sampler = Sampler(params)
        self.pipeline = pipeline            # LogitsPipeline or None
        self.max_new = max_new
        self.stops = stops
        self.on_token = on_token            # (token, TokenLogprob | None, complete) → None; called in the step
        self.pages: SequencePages | None = None
        self.drawn_by_store = False         # the SequenceKv draws its tokens (set at admission)
        self.n_new = 0                      # tokens sampled
        self.last: int | None = None        # the sampled token not yet decoded
        self.cancelled = False
        self.done = False
        self.error: BaseException | None = None
        self.on_end: Callable | None = None

    @property
    def prefilling(self) -> bool:
        return self.pages is not None and len(self.pages.tokens) < self.ids.shape[0]

    def fail(self, error: BaseException) -> None:
        """End this sequence with `error` (reported to its consumer when it leaves)."""
        self.error = error
        self.done = True


class Scheduler:
    """Continuous batching over one backend (see the module docstring). `lock` is the engine's step lock: every
    public method that touches the backend holds it."""

    def __init__(self, backend, max_batch: int, kv_pages: int, lock: threading.Lock):
        self.backend = backend
        self.max_batch = int(max_batch)
        self.max_context = int(backend.max_context)
        self.kv = backend.sequence_kv(kv_pages)
        self.pool = KvPool(kv_pages)
        self.lock = lock
        self.changed = threading.Condition(threading.Lock())     # notified after every step and every end
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._running: list[_Seq] = []
        self.steps = 0
        self.last_batch = 0
        self.tokens_total = 0
        self._recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=RATE_WINDOW_STEPS)
        self._closed = False
        self._flight: list[_Seq] = []       # rows of the pipelined step launched and not yet waited, in order
        self.kv.plan_batch(self.max_batch)

    # -- requests -----------------------------------------------------------------------------------------
    def add(self, seq: _Seq) -> None:
        """Queue a checked request; raises PoolTooSmall when it can never fit the pool. Waits for a step that is
        running (the request joins at the next step boundary anyway)."""
        need = self._capacity(seq)
        if pages_for(need) > self.pool.n_pages:
            raise PoolTooSmall(f"this request needs {pages_for(need)} KV pages of {KV_PAGE_TOKENS} tokens (prompt "
                               f"{seq.ids.shape[0]} + up to {seq.max_new} new tokens); the pool has "
                               f"{self.pool.n_pages}")
        with self.lock:                      # the step reads and edits the waiting list under this lock
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._waiting.append(seq)
        with self.changed:
            self.changed.notify_all()

    def cancel(self, seq: _Seq) -> None:
        """The consumer went away: the sequence leaves now if no step is running, else at the next step's start
        (a step computes at most one more token for it)."""
        seq.cancelled = True
        if self.lock.acquire(blocking=False):
            try:
                self._retire_cancelled()
            finally:
                self.lock.release()

    def _capacity(self, seq: _Seq) -> int:
        """Positions the sequence can ever write: the prompt and every sampled token but the last (never decoded),
        within the context."""
        return min(seq.ids.shape[0] + seq.max_new - 1, self.max_context)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._flight)

    def stats(self) -> BatchStats:
        tok = sum(n for n, _ in self._recent)
        sec = sum(s for _, s in self._recent)
        return BatchStats(running=len(self._running), waiting=len(self._waiting),
                          max_batch=self.max_batch, last_batch=self.last_batch, steps=self.steps,
                          kv_pages=self.pool.n_pages, kv_pages_used=self.pool.used_pages,
                          kv_pages_free=self.pool.free_pages, kv_pages_cached=self.pool.cached_pages,
                          kv_pages_reserved=self.pool.reserved_pages,
                          prefix_hit_pages=self.pool.prefix_hit_pages, prefix_hit_tokens=self.pool.prefix_hit_tokens,
                          tokens_total=self.tokens_total, tokens_per_s=tok / sec if sec > 0 else 0.0)

    # -- the step -----------------------------------------------------------------------------------------
    def step(self) -> int:
        """One scheduler step (module docstring). Returns the number of tokens sampled. Call with the engine's
        step lock NOT held (it is taken here)."""
        with self.lock:
            return 0 if self._closed else self._step_locked()

    def _step_locked(self) -> int:
        t0 = time.perf_counter()
        self._retire_cancelled()
        self._admit()
        batch = [s for s in self._running if s.pages is not None]
        # decodes first: one token each, all in one device step on CUDA (pipelined where it can be)
        decoding = [s for s in batch if not s.prefilling and s.last is not None and not s.done]
        if self.kv.pipelines and all(s.drawn_by_store for s in decoding):
            n_tok = self._decode_pipelined(decoding)
        else:
            n_tok = self._land()
            n_tok += self._decode_all([s for s in decoding if not s.done])
        # prompt tokens this step: a chunk that holds decodes back at most PREFILL_CHUNK_TOKENS long, or with no
        # decode in the step the store's efficient prompt size (CUDA: a 2,006-token prompt in 1 step, not 8)
        budget = PREFILL_CHUNK_TOKENS if decoding else (self.kv.idle_prefill_tokens or PREFILL_CHUNK_TOKENS)
        for s in batch:                                           # then prompt chunks, in arrival order
            if budget <= 0:
                break
            if s.prefilling and not s.done:
                start = len(s.pages.tokens)
                chunk = s.ids[start:start + budget]
                budget -= chunk.shape[0]
                n_tok += self._run(s, chunk)
        self._retire_done()
        dt = time.perf_counter() - t0
        self.steps += 1
        self.last_batch = len(batch)
        self.tokens_total += n_tok
        if batch:
            self._recent.append((n_tok, dt))
        with self.changed:
            self.changed.notify_all()
        return n_tok

    def _decode_all(self, seqs: list) -> int:
        """The last token of every sequence in `seqs` through ONE SequenceKv.forward_decode call, then each samples
        as in _run. Returns the tokens sampled. A sequence whose pages cannot grow ends with that error; a failure
        of the shared step (its poison call included) ends every sequence in it with the error (the others of the
        engine go on)."""
        ready, p0s, fresh = [], [], []
        for s in seqs:
            try:
                p0 = self._grow(s, (s.last,), fresh)
            except Exception as e:          # noqa: BLE001 (reported to this request's consumer)
                s.fail(e)
                continue
            ready.append(s)
            p0s.append(p0)
        if not ready:
            return 0
        try:
            self._poison(fresh)
            drawn, logits = self.kv.forward_decode([s.pages for s in ready], p0s,
                                                   np.array([s.last for s in ready], dtype=np.int32))
        except Exception as e:              # noqa: BLE001 (reported to each request's consumer)
            for s in ready:
                s.fail(e)
            return 0
        n = j = 0
        share = self.kv.shares_pages        # else no sequence can reuse a page: nothing to offer the cache
        for s, tok in zip(ready, drawn.tolist()):
            if share:
                self.pool.publish(s.pages)
            if s.drawn_by_store:
                n += self._deliver(s, tok, None, False)
            else:                           # the host-sampled rows' logits, in the order of `ready`
                n += self._sample(s, logits[j])
                j += 1
        return n

    def _grow(self, s: _Seq, ids, fresh: list) -> int:
        """Record ids as s's next KV rows in the pool (pool.grow) and add the pages that gives it to `fresh`, which
        the caller poisons (_poison) before it launches the device work that writes them; returns the position of
        the first (raises what grow raises)."""
        p0 = len(s.pages.tokens)
        fresh.extend(self.pool.grow(s.pages, ids))
        return p0

    def _poison(self, fresh: list) -> None:
        """Poison the pages a step handed out, in ONE SequenceKv.poison call (CUDA: one nq_kv_pool_poison, which
        returns without waiting; the device orders it before the steps that write them)."""
        if fresh:
            self.kv.poison(fresh)

    def _ends_with_next_token(self, s: _Seq) -> bool:
        """Whether s's next token is certain to be its last (max new tokens, or the context full): _deliver's test."""
        return s.n_new + 1 >= s.max_new or s.ids.shape[0] + s.n_new + 1 >= self.max_context

    def _decode_pipelined(self, decoding: list) -> int:
        """Step 3 pipelined (module docstring): launch the next device step for `decoding` (every one drawn by the
        store), then wait for the step in flight and deliver its tokens. Returns the tokens delivered."""
        prev = {id(s): i for i, s in enumerate(self._flight)}
        rows, p0s, toks, chain, fresh = [], [], [], [], []
        for s in decoding:
            i = prev.get(id(s))
            if i is not None and self._ends_with_next_token(s):
                continue                    # its row in flight yields its last token
            try:
                p0 = self._grow(s, (s.last if i is None else -1,), fresh)   # -1: the draw of row i, patched in _land
            except Exception as e:          # noqa: BLE001 (reported to this request's consumer)
                s.fail(e)
                continue
            rows.append(s)
            p0s.append(p0)
            toks.append(s.last if i is None else 0)
            chain.append(-1 if i is None else i)
        if rows:
            try:
                self._poison(fresh)
                self.kv.launch_decode([s.pages for s in rows], p0s, np.array(toks, dtype=np.int32),
                                      np.array(chain, dtype=np.int32))
            except Exception as e:          # noqa: BLE001 (reported to each request's consumer)
                for s in rows:
                    s.pages.tokens.pop()     # its row was never written
                    s.fail(e)
                rows = []
        n = self._land(chained={id(s) for s, c in zip(rows, chain) if c >= 0})
        self._flight = rows
        if self.kv.shares_pages:            # the new step's rows are not written yet
            for s in rows:
                self.pool.publish(s.pages, len(s.pages.tokens) - 1)
        return n

    def _land(self, chained: set = frozenset()) -> int:
        """Wait for the pipelined step in flight (if any) and deliver its tokens; a row whose sequence continues in
        a step launched since (id in `chained`) gets its new position's token recorded. Returns the tokens
        delivered. A failed wait ends every sequence of that step with the error."""
        rows, self._flight = self._flight, []
        if not rows:
            return 0
        try:
            drawn = self.kv.wait_decode(len(rows)).tolist()
        except Exception as e:              # noqa: BLE001 (reported to each request's consumer)
            for s in rows:
                s.fail(e)
            return 0
        n = 0
        share = self.kv.shares_pages
        for s, tok in zip(rows, drawn):
            if id(s) in chained:
                s.pages.tokens[-1] = int(tok)
            if s.done:                      # cancelled, or ended with the step before: this row was spare
                continue
            n += self._deliver(s, tok, None, False)
            if share and id(s) not in chained:
                self.pool.publish(s.pages)
        return n

    def _run(self, s: _Seq, ids: np.ndarray) -> int:
        """Compute ids for s (a prompt chunk), then sample when the prompt is done. Returns 1 when a token was
        sampled. A backend failure ends this sequence with the error; the others go on."""
        try:
            fresh: list = []
            p0 = self._grow(s, ids, fresh)
            self._poison(fresh)
            if len(s.pages.tokens) < s.ids.shape[0]:     # more prompt to come: nobody reads these logits
                self.kv.extend(s.pages, p0, ids)
                out = None
            elif s.drawn_by_store:
                out = self.kv.forward_token(s.pages, p0, ids)
            else:
                out = self.kv.forward(s.pages, p0, ids)
            if self.kv.shares_pages:
                self.pool.publish(s.pages)
        except Exception as e:              # noqa: BLE001 (reported to this request's consumer)
            s.fail(e)
            return 0
        if out is None:
            return 0
        return self._deliver(s, out, None, False) if s.drawn_by_store else self._sample(s, out)

    def _sample(self, s: _Seq, logits: np.ndarray) -> int:
        """Sample s's next token from its logits (float32 (vocab_rows,)) through its pipeline and sampler, then
        _deliver it. Returns 1 (0 when sampling failed: the sequence ends with the error)."""
        try:
            if s.pipeline is not None:
                logits = s.pipeline.process(logits)
                tok = s.sampler(logits)
                lp, complete = s.pipeline.after_sample(logits, tok)
            else:
                tok = s.sampler(logits)
                lp, complete = None, False
        except Exception as e:              # noqa: BLE001 (reported to this request's consumer)
            s.fail(e)
            return 0
        return self._deliver(s, tok, lp, complete)

    def _deliver(self, s: _Seq, tok: int, lp, complete: bool) -> int:
        """Hand s's next token to its consumer and mark the sequence done at its end. Returns 1."""
        s.n_new += 1
        s.last = tok
        n_total = s.ids.shape[0] + s.n_new
        end = complete or tok in s.stops or s.n_new >= s.max_new or n_total >= self.max_context
        s.on_token(tok, lp, complete)        # before `done`: a consumer that sees done has every token
        if end:
            s.done = True
        return 1

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_batch:
            s = self._waiting[0]
            if s.cancelled:
                self._waiting.popleft()
                self._end(s)
                continue
            try:
                s.pages = self.pool.admit(s.ids, self._capacity(s), use_cache=self.kv.shares_pages)
            except PoolTooSmall as e:       # the pool shrank below it (cannot happen today: checked in add)
                self._waiting.popleft()
                s.error = e
                self._end(s)
                continue
            except PoolFull:
                return                      # head of line waits for pages; the others wait behind it
            self._waiting.popleft()
            try:
                self.kv.open(s.pages, self._capacity(s))
            except Exception as e:          # noqa: BLE001
                s.error = e
                self.pool.release(s.pages)
                self._end(s)
                continue
            if self.kv.samples_tokens and s.pipeline is None:   # plain sampling: where the logits are
                try:
                    self.kv.set_sampling(s.pages, s.sampler.params)
                except Exception as e:      # noqa: BLE001
                    s.error = e
                    self.kv.close(s.pages)
                    self.pool.release(s.pages)
                    self._end(s)
                    continue
                s.drawn_by_store = True
            self._running.append(s)

    def _retire_cancelled(self) -> None:
        for s in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(s)
            self._end(s)
        for s in self._running:
            if s.cancelled:
                s.done = True
        self._retire_done()

    def _retire_done(self) -> None:
        keep = []
        flying = {id(s) for s in self._flight}
        for s in self._running:
            if s.done and id(s) not in flying:   # a row in flight still writes its pages: it leaves after the wait
                self.kv.close(s.pages)
                self.pool.release(s.pages)
                self._end(s)
            else:
                keep.append(s)
        self._running = keep

    def _end(self, s: _Seq) -> None:
        s.done = True
        if s.on_end is not None:
            s.on_end()
        with self.changed:
            self.changed.notify_all()

    def close(self, error: BaseException) -> None:
        """End every sequence with `error` (the engine is closing; called with the step lock held): their
        consumers get the error once they have read the tokens already sampled."""
        self._closed = True
        try:
            self._land()                    # the device finishes writing the pages before they are freed
        except Exception:                   # noqa: BLE001 (closing: the sequences end with `error` below)
            pass
        for s in list(self._waiting) + self._running:
            if not s.done:
                s.fail(error)
        self._waiting.clear()
        self._retire_done()
