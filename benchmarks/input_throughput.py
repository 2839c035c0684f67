"""Loader batches/s against the tiny model's training steps/s on the same batches.

The loader packs the standard library's .py bytes (`jaxcore.input.stdlib_source`) into
global batches on 8 CPU devices (fsdp=8); the training side runs the tiny Transformer's
jitted step on those batches. ``input_over_train`` = loader batches/s over train
steps/s (target >= 10: input is never the bottleneck). Writes
benchmarks/results/input_throughput.json.

    python benchmarks/input_throughput.py [--quick]
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import json
import time
from pathlib import Path

import jax
import optax

import jaxcore as jc
from jaxcore.input import InputConfig, Loader, stdlib_source
from jaxcore.models import Transformer, TransformerConfig, lm_loss


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    steps = 20 if a.quick else 60
    batch, seq = 32, 128
    cfg = TransformerConfig.tiny(max_seq_len=seq)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    source = stdlib_source()
    icfg = InputConfig(global_batch_size=batch, seq_len=seq, seed=0)

    loader = Loader(source, icfg, engine.batch_sharding)
    next(loader)  # start Grain's threads
    t0 = time.perf_counter()
    for _ in range(steps * 5):
        b = next(loader)
    jax.block_until_ready(b)
    input_rate = steps * 5 / (time.perf_counter() - t0)
    loader.close()

    state = engine.prepare(lambda rngs: Transformer(cfg, rngs=rngs), optax.adamw(1e-3))
    step = engine.train_step(lm_loss)
    loader = Loader(source, icfg, engine.batch_sharding)
    batches = [next(loader) for _ in range(steps + 1)]
    loader.close()
    state, m = step(state, batches[0])  # compile
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for b in batches[1:]:
        state, m = step(state, b)
    jax.block_until_ready(m)
    train_rate = steps / (time.perf_counter() - t0)

    ratio = input_rate / train_rate
    print(f"batch {batch} x {seq + 1} tokens, packed stdlib bytes, 8 CPU devices (fsdp=8)")
    print(f"{'side':22} {'batches/s':>10}")
    print(f"{'jaxcore Loader':22} {input_rate:10.1f}")
    print(f"{'tiny model train step':22} {train_rate:10.1f}")
    print(f"input_over_train = {ratio:.1f} (target >= 10)")
    out = {
        "global_batch_size": batch,
        "seq_len": seq,
        "quick": a.quick,
        "loader_batches_per_s": round(input_rate, 2),
        "train_steps_per_s": round(train_rate, 2),
        "input_over_train": round(ratio, 2),
    }
    name = "input_throughput_quick.json" if a.quick else "input_throughput.json"
    path = Path(__file__).parent / "results" / name
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
