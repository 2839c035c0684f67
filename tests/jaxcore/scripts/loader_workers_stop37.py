"""`jc.Loader` with Grain worker processes in a plain script: prints, as JSON, a hash of
each of 6 batches with ``worker_count=0`` and ``2``, of a stream's batches 4-6 after a
resume with 2 workers, and what a resume with none does."""

import hashlib
import json

import grain
import numpy as np

import jaxcore as jc

DOCS = [np.arange(i, i + 5 + i % 7, dtype=np.int32) for i in range(40)]


def _hash(batch: dict) -> str:
    return hashlib.sha1(batch["tokens"].tobytes() + batch["mask"].tobytes()).hexdigest()


def _source(kind: str):
    return DOCS if kind == "random_access" else grain.MapDataset.source(DOCS).to_iter_dataset()


def _loader(kind: str, workers: int) -> jc.Loader:
    config = jc.InputConfig(global_batch_size=2, seq_len=8, seed=3, worker_count=workers)
    return jc.Loader(_source(kind), config)


def _run(kind: str) -> dict:
    without = _loader(kind, 0)
    hashes = [_hash(next(without)) for _ in range(6)]
    without.close()
    first = _loader(kind, 2)
    with_workers = [_hash(next(first)) for _ in range(3)]
    position = json.loads(json.dumps(first.get_state()))  # as a checkpoint holds it
    with_workers += [_hash(next(first)) for _ in range(3)]
    first.close()
    out = {"without": hashes, "with_workers": with_workers}
    try:
        _loader(kind, 0).set_state(position)
        out["without_workers"] = "resumed"
    except jc.ConfigError as e:
        out["without_workers"] = str(e)
    if kind == "stream":  # a random-access position is the step, resumed by any count
        second = _loader(kind, 2)
        second.set_state(position)
        out["resumed"] = [_hash(next(second)) for _ in range(3)]
        second.close()
    return out


def main() -> None:
    print(json.dumps({kind: _run(kind) for kind in ("random_access", "stream")}), flush=True)


if __name__ == "__main__":
    main()
