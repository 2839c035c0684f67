"""MinHash signature throughput: data.minhash (NumPy) vs datasketch.MinHash.update_batch.

Same .py files of the installed packages, same tokenisation (lower-cased 5-word shingles),
256 permutations, one core, in one run. Writes benchmarks/results/dedup_throughput.json.
Usage: python benchmarks/dedup_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path

import numpy as np
from datasketch import MinHash

from data.minhash import _WORD_RE, MinHasher, shingle_set


def load(n: int) -> list[str]:
    site = Path(sysconfig.get_paths()["purelib"])
    files = sorted(site.rglob("*.py"))[:n]
    return [f.read_text(errors="replace") for f in files]


def ours(texts: list[str], batch: int = 256) -> float:
    h = MinHasher(256, 5, 42)
    t = time.perf_counter()
    for i in range(0, len(texts), batch):
        h.signatures(texts[i : i + batch])
    return time.perf_counter() - t


def datasketch(texts: list[str]) -> float:
    t = time.perf_counter()
    for text in texts:
        w = _WORD_RE.findall(text.lower())
        shingles = {" ".join(w[i : i + 5]).encode() for i in range(len(w) - 4)}
        m = MinHash(num_perm=256, seed=42)
        m.update_batch(list(shingles))
    return time.perf_counter() - t


def jaccard_error(texts: list[str], pairs: int = 50) -> dict[str, float]:
    """Mean absolute error of both estimators against the true Jaccard on mixed pairs."""
    rng = np.random.default_rng(0)
    h = MinHasher(256, 5, 42)
    e_ours, e_ds = [], []
    for i in range(min(pairs, len(texts) - 1)):
        a = texts[i]
        b = (
            a[: int(len(a) * rng.uniform(0.1, 1))]
            + texts[i + 1][: int(len(texts[i + 1]) * rng.uniform(0, 1))]
        )
        sa, sb = shingle_set(a), shingle_set(b)
        if len(sa) < 20 or len(sb) < 20:
            continue
        true = len(sa & sb) / len(sa | sb)
        sig, _ = h.signatures([a, b])
        e_ours.append(abs(float(np.mean(sig[0] == sig[1])) - true))
        ma, mb = MinHash(num_perm=256, seed=42), MinHash(num_perm=256, seed=42)
        ma.update_batch([" ".join(s).encode() for s in sa])
        mb.update_batch([" ".join(s).encode() for s in sb])
        e_ds.append(abs(ma.jaccard(mb) - true))
    return {
        "ours_mae": float(np.mean(e_ours)),
        "datasketch_mae": float(np.mean(e_ds)),
        "pairs": len(e_ours),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="500 files, 1 repeat (< 1 minute)")
    args = ap.parse_args()
    n, repeats = (500, 1) if args.quick else (3000, 3)
    texts = load(n)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    t_ours, t_ds = [], []
    for _ in range(repeats):  # alternate so both see the same machine noise
        t_ours.append(ours(texts))
        t_ds.append(datasketch(texts))
    ours_mbs, ds_mbs = mb / float(np.median(t_ours)), mb / float(np.median(t_ds))
    err = jaccard_error(texts)
    result = {
        "files": len(texts),
        "mb": round(mb, 2),
        "repeats": repeats,
        "ours_mb_per_s_per_core": round(ours_mbs, 2),
        "datasketch_mb_per_s_per_core": round(ds_mbs, 2),
        "ratio": round(ours_mbs / ds_mbs, 2),
        "target_ratio": 3.0,
        "jaccard_mae": {k: round(v, 4) if isinstance(v, float) else v for k, v in err.items()},
    }
    print(f"{'implementation':<34}{'MB/s/core':>10}")
    print(f"{'data.minhash (NumPy, vectorised)':<34}{ours_mbs:>10.2f}")
    print(f"{'datasketch update_batch':<34}{ds_mbs:>10.2f}")
    print(
        f"ratio {result['ratio']:.2f} (target >= 3); Jaccard MAE ours {err['ours_mae']:.4f} vs "
        f"datasketch {err['datasketch_mae']:.4f} on {err['pairs']} pairs; {mb:.1f} MB, "
        f"{len(texts)} files"
    )
    out = Path(__file__).parent / "results" / "dedup_throughput.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
