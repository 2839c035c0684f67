"""Dedup: planted duplicates found, boilerplate not merged, equal to brute-force Jaccard."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from data.config import DedupConfig
from data.dedup import DedupItem, UnionFind, find_duplicates
from data.minhash import MinHasher, estimate_jaccard, shingle_set


def _items(
    texts: list[str],
    licenses: list[str] | None = None,
    stars: list[int] | None = None,
    cfg: DedupConfig | None = None,
) -> list[DedupItem]:
    import hashlib

    cfg = cfg or DedupConfig()
    sigs, has = MinHasher(cfg.num_perm, cfg.shingle_size, cfg.seed).signatures(texts)
    return [
        DedupItem(
            (0, i),
            hashlib.sha256(t.encode()).hexdigest(),
            sigs[i] if has[i] else None,
            (licenses or ["permissive"] * len(texts))[i],
            (stars or [0] * len(texts))[i],
            "",
        )
        for i, t in enumerate(texts)
    ]


def _corpus(site_packages: Path) -> tuple[list[str], dict[str, int]]:
    names = [
        "yaml/constructor.py",
        "yaml/representer.py",
        "yaml/scanner.py",
        "idna/core.py",
        "idna/codec.py",
        "rich/table.py",
        "rich/progress.py",
        "pygments/lexer.py",
    ]
    base = [(site_packages / n).read_text() for n in names]
    texts = list(base)
    idx = {}
    # Planted near duplicates of base[0..3]:
    texts.append(re.sub(r"\bmapping\b", "table", base[0]))  # renamed variable
    idx["renamed"] = len(texts) - 1
    texts.append(base[1].replace("    ", "\t").replace(", ", " , "))  # reformatted
    idx["reformatted"] = len(texts) - 1
    texts.append(base[2].replace("# ", "# NOTE (changed comment) ", 3))  # changed comment
    idx["comment"] = len(texts) - 1
    texts.append(base[3])  # exact copy
    idx["exact"] = len(texts) - 1
    # Distinct files sharing a long license header: must not merge.
    header = "".join(
        f"# Licensed under the Apache License, Version 2.0 line {i} of the header\n"
        for i in range(12)
    )
    texts.append(header + base[4][: len(base[4]) // 3])
    texts.append(header + base[5][: len(base[5]) // 3])
    idx["boiler_a"], idx["boiler_b"] = len(texts) - 2, len(texts) - 1
    return texts, idx


def _components(n: int, pairs: list[tuple[int, int]]) -> set[frozenset[int]]:
    uf = UnionFind()
    for i in range(n):
        uf.find(i)
    for a, b in pairs:
        uf.union(a, b)
    groups: dict[object, set[int]] = {}
    for i in range(n):
        groups.setdefault(uf.find(i), set()).add(i)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def test_planted_duplicates_and_brute_force(site_packages: Path) -> None:
    texts, idx = _corpus(site_packages)
    cfg = DedupConfig()
    removed, counters = find_duplicates(_items(texts), cfg)
    assert removed[(0, idx["exact"])] == ("exact_duplicate", (0, 3))
    for k, orig in (("renamed", 0), ("reformatted", 1), ("comment", 2)):
        assert removed[(0, idx[k])] == ("near_duplicate", (0, orig)), k
    assert (0, idx["boiler_a"]) not in removed and (0, idx["boiler_b"]) not in removed
    # Brute force: true Jaccard of the shingle sets, same threshold, connected components.
    sets = [shingle_set(t) for t in texts]
    pairs = [
        (i, j)
        for i in range(len(texts))
        for j in range(i + 1, len(texts))
        if len(sets[i] | sets[j])
        and len(sets[i] & sets[j]) / len(sets[i] | sets[j]) >= cfg.threshold
    ]
    truth = _components(len(texts), pairs)
    found_pairs = [(k[1], surv[1]) for k, (_, surv) in removed.items()]
    assert _components(len(texts), found_pairs) == truth
    assert counters["exact_clusters"] == 1 and counters["near_clusters"] == 3


def test_survivor_license_then_stars(site_packages: Path) -> None:
    text = (site_packages / "yaml/constructor.py").read_text()
    variants = [text, text.replace("mapping", "mp"), text.replace("mapping", "mpg")]
    removed, _ = find_duplicates(
        _items(variants, ["non_permissive", "no_license", "no_license"], [100, 1, 5]), DedupConfig()
    )
    survivors = {s for _, s in removed.values()}
    assert survivors == {(0, 2)}  # permissive-ish before stars; then more stars wins


def test_signature_accuracy_matches_theory(site_packages: Path) -> None:
    files = sorted((site_packages / "rich").glob("*.py"))[:40]
    texts = [f.read_text() for f in files]
    rng = np.random.default_rng(0)
    hasher = MinHasher()
    errors = []
    for i in range(len(texts) - 1):
        a = texts[i]
        b = (
            a[: int(len(a) * rng.uniform(0.2, 1.0))]
            + texts[i + 1][: int(len(texts[i + 1]) * rng.uniform(0, 0.8))]
        )
        sa, sb = shingle_set(a), shingle_set(b)
        if len(sa) < 50 or len(sb) < 50:
            continue
        sig, _ = hasher.signatures([a, b])
        errors.append(estimate_jaccard(sig[0], sig[1]) - len(sa & sb) / len(sa | sb))
    errors = np.array(errors)
    # 256 permutations: standard error sqrt(J(1-J)/256) <= 0.031.
    assert len(errors) >= 20
    assert np.sqrt(np.mean(errors**2)) < 0.035 and abs(errors.mean()) < 0.015
