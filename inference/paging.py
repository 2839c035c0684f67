"""The host's page manager for the paged KV cache: free pages, reference counts, and
automatic prefix caching with copy-on-write.

A request reserves every page it can ever need at admission (prompt plus ``max_tokens``,
capped at the slot length), so the device never runs out mid-decode and nothing is
preempted; a request that does not fit waits in the queue (admission by free pages, not
by slots). Full prompt blocks are keyed by a hash chained over all blocks before them
(vLLM's automatic prefix caching), so two prompts share exactly their common full-block
prefix; shared pages are read-only.

Copy-on-write: the first block where a prompt diverges from a cached one (or, for a
request that needs the logits of its last cached position, the block holding that
position) is *copied* on device into a fresh private page, and the prefill starts at the
first position that is not already there, mid-block. A divergent block therefore costs
one page copy instead of recomputing its common tokens, and no shared page is ever
written (vLLM copies a shared block the same way before a sequence writes into it).

The last, partial block of a prompt is kept as a copy source too (never shared: decoding
writes its other positions), so a repeated prompt recomputes only its last token.

Prompt log-probabilities are cached per block too (host arrays: the log-prob, rank and
top alternatives of each position's token), so a ``prompt_logprobs`` request also reuses
the cached prefix; it recomputes only its last cached position, whose logits predict the
first new token. Released pages that hold a cached block stay findable until their page
is needed again (least recently released first).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

NULL_PAGE = 0  # never allocated: unused page-table entries point here


@dataclasses.dataclass(frozen=True)
class PromptScores:
    """Per-position scores of prompt tokens: entry ``t`` is about ``prompt[t]`` given
    ``prompt[:t]`` (entry 0 has no context and is never reported)."""

    logprobs: np.ndarray  # (n,) float32
    ranks: np.ndarray  # (n,) int32
    top_ids: np.ndarray  # (n, top) int32
    top_logprobs: np.ndarray  # (n, top) float32

    def __getitem__(self, index: slice) -> PromptScores:
        return PromptScores(
            self.logprobs[index], self.ranks[index], self.top_ids[index], self.top_logprobs[index]
        )

    @staticmethod
    def concat(parts: list[PromptScores]) -> PromptScores:
        return PromptScores(
            *(
                np.concatenate([getattr(p, f.name) for p in parts])
                for f in dataclasses.fields(PromptScores)
            )
        )


@dataclasses.dataclass
class Reservation:
    """The pages of one admitted request and where its prefill starts.

    ``cached_tokens`` positions are already in the pages (shared, or copied by ``copy``)
    and the prefill runs from there; ``copy = (source, destination)`` is the page to copy
    on device before it (``None``: nothing to copy). ``scores`` holds the cached prompt
    scores of positions ``0 .. cached_tokens`` (only when asked for).
    """

    table: np.ndarray  # (pages_per_slot,) int32, NULL_PAGE past the reserved ones
    pages: list[int]
    cached_tokens: int
    copy: tuple[int, int] | None = None
    hashes: list[int] = dataclasses.field(default_factory=list)
    scores: PromptScores | None = None


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


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
        # For copy-on-write: the cached blocks that follow each chain hash, with their tokens.
        self._children: dict[int, dict[int, tuple[int, ...]]] = {}
        self._parent_of: dict[int, int] = {}
        self._scores: dict[int, PromptScores] = {}  # block hash -> its positions' scores
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0
        self.copies = 0

    def free_pages(self) -> int:
        """Pages a new request could take now (cached-but-unused ones included)."""
        return len(self._free) + len(self._evictable)

    def _block_hashes(self, prompt: list[int]) -> list[int]:
        hashes, h = [], 0
        for b in range(len(prompt) // self.page_size):
            h = hash((h, tuple(prompt[b * self.page_size : (b + 1) * self.page_size])))
            hashes.append(h)
        return hashes

    def _match(
        self, prompt: list[int], hashes: list[int], scored: bool
    ) -> tuple[list[int], int | None, int]:
        """Cached full blocks of ``prompt``, then the cached block sharing the longest
        head with the next block: ``(full pages, that page or None, common tokens)``.
        ``scored``: only blocks whose prompt scores are cached count."""
        ps = self.page_size
        limit = len(prompt) - 1  # keep one prompt token to run: its logits give a token
        full: list[int] = []
        for b, h in enumerate(hashes):
            page = self._by_hash.get(h)
            if (b + 1) * ps > limit or page is None or (scored and h not in self._scores):
                break
            full.append(page)
        b = len(full)
        want = prompt[b * ps : min((b + 1) * ps, limit)]
        best, common = None, 0
        for page, tokens in self._children.get(hashes[b - 1] if b else 0, {}).items():
            n = _common_prefix(tokens, want)
            if n > common and (not scored or self._hash_of[page] in self._scores):
                best, common = page, n
        return full, best, common

    def reserve(
        self, prompt: list[int], total_tokens: int, *, use_cache: bool, scores: bool = False
    ) -> Reservation | None:
        """Pages for a request of ``total_tokens`` positions, reusing cached prompt blocks;
        ``None`` when not enough pages are free (the request must wait).

        ``scores``: the request wants prompt log-probs; only blocks whose scores are cached
        are reused, and the last cached position is recomputed (its logits score the first
        new token).
        """
        ps = self.page_size
        needed = -(-total_tokens // ps)
        hashes = self._block_hashes(prompt) if self.prefix_caching else []
        full, partial, common = [], None, 0
        if use_cache and self.prefix_caching:
            full, partial, common = self._match(prompt, hashes, scores)
        cached = len(full) * ps + common
        start = cached - 1 if scores and cached else cached
        cached_scores = None
        if scores and start:  # positions 0 .. start, read before any page is evicted
            covering = full + ([partial] if common else [])
            parts = [self._scores[self._hash_of[p]] for p in covering]
            cached_scores = PromptScores.concat(parts)[: start + 1]
        shared = full[: start // ps]
        source = None
        if start % ps:  # the block holding `start` already has some of our positions
            source = full[start // ps] if start // ps < len(full) else partial
        if source is not None and not self._fits(needed, shared, source):
            # The copy source is one more idle page held during admission: in a pool just
            # big enough for this request it never fit, even with nothing else running,
            # and the request waited forever. Recompute that block's head instead.
            start -= start % ps
            shared, source = full[: start // ps], None
            cached_scores = (
                cached_scores[: start + 1] if cached_scores is not None and start else None
            )
        if not self._fits(needed, shared, source):
            return None
        pinned = [*shared, *([source] if source is not None else [])]
        for page in pinned:
            self._pin(page)
        fresh = [self._take() for _ in range(needed - len(shared))]
        copy = None
        if source is not None:
            copy = (source, fresh[0])
            self._unpin(source)  # the copy is dispatched before any later request's writes
            self.copies += 1
        pages = shared + fresh
        # The new full prompt blocks become findable (the prefill writing them is already
        # ordered before any later request's on the device).
        for b in range(len(shared), len(hashes)):
            if hashes[b] not in self._by_hash:
                self._register(pages[b], hashes[b], hashes[b - 1] if b else 0, prompt, b)
        tail = len(hashes)
        if self.prefix_caching and len(prompt) % ps and tail >= len(shared):
            # The last, partial prompt block can only be a copy source: decoding writes
            # its other positions, so it gets no findable hash, only a child entry.
            parent = hashes[-1] if hashes else 0
            marker = hash(("partial", parent, tuple(prompt[tail * ps :])))
            self._register(pages[tail], marker, parent, prompt, tail, findable=False)
        table = np.full(self.pages_per_slot, NULL_PAGE, np.int32)
        table[: len(pages)] = pages
        if use_cache:
            self.lookup_tokens += len(prompt)
            self.hit_tokens += start
        return Reservation(
            table=table,
            pages=pages,
            cached_tokens=start,
            copy=copy,
            hashes=hashes,
            scores=cached_scores,
        )

    def _fits(self, needed: int, shared: list[int], source: int | None) -> bool:
        """Whether ``needed`` pages, ``shared`` of them cached ones (and ``source`` pinned
        for a copy), can be had now: idle cached pages we pin are not free for the rest."""
        pinned = {*shared, *([source] if source is not None else [])}
        idle = sum(1 for p in pinned if self._refs[p] == 0)
        return needed - len(shared) <= self.free_pages() - idle

    def _register(
        self, page: int, h: int, parent: int, prompt: list[int], b: int, findable: bool = True
    ) -> None:
        ps = self.page_size
        if findable:
            self._by_hash[h] = page
        self._hash_of[page] = h
        self._parent_of[page] = parent
        self._children.setdefault(parent, {})[page] = tuple(prompt[b * ps : (b + 1) * ps])

    def store_scores(self, hashes: list[int], scores: PromptScores, known_from: int) -> None:
        """Cache the scores of every full prompt block whose positions are all known
        (positions ``>= known_from``; position 0 never needs one)."""
        ps = self.page_size
        for b, h in enumerate(hashes):
            whole = max(b * ps, 1) >= known_from and (b + 1) * ps <= len(scores.logprobs)
            if whole and h in self._by_hash and h not in self._scores:
                self._scores[h] = scores[b * ps : (b + 1) * ps]

    def _pin(self, page: int) -> None:
        if self._refs[page] == 0:
            del self._evictable[page]
        self._refs[page] += 1

    def _unpin(self, page: int) -> None:
        self._refs[page] -= 1
        if self._refs[page] == 0:
            if page in self._hash_of:
                self._evictable[page] = None
            else:
                self._free.append(page)

    def _take(self) -> int:
        if self._free:
            page = self._free.popleft()
        else:  # reuse the least recently released cached block
            page, _ = self._evictable.popitem(last=False)
            h = self._hash_of.pop(page)
            self._by_hash.pop(h, None)
            self._scores.pop(h, None)
            del self._children[self._parent_of.pop(page)][page]
        self._refs[page] = 1
        return page

    def release(self, reservation: Reservation) -> None:
        """Give a finished (or cancelled) request's pages back."""
        for page in reservation.pages:
            self._unpin(page)
        reservation.pages = []

    def hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache over prompt tokens looked up."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0
