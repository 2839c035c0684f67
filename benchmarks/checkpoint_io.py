"""Checkpoint save/restore throughput, sync vs async, and how long an async save blocks.

A ~100M-parameter state (params + AdamW moments, float32) on 8 CPU devices under
fsdp=8. "Blocked" is the time `Checkpointer.save` holds the training loop; for async
saves the rest of the write happens in Orbax's background thread. Writes
benchmarks/results/checkpoint_io.json with ``async_block_over_sync`` (target < 0.2).

    python benchmarks/checkpoint_io.py [--quick]
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import optax

import jaxcore as jc
from jaxcore.checkpoint import CheckpointConfig, Checkpointer
from jaxcore.models import Transformer, TransformerConfig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="~25M parameters, 1 repeat")
    a = p.parse_args()
    if a.quick:
        cfg = TransformerConfig(
            d_model=512, n_layers=6, n_heads=8, n_kv_heads=8, d_ff=2048, vocab_size=8192
        )
        repeats = 1
    else:
        cfg = TransformerConfig(
            d_model=768, n_layers=8, n_heads=12, n_kv_heads=12, d_ff=3072, vocab_size=16384
        )
        repeats = 3
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    factory = lambda rngs: Transformer(cfg, rngs=rngs)
    tx = optax.adamw(1e-4)
    state = engine.prepare(factory, tx)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    nbytes = sum(
        x.nbytes
        for x in jax.tree.leaves(state)
        if hasattr(x, "nbytes") and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    )
    mb = nbytes / 1e6
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    rows = {"sync": [], "async": []}
    try:
        for r in range(repeats):
            for mode in ("sync", "async"):
                d = root / f"{mode}{r}"
                ckpt = Checkpointer(
                    CheckpointConfig(directory=d, async_save=mode == "async", announce=False)
                )
                ckpt.engine = engine
                t0 = time.perf_counter()
                ckpt.save(state, force=True)
                blocked = time.perf_counter() - t0
                ckpt.wait()
                total = time.perf_counter() - t0
                ckpt.close()
                ckpt = Checkpointer(CheckpointConfig(directory=d, announce=False))
                t1 = time.perf_counter()
                restored, _ = ckpt.restore_or_init(engine, factory, tx)
                jax.block_until_ready(restored)
                restore = time.perf_counter() - t1
                ckpt.close()
                del restored
                rows[mode].append((blocked, total, restore))
                shutil.rmtree(d)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {m: [statistics.median(v[i] for v in rows[m]) for i in range(3)] for m in rows}
    ratio = med["async"][0] / med["sync"][0]
    print(
        f"state: {n_params / 1e6:.1f}M params, {mb:.0f} MB (params + AdamW), 8 CPU devices, fsdp=8"
    )
    head = ("mode", "blocked s", "save s", "save MB/s", "restore s", "restore MB/s")
    print("{:6} {:>10} {:>8} {:>10} {:>10} {:>13}".format(*head))
    for m, (b, t, r) in med.items():
        print(f"{m:6} {b:10.2f} {t:8.2f} {mb / t:10.0f} {r:10.2f} {mb / r:13.0f}")
    print(f"async_block_over_sync = {ratio:.3f} (target < 0.2)")
    out = {
        "params_millions": round(n_params / 1e6, 1),
        "state_mb": round(mb, 1),
        "quick": a.quick,
        "repeats": repeats,
        **{
            f"{m}_{k}": round(v, 3)
            for m in med
            for k, v in zip(("blocked_s", "save_s", "restore_s"), med[m], strict=True)
        },
        "sync_save_mb_s": round(mb / med["sync"][1], 1),
        "async_save_mb_s": round(mb / med["async"][1], 1),
        "restore_mb_s": round(mb / med["async"][2], 1),
        "async_block_over_sync": round(ratio, 4),
    }
    name = "checkpoint_io_quick.json" if a.quick else "checkpoint_io.json"
    path = Path(__file__).parent / "results" / name
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
