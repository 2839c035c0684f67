"""Helper for the multi-process pipeline test: run under `jaxcore launch -n 2`.

With ``pipeline=2`` and no ``data`` axis the mesh's cross-process split is on the
pipeline: each process holds one stage and every row of the batch. Each layout in
`LAYOUTS` trains 2 steps, every process passing ``engine.local_rows``'s rows of the same
global batches; then each process passes "its own half" (the pattern that is right when
the batch is cut over the processes), which must fail with a `BatchError`. Per-row values
gathered with the engine count each row once. Writes OUT/rank{i}.json.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from jaxcore.distributed import initialize

initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxcore as jc  # noqa: E402
from jaxcore.gather import EvalGatherer, gather  # noqa: E402
from jaxcore.models import lm_loss  # noqa: E402
from tests.jaxcore.helpers import factory, make_batch  # noqa: E402

BATCH = 16
LAYOUTS = {
    "pipeline2_fsdp2_tensor2": dict(
        parallel=jc.ParallelConfig(pipeline=2, fsdp=2, tensor=2), microbatches=2, zero=0
    ),
    "pipeline2_fsdp4_zero3": dict(
        parallel=jc.ParallelConfig(pipeline=2, fsdp=4), microbatches=4, zero=3
    ),
}


def engine_for(name: str) -> jc.Engine:
    return jc.Engine(**LAYOUTS[name])


def train(engine: jc.Engine, slicer) -> list[float]:
    state = engine.prepare(factory, optax.adamw(1e-2))
    step = engine.train_step(lm_loss)
    losses = []
    for seed in range(2):
        batch = make_batch(BATCH, seed)
        state, metrics = step(state, engine.shard_batch(slicer(batch)))
        losses.append(float(metrics["loss"]))
    return losses


if __name__ == "__main__":
    out = Path(sys.argv[1])
    rank, nproc = jax.process_index(), jax.process_count()
    result = {"losses": {}, "rows": {}, "block": {}}
    for name in LAYOUTS:
        engine = engine_for(name)
        lo, hi = engine.local_rows(BATCH)
        result["rows"][name] = [lo, hi]
        result["block"][name] = list(engine.process_batch_block)
        result["losses"][name] = train(
            engine, lambda b, lo=lo, hi=hi: {k: v[lo:hi] for k, v in b.items()}
        )
    # Global arrays given to a fresh engine's first shard_batch (and so to the agreement
    # check) pass through unchanged.
    lo, hi = engine.local_rows(BATCH)
    sharded = engine.shard_batch({k: v[lo:hi] for k, v in make_batch(BATCH, 0).items()})
    again = engine_for("pipeline2_fsdp4_zero3").shard_batch(sharded)
    result["global_passes_through"] = again["tokens"] is sharded["tokens"]
    # Per-row eval values of the rows this process passed (every row, on both ranks).
    ids = np.arange(lo, hi)
    result["gathered"] = gather({"id": ids}, engine=engine)["id"].tolist()
    result["gathered_valid"] = EvalGatherer(total=BATCH - 3, engine=engine)(ids).tolist()
    half = BATCH // nproc
    try:
        train(
            engine_for("pipeline2_fsdp2_tensor2"),
            lambda b: {k: v[rank * half : (rank + 1) * half] for k, v in b.items()},
        )
        result["halves"] = "trained"
    except jc.BatchError as e:
        result["halves"] = str(e)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    print(f"rank {rank} done")
