"""A tiny training run that checkpoints; the resume tests start, kill and restart it.

Usage: python -m tests.jaxcore.procs.train DIR OUT --steps N [--pause-after K]
[--slow-finalize-step S]. Each step appends ``{"step", "loss"}`` to the JSON-lines file
OUT (flushed, so a killed run leaves what it did) and prints ``step N``.
``--pause-after K`` prints PAUSED once step K's save is on disk (only started, with
``--slow-finalize-step``) and idles until killed, or, on SIGTERM, goes on to the next
step, whose save is the final one.
``--slow-finalize-step S`` holds Orbax's final rename of step S for a minute (fault
injection: a save that is still in flight when the kill comes).
"""

import os

# -O0 as in tests/conftest.py: these programs are tiny, compiling is what takes time.
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse
import asyncio
import json
import sys
import time

import optax

import jaxcore as jc
from jaxcore.checkpoint import CheckpointConfig, Checkpointer
from jaxcore.input import InputConfig, Loader
from jaxcore.models import Transformer, lm_loss
from tests.jaxcore.procs.corpus import CFG, corpus


def slow_finalize(step: int) -> None:
    from orbax.checkpoint._src.path import atomicity

    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self, *args, **kwargs):
        if os.path.basename(str(self.get_final())) == str(step):
            print(f"HOLDING {step}", flush=True)
            await asyncio.sleep(60)
        return await original(self, *args, **kwargs)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--pause-after", type=int, default=None)
    p.add_argument("--slow-finalize-step", type=int, default=None)
    a = p.parse_args()
    if a.slow_finalize_step is not None:
        slow_finalize(a.slow_finalize_step)

    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), seed=0)
    loader = Loader(
        corpus(),
        InputConfig(global_batch_size=8, seq_len=16, seed=1),
        engine.batch_sharding,
    )
    ckpt = Checkpointer(CheckpointConfig(directory=a.dir, save_every_steps=a.save_every))
    state, loader = ckpt.restore_or_init(
        engine, lambda rngs: Transformer(CFG, rngs=rngs), optax.adamw(1e-3), loader
    )
    step_fn = engine.train_step(lm_loss)
    with open(a.out, "a") as out:
        step = int(state.step)
        while step < a.steps:
            state, metrics = step_fn(state, next(loader))
            step += 1
            out.write(json.dumps({"step": step, "loss": float(metrics["loss"])}) + "\n")
            out.flush()
            print(f"step {step}", flush=True)
            ckpt.save(state, loader, step=step)
            if step == a.pause_after:
                if a.slow_finalize_step is None:
                    ckpt.wait()  # the save of this step is complete when the kill comes
                print("PAUSED", flush=True)
                while not ckpt.preemption_requested:
                    time.sleep(0.05)
    ckpt.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
