"""Training steps/s of one small Llama-style GPT written in PyTorch, four ways, one CPU device.

(a) PyTorch eager, (b) ``torch.compile``, (c) the same torch module through torchbridge on
jaxcore's engine, (d) ``jaxcore.models.Transformer`` with the same dims (native JAX). Same
batch, float32, AdamW, the same initial weights (seed 0). Each variant runs in its own
process (`_common.StepWorker`: programs sharing a process disturb each other, and
torchax's import breaks dynamo's tracing for the rest of a process); the processes take
turns, in an order rotated every round, and medians are reported, so the ratios are what
counts on a shared, noisy machine (see shared PERF-NOTES.md).

    python benchmarks/torchbridge_vs_torch.py [--quick] [--no-compile]

Writes benchmarks/results/torchbridge_vs_torch.json with bridge_over_eager and
bridge_over_native (targets >= 0.9 and >= 0.9, issue 20).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

VARIANTS = ("torch eager", "torch.compile", "torchbridge", "jaxcore native")


def model_setup(quick: bool):
    """The model's dims, sequence length and batch size (``--quick``: a smaller model)."""
    from jaxcore.models import TransformerConfig

    d, layers, d_ff, seq = (128, 2, 256, 128) if quick else (256, 4, 704, 256)
    cfg = TransformerConfig(
        vocab_size=256,
        d_model=d,
        n_layers=layers,
        n_heads=4,
        n_kv_heads=4,
        d_ff=d_ff,
        max_seq_len=seq,
    )
    return cfg, seq, 8


def torch_step_fn(model, opt):
    from torch_llama import lm_loss as torch_loss

    def step(tokens):
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(model, tokens)
        loss.backward()
        opt.step()
        return loss

    return step


def bridge_loss(model, batch, rng):
    import optax

    tokens = batch["tokens"]
    logits = model(tokens[:, :-1], rng=rng)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return loss, {}


def serve_variant(variant: str, quick: bool) -> None:
    """The worker: one variant's training step, one step per request."""
    import numpy as np
    import torch
    from _common import serve_steps
    from torch_llama import TorchLlama

    cfg, seq, batch = model_setup(quick)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1))
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    model = TorchLlama(cfg)  # every variant starts from these weights

    if variant in ("torch eager", "torch.compile"):
        step = torch_step_fn(model, torch.optim.AdamW(model.parameters(), 3e-4))
        if variant == "torch.compile":
            step = torch.compile(step)
        t_tokens = torch.from_numpy(tokens).long()

        def run():
            step(t_tokens)

    else:
        import jax
        import optax

        import jaxcore as jc
        import torchbridge
        from jaxcore.models import Transformer, lm_loss

        engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
        if variant == "torchbridge":
            opt = torch.optim.AdamW(model.parameters(), 3e-4)
            state = torchbridge.prepare(engine, model, opt)
            jstep = engine.train_step(bridge_loss)
        else:
            tx = optax.adamw(3e-4, weight_decay=0.01)
            state = engine.prepare(lambda rngs: Transformer(cfg, rngs=rngs), tx)
            jstep = engine.train_step(lm_loss)
        batch_arrays = engine.shard_batch({"tokens": tokens.astype(np.int32)})

        def run():
            nonlocal state
            state, m = jstep(state, batch_arrays)
            m["loss"].block_until_ready()

    serve_steps(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, < 1 minute")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--rounds", type=int, default=None, help="turns per variant")
    parser.add_argument("--out", default="benchmarks/results/torchbridge_vs_torch.json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from jaxcore.runtime import ensure_malloc_tuning

    ensure_malloc_tuning()  # the workers inherit it
    os.environ.pop("XLA_FLAGS", None)  # 1 real CPU device, no fake ones
    if args.worker:
        serve_variant(args.worker, args.quick)
        return
    from _common import run_in_turns
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cfg, seq, batch = model_setup(args.quick)
    # Quick steps take ~30 ms: more of them, so one hiccup does not move the median.
    rounds, steps = (args.rounds or 5, 5) if args.quick else (args.rounds or 5, 3)
    use_compile = not (args.quick or args.no_compile)
    variants = [v for v in VARIANTS if use_compile or v != "torch.compile"]
    argv = [__file__, *(["--quick"] if args.quick else [])]
    programs = [(v, [*argv, "--worker", v]) for v in variants]
    turns = run_in_turns(programs, rounds, steps)
    samples, load_start, load_end = turns.samples, turns.load_start, turns.load_end
    med = {k: 1 / statistics.median(v["wall"]) for k, v in samples.items()}
    cpu = {k: statistics.median(v["cpu"]) for k, v in samples.items()}
    result = {
        "config": {
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "d_ff": cfg.d_ff,
            "vocab": cfg.vocab_size,
            "seq": seq,
            "batch": batch,
            "steps_per_turn": steps,
            "rounds": rounds,
            "quick": args.quick,
            "devices": 1,
            "method": "a process per variant, turns in rotated order",
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            "load_average_start": load_start,
            "load_average_end": load_end,
        },
        "steps_per_s": med,
        "tokens_per_s": {k: v * batch * seq for k, v in med.items()},
        "cpu_s_per_step": cpu,
        "first_call_s": {k: v["first_call_s"] for k, v in turns.info.items()},
        "bridge_over_eager": med["torchbridge"] / med["torch eager"],
        "bridge_over_native": med["torchbridge"] / med["jaxcore native"],
    }
    if "torch.compile" in med:
        result["bridge_over_compile"] = med["torchbridge"] / med["torch.compile"]

    table = Table(
        title=f"GPT d={cfg.d_model} L={cfg.n_layers} seq={seq} batch={batch}, 1 CPU, "
        f"load average {load_start[0]:.1f} -> {load_end[0]:.1f}"
    )
    for col in ("variant", "steps/s", "tok/s", "CPU s/step", "torchbridge / this"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for k, v in med.items():
        table.add_row(
            k,
            f"{v:.3f}",
            f"{v * batch * seq:,.0f}",
            f"{cpu[k]:.3f}",
            f"{med['torchbridge'] / v:.2f}",
        )
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
