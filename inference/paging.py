"""The host's page manager for the paged KV cache: free pages, reference counts, and
automatic prefix caching.

A request reserves every page it can ever need at admission (prompt plus ``max_tokens``,
capped at the slot length), so the device never runs out mid-decode and nothing is
preempted; a request that does not fit waits in the queue (admission by free pages, not
by slots). Full prompt blocks are keyed by a hash chained over all blocks before them
(vLLM's automatic prefix caching), so two prompts share exactly their common full-block
prefix. Only *full* prompt blocks are shared and decoding only ever writes past the
prompt, so a shared page is never written: the first divergent block is always a fresh
private page (copy-on-write degenerates to allocate-on-divergence, with no copy).
Released pages that hold a cached block stay findable until their page is needed again
(least recently released first).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

NULL_PAGE = 0  # never allocated: unused page-table entries point here


@dataclasses.dataclass
class Reservation:
    """The pages of one admitted request and how many prompt positions were cached."""

    table: np.ndarray  # (pages_per_slot,) int32, NULL_PAGE past the reserved ones
    pages: list[int]
    cached_tokens: int


class PagePool:
    """Pages ``1 .. pages - 1`` of the device pool, handed out to requests."""

    def __init__(self, pages: int, page_size: int, pages_per_slot: int, *, prefix_caching: bool):
        self.page_size = page_size
        self.pages_per_slot = pages_per_slot
        self.prefix_caching = prefix_caching
        self.total = pages - 1
        self._free: collections.deque[int] = collections.deque(range(1, pages))
        self._refs = np.zeros(pages, np.int32)
        self._by_hash: dict[int, int] = {}
        self._hash_of: dict[int, int] = {}
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0

    def free_pages(self) -> int:
        """Pages a new request could take now (cached-but-unused ones included)."""
        return len(self._free) + len(self._evictable)

    def _block_hashes(self, prompt: list[int]) -> list[int]:
        hashes, h = [], 0
        for b in range(len(prompt) // self.page_size):
            h = hash((h, tuple(prompt[b * self.page_size : (b + 1) * self.page_size])))
            hashes.append(h)
        return hashes

    def reserve(
        self, prompt: list[int], total_tokens: int, *, use_cache: bool
    ) -> Reservation | None:
        """Pages for a request of ``total_tokens`` positions, reusing cached prompt blocks;
        ``None`` when not enough pages are free (the request must wait)."""
        needed = -(-total_tokens // self.page_size)
        hashes = self._block_hashes(prompt) if self.prefix_caching else []
        matched: list[int] = []
        if use_cache:
            # Keep at least one prompt token to run: its logits give the first token.
            for h in hashes[: (len(prompt) - 1) // self.page_size]:
                page = self._by_hash.get(h)
                if page is None:
                    break
                matched.append(page)
        reusable_idle = sum(1 for p in matched if self._refs[p] == 0)
        if needed - len(matched) > self.free_pages() - reusable_idle:
            return None
        for page in matched:
            if self._refs[page] == 0:
                del self._evictable[page]
            self._refs[page] += 1
        fresh = [self._take() for _ in range(needed - len(matched))]
        pages = matched + fresh
        # The new full prompt blocks become findable (the prefill writing them is already
        # ordered before any later request's on the device).
        for b in range(len(matched), len(hashes)):
            if hashes[b] not in self._by_hash:
                self._by_hash[hashes[b]] = pages[b]
                self._hash_of[pages[b]] = hashes[b]
        table = np.full(self.pages_per_slot, NULL_PAGE, np.int32)
        table[: len(pages)] = pages
        cached = len(matched) * self.page_size
        if use_cache:
            self.lookup_tokens += len(prompt)
            self.hit_tokens += cached
        return Reservation(table=table, pages=pages, cached_tokens=cached)

    def _take(self) -> int:
        if self._free:
            page = self._free.popleft()
        else:  # reuse the least recently released cached block
            page, _ = self._evictable.popitem(last=False)
            del self._by_hash[self._hash_of.pop(page)]
        self._refs[page] = 1
        return page

    def release(self, reservation: Reservation) -> None:
        """Give a finished (or cancelled) request's pages back."""
        for page in reservation.pages:
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._hash_of:
                    self._evictable[page] = None
                else:
                    self._free.append(page)
        reservation.pages = []

    def hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache over prompt tokens looked up."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0
