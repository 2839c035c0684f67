"""Exact and near (MinHash/LSH) deduplication.

Per shard, :class:`SignatureStep` hashes every kept file (SHA-256 of its final content)
and computes its MinHash signature (:mod:`data.minhash`). Globally, :func:`find_duplicates`
groups exact duplicates by hash, indexes one signature per exact group in a datasketch
``MinHashLSH`` (StarCoder2: 25 bands x 10 rows, threshold 0.7; other thresholds get
datasketch's own bands x rows; any datasketch storage backend for a shared index),
verifies candidate pairs by estimated Jaccard, joins them with union-find, and keeps one
survivor per cluster: permissive license first, then the configured repository priority
(stars, recency), then a stable order.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from data.config import DedupConfig
from data.minhash import MinHasher
from data.records import FileRecord, StageStats
from data.step import BatchStep

LICENSE_RANK = {"permissive": 0, "no_license": 1, "non_permissive": 2}


class SignatureStep(BatchStep):
    """Content hash and MinHash signature of each kept file (vectorised per batch)."""

    name = "signature"
    batch_size = 256

    def __init__(self, config: DedupConfig) -> None:
        self.config = config
        self.hasher = MinHasher(config.num_perm, config.shingle_size, config.seed)

    def process_batch(self, records: list[FileRecord], stats: StageStats) -> None:
        for r in records:
            r.sha256 = hashlib.sha256(r.content.encode("utf-8", "surrogatepass")).hexdigest()
        if not self.config.near:
            return
        sigs, has = self.hasher.signatures([r.content for r in records])
        for r, s, h in zip(records, sigs, has, strict=True):
            r.signature = s if h else None
        stats.count("signatures", int(has.sum()))


@dataclass(frozen=True, slots=True)
class DedupItem:
    """What the global phase needs to know about one kept file (no content)."""

    key: tuple[int, int]
    sha256: str
    signature: np.ndarray | None
    license_type: str
    stars: int
    commit_date: str
    opted_out: bool = False
    """An opted-out file: never kept, but every copy and near copy of it is removed."""


class UnionFind:
    """Disjoint sets with path halving and union by size."""

    def __init__(self) -> None:
        self.parent: dict[object, object] = {}
        self.size: dict[object, int] = {}

    def find(self, x: object) -> object:
        parent = self.parent
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: object, b: object) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size.get(ra, 1) < self.size.get(rb, 1):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] = self.size.get(ra, 1) + self.size.get(rb, 1)


def _epoch(date: str) -> float:
    if not date:
        return 0.0
    try:
        return _dt.datetime.fromisoformat(date).timestamp()
    except ValueError:
        return 0.0


def survivor_order(item: DedupItem, priority: tuple[str, ...]) -> tuple:
    """Sort key: smaller is preferred (license, then priority fields, then position)."""
    key: list = [LICENSE_RANK.get(item.license_type, 3)]
    for p in priority:
        key.append(-item.stars if p == "stars" else -_epoch(item.commit_date))
    key.append(item.key)
    return tuple(key)


def find_duplicates(
    items: Iterable[DedupItem], config: DedupConfig
) -> tuple[dict[tuple[int, int], tuple[str, tuple[int, int]]], dict[str, int]]:
    """Map each removed file's key to (reason, survivor key); plus counters."""
    items = sorted(items, key=lambda i: i.key)
    removed: dict[tuple[int, int], tuple[str, tuple[int, int]]] = {}
    counters = {
        "exact_clusters": 0,
        "near_clusters": 0,
        "lsh_candidates": 0,
        "rejected_candidates": 0,
    }
    order = lambda it: survivor_order(it, config.priority)
    reps: list[DedupItem] = items
    if config.exact:
        groups: dict[str, list[DedupItem]] = {}
        for it in items:
            groups.setdefault(it.sha256, []).append(it)
        reps = []
        for members in groups.values():
            outs = [m for m in members if m.opted_out]
            if outs:  # a copy of opted-out code stays out, whoever holds it
                reps.append(outs[0])
                for m in members:
                    if not m.opted_out:
                        removed[m.key] = ("optout_duplicate", outs[0].key)
                continue
            members.sort(key=order)
            reps.append(members[0])
            if len(members) > 1:
                counters["exact_clusters"] += 1
            for m in members[1:]:
                removed[m.key] = ("exact_duplicate", members[0].key)
        reps.sort(key=lambda i: i.key)
    if not config.near:
        return removed, counters
    # Imported here: datasketch imports scipy.integrate (~2 CPU-s), and only this global
    # phase needs it; shard workers (Ray tasks, process pools) import this module too.
    from datasketch import LeanMinHash, MinHashLSH

    with_sig = [it for it in reps if it.signature is not None]
    lsh = MinHashLSH(
        threshold=config.threshold,
        num_perm=config.num_perm,
        params=(config.bands, config.rows),
        storage_config=dict(config.lsh_storage) or None,
    )
    by_name: dict[str, DedupItem] = {}
    uf = UnionFind()
    for it in with_sig:
        name = f"{it.key[0]}:{it.key[1]}"
        by_name[name] = it
        # Same family as datasketch 2.0's "affine32" scheme: (a*h + b) mod 2**32, a odd.
        mh = LeanMinHash(seed=config.seed, hashvalues=it.signature, scheme="affine32")
        for cand in sorted(lsh.query(mh)):
            counters["lsh_candidates"] += 1
            other = by_name[cand]
            if config.verify and float(np.mean(other.signature == it.signature)) < config.threshold:
                counters["rejected_candidates"] += 1
                continue
            uf.union(other.key, it.key)
        lsh.insert(name, mh, check_duplication=False)
    clusters: dict[object, list[DedupItem]] = {}
    for it in with_sig:
        if it.key in uf.parent:
            clusters.setdefault(uf.find(it.key), []).append(it)
    for members in clusters.values():
        if len(members) < 2:
            continue
        counters["near_clusters"] += 1
        outs = [m for m in members if m.opted_out]
        if outs:  # a fork or near copy of an opted-out repository's file
            counters["optout_clusters"] = counters.get("optout_clusters", 0) + 1
            for m in members:
                if not m.opted_out:
                    removed[m.key] = ("optout_near_duplicate", outs[0].key)
            continue
        members.sort(key=order)
        for m in members[1:]:
            removed[m.key] = ("near_duplicate", members[0].key)
    # Exact duplicates of a near-duplicate loser point at the cluster's survivor (and
    # share its fate when that cluster held opted-out code).
    for k, (reason, surv) in list(removed.items()):
        if reason == "exact_duplicate" and surv in removed:
            why = removed[surv][0]
            removed[k] = (why if why.startswith("optout") else reason, removed[surv][1])
    return removed, counters
