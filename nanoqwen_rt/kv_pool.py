"""The KV page pool shared by every sequence of a batch, with a prefix cache. Pure Python: page bookkeeping only;
the KV rows themselves live in the backend's page store (the CPU backend's `PagedKv`), indexed by these page ids.

A page holds the keys and values of KV_PAGE_TOKENS consecutive positions of one sequence (the page size of the
file format's contract, the one the CUDA library's page table uses too). A sequence owns a page table: page i
holds its positions [i * P, (i + 1) * P).

Prefix cache. A page whose P positions are all written ("full") may be published under a content hash that is
chained with the previous page's hash, so the hash of page i names the sequence's whole prefix [0, (i + 1) * P):
two sequences whose first k pages carry the same token ids share those k pages. A new sequence looks its prompt up
page by page and stops at the first miss. Shared pages are read-only: only full pages are published, and a
sequence never writes below the position it starts computing at (a hit leaves at least one prompt token to
compute, so its own writes go to pages it allocated itself).

Reference counts: every sequence whose page table lists a page holds one reference. An unreferenced page that
carries a hash stays cached (its KV rows are still valid) in an LRU list; an unreferenced page without a hash is
free. Allocation takes a free page first, then evicts the least recently released cached page. A referenced page
is never evicted.

Admission control: a sequence reserves, when it is admitted, every page it can ever need (prompt + max new
tokens), so a running sequence never meets a full pool while it grows; `admit` refuses (PoolFull) instead, and
changes nothing. Invariant: free + evictable pages ≥ outstanding reservations.
"""
from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from nanoqwen_format.shapes import KV_PAGE_TOKENS

__all__ = ["KvPool", "SequencePages", "PoolFull", "PoolTooSmall", "KV_PAGE_TOKENS", "pages_for", "page_hash",
           "page_hashes"]

# Bytes of the chained page hash (blake2b digest): 128 bits make an accidental collision between two different
# prefixes negligible for any number of pages a server will ever hash.
HASH_BYTES = 16


class PoolFull(Exception):
    """Not enough free or evictable pages for this sequence right now (pages in use by running sequences).
    Nothing was changed; retry when a sequence ends."""


class PoolTooSmall(PoolFull):
    """The sequence needs more pages than the whole pool holds: it can never be admitted."""


