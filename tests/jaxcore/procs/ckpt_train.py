"""A checkpointing run that dies where it is told to; alone or under `jaxcore launch`.

Usage: python tests/jaxcore/procs/ckpt_train.py DIR OUT --steps N [--die-at POINT:K]
[--die-rank R] [--step-sleep S]

Trains the one-layer model of `corpus.py` on its seeded bytes (fsdp over all 8 devices:
1 x 8 or 2 x 4) and saves every 2 steps (async). Process 0 appends to the JSON-lines file
OUT ``{"step", "loss"}`` per step and, once every rank has restored, one
``{"start": [resumed step per rank], "verified": [...]}`` per start (``verified``: that
rank's manifest check passed on the step it restored). Each process writes
``DIR.pid<rank>`` at start. ``--die-at`` SIGKILLs process R (default 0) at an exact point
(K counts from this start):

  startup:0        after joining the run, before anything is read
  verify:K         while checking the K-th file of the manifest
  restore:0        after the state is read, before the loader is positioned
  train:K          after the K-th train step, before its save
  saved:K          once the K-th save is finalized (a step to resume from exists)
  save-inflight:K  right after the K-th save was started (async write in flight)
  save-manifest:K  half-way through writing the K-th save's manifest (process 0)
  save-rename:K    with the K-th save's manifest written, before Orbax's rename (process 0)

A start killed at startup, verify or restore (on any rank) writes no start record: the
record follows an exchange of the ranks' views that a dead rank never joins.
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from jaxcore.distributed import initialize

initialize()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import jaxcore as jc  # noqa: E402
import jaxcore.checkpoint  # noqa: E402
from jaxcore.checkpointing import atomic, manifest, positions  # noqa: E402
from jaxcore.models import Transformer, lm_loss  # noqa: E402
from tests.jaxcore.procs.corpus import CFG, corpus  # noqa: E402


def cache_on_every_rank() -> None:
    """Let every rank write its programs to the persistent compilation cache, so no
    restarted rank recompiles. JAX writes from process 0 only (`compiler._cache_write`:
    against write contention on shared filesystems), and on CPU each rank's programs have
    keys of their own, so rank 1 missed on every restart (seen: no hit, 11 s compiling the
    step while rank 0 waited). The cache here is a local folder and the keys differ per
    rank, so each rank reads back only what it compiled itself."""
    from jax._src import compiler, distributed

    if jax.process_index() == 0 or not jax.config.jax_compilation_cache_dir:
        return
    write = compiler._cache_write

    def write_own(*args, **kwargs):
        state = distributed.global_state
        rank, state.process_id = state.process_id, 0  # read by `_cache_write` only
        try:
            write(*args, **kwargs)
        finally:
            state.process_id = rank

    compiler._cache_write = write_own


def watch_verification() -> set:
    """The step directories this process verified clean (wraps the manifest check)."""
    clean, agree = set(), jaxcore.checkpoint.agree_on_damage

    def checked(root, verify):
        damage = agree(root, verify)
        if damage is None:
            clean.add(str(root))
        return damage

    jaxcore.checkpoint.agree_on_damage = checked
    return clean


def die(where: str) -> None:
    print(f"DYING at {where}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def counter(k: int, where: str):
    """A function that SIGKILLs this process on its K-th call."""
    calls = [0]

    def tick(*_args) -> None:
        calls[0] += 1
        if calls[0] == k:
            die(f"{where}:{k}")

    return tick


def inject(point: str, k: int) -> dict:
    """Install the fault; returns hooks the training loop calls."""
    hooks = {}
    if point == "startup":
        die("startup:0")
    elif point == "verify":
        tick, check = counter(k, "verify"), manifest.check_file
        manifest.check_file = lambda *a, **kw: (tick(), check(*a, **kw))[1]
        hooks["started"] = lambda: die(f"verify:{k} (there was nothing to verify)")
    elif point == "restore":
        positions.apply = lambda *a, **kw: die("restore:0")
        hooks["started"] = lambda: die("restore:0 (there was nothing to restore)")
    elif point == "train":
        hooks["trained"] = counter(k, "train")
    elif point == "saved":
        hooks["saved"] = counter(k, "saved")
        hooks["wait"] = True
    elif point == "save-inflight":
        hooks["saved"] = counter(k, "save-inflight")
    elif point == "save-manifest":
        tick, table = counter(k, "save-manifest"), manifest.file_table

        def half_written(root, step):
            text = json.dumps({"step": step, "files": table(root)})
            (root / f"{manifest.MANIFEST}.tmp").write_text(text[: len(text) // 2])
            tick()
            manifest.write_manifest(root, step)

        atomic.write_manifest = half_written
    elif point == "save-rename":
        atomic.before_rename = counter(k, "save-rename")
    else:
        raise SystemExit(f"unknown fault point {point!r}")
    return hooks


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--die-at", default=None)
    p.add_argument("--die-rank", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    a = p.parse_args()
    rank = jax.process_index()
    cache_on_every_rank()
    Path(f"{a.dir}.pid{rank}").write_text(str(os.getpid()))
    hooks = {}
    if a.die_at and rank == a.die_rank:
        point, k = a.die_at.split(":")
        hooks = inject(point, int(k))
    nothing = lambda: None
    clean = watch_verification()

    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), seed=0)
    loader = jc.Loader(
        corpus(),
        jc.InputConfig(global_batch_size=8, seq_len=16, seed=1),
        engine.batch_sharding,
    )
    config = jc.CheckpointConfig(directory=a.dir, save_every_steps=2, keep_last=2)
    out = open(a.out, "a") if rank == 0 else None  # noqa: SIM115
    with jc.Checkpointer(config, engine=engine, loader=loader) as ckpt:
        state, _ = ckpt.restore_or_init(
            engine, lambda rngs: Transformer(CFG, rngs=rngs), optax.adamw(1e-3)
        )
        hooks.get("started", nothing)()
        start = ckpt.resumed_step
        verified = start is not None and str(ckpt.resumed_from) in clean
        # Every rank's view, gathered: this is also the exchange a dead rank never joins,
        # so a start killed before it on either rank leaves no record.
        mine = np.array([-1 if start is None else start, verified], np.int64)
        seen = multihost_utils.process_allgather(mine) if jax.process_count() > 1 else [mine]
        if out is not None:
            starts = [None if s < 0 else int(s) for s, _ in seen]
            record = {"start": starts, "verified": [bool(v) for _, v in seen]}
            out.write(json.dumps(record) + "\n")
            out.flush()
        step_fn = engine.train_step(lm_loss)
        step = int(state.step)
        while step < a.steps:
            state, metrics = step_fn(state, next(loader))
            step += 1
            loss = float(metrics["loss"])
            if out is not None:
                out.write(json.dumps({"step": step, "loss": loss}) + "\n")
                out.flush()
            print(f"step {step}", flush=True)
            hooks.get("trained", nothing)()
            if ckpt.save(state, step=step):
                if hooks.get("wait"):
                    ckpt.wait()
                hooks.get("saved", nothing)()
            time.sleep(a.step_sleep)
    loader.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
