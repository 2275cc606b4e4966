"""The KV page pool and its prefix cache (nanoqwen_rt/kv_pool.py): unit cases, and a stress run of random
arrivals, growth, cancellations and prefix hits that checks, after every operation, that no page leaked and no page
is shared wrongly (a simulated page store holds the token id written at each slot: a sequence must always read
back exactly its own tokens)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from nanoqwen_format.shapes import KV_PAGE_TOKENS
from nanoqwen_rt.kv_pool import KvPool, PoolFull, PoolTooSmall, page_hashes, pages_for

P = KV_PAGE_TOKENS


def test_page_size_is_the_format_contract():
    """The pool's page size is the one the C library's page table uses (format_contract.h, checked against
    nanoqwen_format.shapes by tests/test_contract.py)."""
    import re
    from pathlib import Path
    h = (Path(__file__).resolve().parents[1] / "csrc/src/format_contract.h").read_text()
    assert int(re.search(r"kKvPageTokens = (\d+)u", h).group(1)) == P == KvPool(1).page_tokens


def test_hash_names_the_whole_prefix():
    a = list(range(3 * P))
    b = list(a)
    b[0] = 999                          # differs in page 0 only
    ha, hb = page_hashes(a), page_hashes(b)
    assert len(ha) == 3 and all(x != y for x, y in zip(ha, hb))     # page 1 and 2 differ too: chained
    assert page_hashes(a + [1, 2, 3]) == ha                        # a partial page is not hashed


def test_hash_is_the_documented_chain_for_lists_and_arrays():
    """h_i = blake2b(h_{i-1} || int32 little-endian ids of page i), 16-byte digests, from a list or any int array."""
    import hashlib
    ids = [int(x) for x in np.random.default_rng(7).integers(0, 151_936, 4 * P + 5)]
    want, prev = [], b""
    for i in range(4):
        prev = hashlib.blake2b(prev + np.array(ids[i * P:(i + 1) * P], dtype="<i4").tobytes(),
                               digest_size=16).digest()
        want.append(prev)
    for form in (ids, np.array(ids, dtype=np.int64), np.array(ids, dtype=np.int32)):
        assert page_hashes(form) == want


def test_prefix_hit_leaves_one_token_to_compute_and_shares_read_only_pages():
    pool = KvPool(16)
    prompt = list(range(2 * P))                   # exactly two full pages
    a = pool.admit(prompt, 3 * P)
    pool.grow(a, prompt)
    pool.publish(a)
    b = pool.admit(prompt, 3 * P)                 # same prompt: page 0 hits, page 1 is recomputed
    assert b.cached_tokens == P and b.pages == a.pages[:1]
    new = pool.grow(b, prompt[P:])
    assert new and not set(new) & set(a.pages)
    c = pool.admit(prompt + [7] * 5, 4 * P)       # longer prompt: both pages hit
    assert c.cached_tokens == 2 * P and c.pages == a.pages[:2]
    pool.check([a, b, c])
    for s in (a, b, c):
        pool.release(s)
    pool.check([])
    assert pool.used_pages == 0 and pool.cached_pages == 2      # a's two published pages stay cached


def test_full_pool_refuses_and_changes_nothing():
    pool = KvPool(4)
    with pytest.raises(PoolTooSmall):
        pool.admit([1] * 10, 5 * P)
    a = pool.admit([1] * 10, 3 * P)               # reserves 3 pages
    with pytest.raises(PoolFull):
        pool.admit([2] * 10, 2 * P)
    pool.check([a])
    pool.grow(a, [1] * 10 + [3] * (3 * P - 10))  # a can always grow to what it reserved
    pool.check([a])
    with pytest.raises(ValueError):
        pool.grow(a, [4])                         # past its reservation: refused, never takes another's page
    pool.release(a)
    pool.release(a)                               # idempotent
    pool.check([])
    assert pool.available_pages == 4


def test_lru_evicts_only_unreferenced_cached_pages():
    pool = KvPool(4)
    seqs = []
    for k in range(2):                            # two cached one-page prefixes, released in order k = 0, 1
        s = pool.admit([k] * (P + 1), P + 1)
        pool.grow(s, [k] * (P + 1))
        pool.publish(s)
        seqs.append(s)
    for s in seqs:
        pool.release(s)
    assert pool.cached_pages == 2
    keep = pool.admit([1] * (P + 1), P + 1)       # references prefix 1's page (no longer evictable)
    assert keep.cached_tokens == P and pool.cached_pages == 1
    pool.grow(keep, [1])
    pool.check([keep])
    big = pool.admit([9] * 2, 2 * P)              # needs 2: the free page and the LRU one (prefix 0)
    pool.grow(big, [9] * (2 * P))
    assert pool.free_pages == 0
    assert pool.evictions == 1 and keep.pages[0] not in big.pages
    assert pool.cached_pages == 0 and pool.available_pages == 0
    with pytest.raises(PoolFull):                 # keep's referenced page is never taken
        pool.admit([0] * (P + 1), P + 1)
    pool.check([keep, big])


def _stress(seed: int, n_ops: int, n_pages: int):
    rng = random.Random(seed)
    pool = KvPool(n_pages)
    store: list[list[int | None]] = [[None] * P for _ in range(n_pages)]    # token id written at each slot
    live: dict[int, tuple] = {}                                             # seq_id → (SequencePages, target)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 6) * P)] for _ in range(6)]
    hits = refused = finished = cancelled = 0

    def write(seq, ids):
        new = pool.grow(seq, ids)
        for p in new:
            store[p] = [None] * P                                           # poison a (re)allocated page
        start = len(seq.tokens) - len(ids)
        for j, t in enumerate(ids):
            pos = start + j
            store[seq.pages[pos // P]][pos % P] = t

    def read_back(seq):
        return [store[seq.pages[i // P]][i % P] for i in range(len(seq.tokens))]

    for op in range(n_ops):
        r = rng.random()
        if r < 0.3:                                                         # arrival
            base = rng.choice(prefixes) if rng.random() < 0.7 else []
            prompt = base[:rng.randrange(len(base) + 1)] + [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
            target = len(prompt) + rng.randrange(1, 60)
            try:
                seq = pool.admit(prompt, target)
            except PoolFull:
                refused += 1
            else:
                hits += seq.cached_tokens > 0
                assert prompt[:seq.cached_tokens] == read_back(seq)         # a hit holds exactly this prefix
                write(seq, prompt[seq.cached_tokens:])
                pool.publish(seq)
                live[seq.seq_id] = (seq, target)
        elif live:
            sid = rng.choice(list(live))
            seq, target = live[sid]
            if r < 0.85 and len(seq.tokens) < target:                       # growth: a few decode steps
                k = min(target - len(seq.tokens), rng.randrange(1, 4))
                write(seq, [rng.randrange(50) for _ in range(k)])
                pool.publish(seq)
            else:                                                           # finish or cancel
                finished += len(seq.tokens) >= target
                cancelled += len(seq.tokens) < target
                pool.release(seq)
                del live[sid]
        for seq, _ in live.values():
            assert read_back(seq) == seq.tokens, "a page was shared wrongly or overwritten"
        if op % 50 == 0:
            pool.check([s for s, _ in live.values()])
    for seq, _ in list(live.values()):
        pool.release(seq)
    pool.check([])
    assert pool.used_pages == 0 and pool.reserved_pages == 0
    assert pool.free_pages + pool.cached_pages == n_pages                   # nothing leaked
    return hits, refused, finished, cancelled, pool.evictions


@pytest.mark.parametrize("seed,n_pages", [(0, 64), (1, 24), (2, 200)])
def test_stress_random_arrivals_growth_cancellations_and_hits(seed, n_pages):
    hits, refused, finished, cancelled, evictions = _stress(seed, 4000, n_pages)
    # the run exercised every path it is meant to check
    assert hits > 50 and finished > 20 and cancelled > 20
    if n_pages <= 64:
        assert refused > 0 and evictions > 0


def test_pages_for():
    assert [pages_for(n) for n in (1, P, P + 1, 2 * P)] == [1, 1, 2, 2]
