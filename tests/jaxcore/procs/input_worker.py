"""One of two processes (4 CPU devices each, gloo) reading batches through `Loader`.

Usage: python -m tests.jaxcore.procs.input_worker PORT PROCESS_ID OUT FIRST LAST.
Writes, for global steps FIRST..LAST-1, the global batch each process sees (gathered
from the global jax.Array) and its own local rows, as JSON.
"""

# ruff: noqa: E402  (jax must be configured before the rest is imported)
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import json

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

port, pid, out, first, last = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:6])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import numpy as np
from jax.experimental import multihost_utils

import jaxcore as jc
from jaxcore.input import Loader
from tests.jaxcore.procs.input_data import CONFIG, documents

engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
loader = Loader(documents(), CONFIG, engine.batch_sharding)
loader.seek(first)
result = {"local": [], "global": []}
for _ in range(first, last):
    batch = next(loader)
    local = np.concatenate(
        [
            np.asarray(s.data)
            for s in sorted(batch["tokens"].addressable_shards, key=lambda s: s.index[0].start)
        ]
    )
    result["local"].append(local.tolist())
    result["global"].append(multihost_utils.process_allgather(batch["tokens"], tiled=True).tolist())
with open(out, "w") as f:
    json.dump(result, f)
jax.distributed.shutdown()