def pages_for(n_tokens: int, page_tokens: int = KV_PAGE_TOKENS) -> int:
    """Pages holding n_tokens positions."""
    return -(-int(n_tokens) // page_tokens)


def page_hash(prev: bytes, page_ids) -> bytes:
    """The hash of a full page after the page whose hash is `prev` (b"" for the first):
    blake2b(prev || int32 little-endian ids of the page). page_ids: its ids, or their int32 little-endian bytes."""
    data = page_ids if isinstance(page_ids, bytes) else np.ascontiguousarray(page_ids, dtype="<i4").tobytes()
    return hashlib.blake2b(prev + data, digest_size=HASH_BYTES).digest()


def page_hashes(ids: Sequence[int] | np.ndarray, page_tokens: int = KV_PAGE_TOKENS) -> list[bytes]:
    """Chained hashes (page_hash) of the FULL pages of `ids`. The ids become bytes once and each page is a slice of
    them (a 2,000-token prompt: ~0.1 ms here, half the time of a conversion per page)."""
    buf = np.ascontiguousarray(ids, dtype="<i4").tobytes()
    n = 4 * page_tokens
    out: list[bytes] = []
    prev = b""
    for o in range(0, (len(buf) // n) * n, n):
        prev = page_hash(prev, buf[o:o + n])
        out.append(prev)
    return out


@dataclass
class SequencePages:
    """One sequence's page table in the pool. `tokens`: the ids whose KV rows are written (in order); `reserved`:
    pages still reserved for it (taken by `grow`)."""
    seq_id: int
    pages: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    reserved: int = 0
    cached_tokens: int = 0          # prompt positions found in the prefix cache at admission
    published: int = 0              # leading pages already offered to the prefix cache
    hashes: list[bytes] = field(default_factory=list)   # chained hashes of its full pages, in order
    open: bool = True


class KvPool:
    """Page bookkeeping for `n_pages` pages (see the module docstring). Not thread-safe: one owner (the engine's
    scheduler, under its step lock) calls it."""

    def __init__(self, n_pages: int, page_tokens: int = KV_PAGE_TOKENS):
        if isinstance(n_pages, bool) or not isinstance(n_pages, (int, np.integer)) or n_pages < 1:
            raise ValueError(f"n_pages must be a positive integer, got {n_pages!r}")
        self.n_pages = int(n_pages)
        self.page_tokens = int(page_tokens)
        self._refs = [0] * self.n_pages
        self._hash_of: list[bytes | None] = [None] * self.n_pages
        self._free: collections.deque[int] = collections.deque(range(self.n_pages))
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()   # unreferenced cached pages
        self._index: dict[bytes, int] = {}          # hash → page (referenced or not)
        self._reserved = 0
        self._next_id = 0
        self.prefix_hit_pages = 0                   # pages found in the cache over the pool's life
        self.prefix_hit_tokens = 0
        self.evictions = 0

    # -- counts -------------------------------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        """Pages holding nothing (cached pages are not counted)."""
        return len(self._free)

    @property
    def cached_pages(self) -> int:
        """Unreferenced pages kept for the prefix cache (evictable)."""
        return len(self._lru)

    @property
    def used_pages(self) -> int:
        """Pages referenced by at least one sequence."""
        return self.n_pages - len(self._free) - len(self._lru)

    @property
    def reserved_pages(self) -> int:
        return self._reserved

    @property
    def available_pages(self) -> int:
        """Pages a new sequence could still reserve (free + evictable − already reserved)."""
        return len(self._free) + len(self._lru) - self._reserved

    # -- sequences ----------------------------------------------------------------------------------------
    def admit(self, prompt_ids: Sequence[int] | np.ndarray, max_tokens: int, use_cache: bool = True) -> SequencePages:
        """A new sequence for `prompt_ids` that may grow to `max_tokens` positions in all. Takes the prompt's
        cached leading pages (at most (len(prompt) - 1) // P of them, so one prompt token is left to compute) and
        reserves the rest. Raises PoolTooSmall / PoolFull (nothing changed) when the pages are not there."""
        n_prompt = len(prompt_ids)
        if n_prompt < 1 or max_tokens < n_prompt:
            raise ValueError(f"admit: prompt of {n_prompt} tokens and max_tokens {max_tokens}")
        need = pages_for(max_tokens, self.page_tokens)
        if need > self.n_pages:
            raise PoolTooSmall(f"a sequence of {max_tokens} tokens needs {need} KV pages; the pool has "
                               f"{self.n_pages}")
        hits: list[int] = []
        hashes: list[bytes] = []
        if use_cache and n_prompt > self.page_tokens:
            hashes = page_hashes(prompt_ids[:((n_prompt - 1) // self.page_tokens) * self.page_tokens],
                                 self.page_tokens)
            for h in hashes:
                p = self._index.get(h)
                if p is None:
                    break
                hits.append(p)
        for p in hits:
            self._ref(p)
        rest = need - len(hits)
        if self.available_pages < rest:
            for p in hits:
                self._unref(p)
            raise PoolFull(f"KV pool full: a sequence needs {rest} more pages, {self.available_pages} of "
                           f"{self.n_pages} are free or evictable")
        self._reserved += rest
        self.prefix_hit_pages += len(hits)
        n_cached = len(hits) * self.page_tokens
        self.prefix_hit_tokens += n_cached
        seq = SequencePages(self._next_id, pages=list(hits), tokens=np.asarray(prompt_ids[:n_cached]).tolist(),
                            reserved=rest, cached_tokens=n_cached, published=len(hits), hashes=hashes[:len(hits)])
        self._next_id += 1
        return seq

    def grow(self, seq: SequencePages, ids: Sequence[int]) -> list[int]:
        """Record that the KV rows of `ids` are about to be written after the sequence's current tokens: takes the
        pages they need from the sequence's reservation (never fails for a sequence that stays within the
        max_tokens it was admitted with). Returns the newly allocated pages (the backend poisons them)."""
        if not seq.open:
            raise ValueError("grow: the sequence is closed")
        n_after = len(seq.tokens) + len(ids)
        new: list[int] = []
        while len(seq.pages) < pages_for(n_after, self.page_tokens):
            if seq.reserved <= 0:
                raise ValueError(f"grow: sequence {seq.seq_id} grew past the tokens it reserved")
            seq.reserved -= 1
            self._reserved -= 1
            p = self._take_page()
            self._ref(p)
            seq.pages.append(p)
            new.append(p)
        seq.tokens.extend(int(t) for t in ids)
        return new

    def publish(self, seq: SequencePages, n_tokens: int | None = None) -> None:
        """Offer the sequence's full pages (their KV rows written) to the prefix cache; n_tokens: only those full
        within its first n_tokens tokens (the rows written so far, when later ones are still being computed). A
        page whose prefix is cached already under another page stays private (it is freed, not cached, when
        released)."""
        n_full = (len(seq.tokens) if n_tokens is None else min(n_tokens, len(seq.tokens))) // self.page_tokens
        while seq.published < n_full:
            i = seq.published
            prev = seq.hashes[i - 1] if i else b""
            h = page_hash(prev, seq.tokens[i * self.page_tokens:(i + 1) * self.page_tokens])
            seq.hashes.append(h)
            p = seq.pages[i]
            if h not in self._index and self._hash_of[p] is None:
                self._index[h] = p
                self._hash_of[p] = h
            seq.published += 1

    def release(self, seq: SequencePages) -> None:
        """The sequence ended (finished, cancelled or failed): drop its references and return its unused
        reservation at once. Idempotent."""
        if not seq.open:
            return
        seq.open = False
        for p in seq.pages:
            self._unref(p)
        self._reserved -= seq.reserved
        seq.reserved = 0
        seq.pages = []

    # -- pages --------------------------------------------------------------------------------------------
    def _take_page(self) -> int:
        if self._free:
            return self._free.popleft()
        p, _ = self._lru.popitem(last=False)         # the least recently released cached page
        del self._index[self._hash_of[p]]
        self._hash_of[p] = None
        self.evictions += 1
        return p

    def _ref(self, p: int) -> None:
        if self._refs[p] == 0:
            self._lru.pop(p, None)
        self._refs[p] += 1

    def _unref(self, p: int) -> None:
        self._refs[p] -= 1
        if self._refs[p] < 0:
            raise AssertionError(f"page {p} released more often than taken")
        if self._refs[p] == 0:
            if self._hash_of[p] is not None:
                self._lru[p] = None                  # most recently released: evicted last
            else:
                self._free.append(p)

    # -- checks (tests) -----------------------------------------------------------------------------------
    def check(self, live: Sequence[SequencePages] = ()) -> None:
        """Raise AssertionError unless the bookkeeping is consistent with the live sequences `live` (all of them):
        every page is exactly one of free / cached / referenced, reference counts equal the page tables that list
        the page, reservations add up, the index and page hashes agree."""
        counts = [0] * self.n_pages
        for s in live:
            assert s.open, f"sequence {s.seq_id} is closed"
            for p in s.pages:
                counts[p] += 1
            assert len(set(s.pages)) == len(s.pages), f"sequence {s.seq_id} lists a page twice"
        assert counts == self._refs, "reference counts differ from the live page tables"
        free, lru = set(self._free), set(self._lru)
        assert len(free) == len(self._free) and not (free & lru), "a page is free twice or free and cached"
        for p in range(self.n_pages):
            in_use = self._refs[p] > 0
            assert in_use + (p in free) + (p in lru) == 1, f"page {p} is not in exactly one state"
            if p in lru:
                assert self._hash_of[p] is not None, f"cached page {p} has no hash"
            if p in free:
                assert self._hash_of[p] is None, f"free page {p} still has a hash"
        assert {p: h for h, p in self._index.items()} == {p: h for p, h in enumerate(self._hash_of)
                                                          if h is not None}, "hash index and pages disagree"
        assert self._reserved == sum(s.reserved for s in live), "reservations do not add up"
        assert self.available_pages >= 0, "more pages reserved than free or evictable"
