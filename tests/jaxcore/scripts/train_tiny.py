"""Helper for the launch tests: the same script runs alone or under `jaxcore launch`.

Modes:
  train OUT   train the tiny model 3 steps (each process feeds its rows of the same global
              batches), gather an uneven eval set, write OUT/rank{i}.json
  hang OUT    join the run, write OUT/pid{i}, then tick a cross-process barrier forever
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from jaxcore.distributed import initialize

settings = initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import jaxcore as jc  # noqa: E402
from jaxcore.gather import EvalGatherer, gather  # noqa: E402
from jaxcore.models import lm_loss  # noqa: E402
from tests.jaxcore.helpers import factory, make_batch  # noqa: E402

mode, out = sys.argv[1], Path(sys.argv[2])
rank, nproc = jax.process_index(), jax.process_count()

if mode == "hang":
    (out / f"pid{rank}").write_text(str(os.getpid()))
    while True:
        multihost_utils.sync_global_devices("tick")
        time.sleep(0.2)

engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), zero=3)
state = engine.prepare(factory, optax.sgd(0.1, momentum=0.9))
step = engine.train_step(lm_loss)
losses = []
for seed in range(3):
    batch = make_batch(16, seed)
    rows = 16 // nproc
    local = {k: v[rank * rows : (rank + 1) * rows] for k, v in batch.items()}
    state, metrics = step(state, engine.shard_batch(local))
    losses.append(float(metrics["loss"]))

# An eval set of 13 rows in global batches of 8 (4 per process): the last batch is padded
# by repeating row 12; the gatherer must drop the padding.
ids = np.arange(13)
gatherer = EvalGatherer(total=13)
seen = []
for start in (0, 8):
    global_rows = np.concatenate([ids, np.full(3, 12)])[start : start + 8]
    local_rows = global_rows.reshape(nproc, -1)[rank]
    seen.append(gatherer({"id": local_rows, "sq": local_rows**2}))
gathered = {k: np.concatenate([s[k] for s in seen]).tolist() for k in ("id", "sq")}
ranks = gather(np.int32(rank)).tolist()

result = {
    "losses": losses,
    "gathered": gathered,
    "ranks": ranks,
    "process_count": nproc,
    "local_devices": jax.local_device_count(),
    "devices": jax.device_count(),
    "source": settings.source,
    "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
}
(out / f"rank{rank}.json").write_text(json.dumps(result))
print(f"rank {rank} losses {losses}")
