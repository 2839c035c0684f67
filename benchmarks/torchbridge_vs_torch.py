"""Training steps/s of one small Llama-style GPT written in PyTorch, four ways, one CPU device.

(a) PyTorch eager, (b) ``torch.compile``, (c) the same torch module through torchbridge on
jaxcore's engine, (d) ``jaxcore.models.Transformer`` with the same dims (native JAX). Same
batch, float32, AdamW. Variants take turns over several repeats; medians are reported, so
the ratios are what counts on a shared, noisy machine (see shared PERF-NOTES.md).

    python benchmarks/torchbridge_vs_torch.py [--quick] [--no-compile]

Writes benchmarks/results/torchbridge_vs_torch.json with bridge_over_eager and
bridge_over_native (targets >= 0.9 and >= 0.9, issue 20).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
import torch
from rich.console import Console
from rich.table import Table

import jaxcore as jc
import torchbridge
from jaxcore.models import Transformer, TransformerConfig, lm_loss

sys.path.insert(0, str(Path(__file__).parent))
from torch_llama import TorchLlama
from torch_llama import lm_loss as torch_loss


def torch_step_fn(model, opt):
    def step(tokens):
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(model, tokens)
        loss.backward()
        opt.step()
        return loss

    return step


def bridge_loss(model, batch, rng):
    tokens = batch["tokens"]
    logits = model(tokens[:, :-1], rng=rng)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return loss, {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, < 1 minute")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--out", default="benchmarks/results/torchbridge_vs_torch.json")
    args = parser.parse_args()
    console = Console()

    if args.quick:
        cfg = TransformerConfig(
            vocab_size=256,
            d_model=128,
            n_layers=2,
            n_heads=4,
            n_kv_heads=4,
            d_ff=256,
            max_seq_len=128,
        )
        seq, batch, steps, repeats = 128, 8, 5, 2
    else:
        cfg = TransformerConfig(
            vocab_size=256,
            d_model=256,
            n_layers=4,
            n_heads=4,
            n_kv_heads=4,
            d_ff=704,
            max_seq_len=256,
        )
        seq, batch, steps, repeats = 256, 8, 10, 3
    use_compile = not (args.quick or args.no_compile)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1))
    t_tokens = torch.from_numpy(tokens).long()
    j_tokens = {"tokens": tokens.astype(np.int32)}

    torch.manual_seed(0)
    base = TorchLlama(cfg)
    runners = {}

    eager = copy.deepcopy(base)
    runners["torch eager"] = torch_step_fn(eager, torch.optim.AdamW(eager.parameters(), 3e-4))
    if use_compile:
        comp = copy.deepcopy(base)
        step_c = torch.compile(torch_step_fn(comp, torch.optim.AdamW(comp.parameters(), 3e-4)))
        runners["torch.compile"] = step_c

    # Compile torch's step before torchax is imported: torchax renames torch's PrivateUse1
    # backend to "jax", after which dynamo fails to trace ("not linked with support for jax
    # devices"). Once compiled, the graph keeps running.
    for fn in runners.values():
        fn(t_tokens)

    device = jax.devices()[:1]
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=device)
    bridged = copy.deepcopy(base)
    box = {
        "bridge": torchbridge.prepare(
            engine, bridged, torch.optim.AdamW(bridged.parameters(), 3e-4)
        )
    }
    b_step = engine.train_step(bridge_loss)
    j_batch = engine.shard_batch(j_tokens)

    def run_bridge(_):
        box["bridge"], m = b_step(box["bridge"], j_batch)
        return m["loss"]

    runners["torchbridge"] = run_bridge

    n_engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=device)
    box["native"] = n_engine.prepare(
        lambda rngs: Transformer(cfg, rngs=rngs), optax.adamw(3e-4, weight_decay=0.01)
    )
    n_step = n_engine.train_step(lm_loss)
    n_batch = n_engine.shard_batch(j_tokens)

    def run_native(_):
        box["native"], m = n_step(box["native"], n_batch)
        return m["loss"]

    runners["jaxcore native"] = run_native

    def block(x):
        return jax.block_until_ready(x) if isinstance(x, jax.Array) else float(x.detach())

    with console.status("warming up (compiling)"):
        for fn in runners.values():
            for _ in range(2):
                block(fn(t_tokens))
    times: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(repeats):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            out = None
            for _ in range(steps):
                out = fn(t_tokens)
            block(out)
            times[name].append(steps / (time.perf_counter() - t0))
        console.log(f"repeat {r + 1}/{repeats}")
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "config": {
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "d_ff": cfg.d_ff,
            "vocab": cfg.vocab_size,
            "seq": seq,
            "batch": batch,
            "steps": steps,
            "repeats": repeats,
            "quick": args.quick,
            "devices": 1,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            "load_average_1m": os.getloadavg()[0],
        },
        "steps_per_s": med,
        "tokens_per_s": {k: v * batch * seq for k, v in med.items()},
        "bridge_over_eager": med["torchbridge"] / med["torch eager"],
        "bridge_over_native": med["torchbridge"] / med["jaxcore native"],
    }
    if "torch.compile" in med:
        result["bridge_over_compile"] = med["torchbridge"] / med["torch.compile"]

    table = Table(title=f"GPT d={cfg.d_model} L={cfg.n_layers} seq={seq} batch={batch}, 1 CPU")
    table.add_column("variant")
    table.add_column("steps/s", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("torchbridge / this", justify="right")
    for k, v in med.items():
        table.add_row(k, f"{v:.3f}", f"{v * batch * seq:,.0f}", f"{med['torchbridge'] / v:.2f}")
    console.print(table)
    console.print(
        f"bridge_over_eager={result['bridge_over_eager']:.2f} (target 0.9), "
        f"bridge_over_native={result['bridge_over_native']:.2f} (target 0.9)"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    assert math.isfinite(result["bridge_over_eager"])


if __name__ == "__main__":
    main()
