"""`make demo`: train the reference decoder on byte-level Python source with FSDP.

The data is real text every machine has: the ``.py`` files of Python's own standard
library, read as bytes (vocabulary 256). The run uses 8 devices (fake CPU devices when
there is no accelerator) with ZeRO-3 FSDP, shows a progress bar, and reports the
validation loss before and after training.

    python -m jaxcore.demo [--steps 300] [--devices 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jaxcore demo", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices when on CPU")
    p.add_argument("--batch", type=int, default=32, help="global batch size")
    p.add_argument("--seq", type=int, default=128, help="tokens per example")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # Fake devices must be requested before JAX initialises its CPU backend (importing
    # jax does not initialise it; the first device query does).
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flag = f"--xla_force_host_platform_device_count={args.devices}"
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()

    import jax
    import optax
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    import jaxcore as jc
    from jaxcore.demo_data import stdlib_bytes, window_batches
    from jaxcore.models import Transformer, TransformerConfig, lm_loss

    console = Console()
    train, val = stdlib_bytes(val_fraction=0.05)
    console.print(
        f"[bold]jaxcore demo[/]: {len(train) / 1e6:.1f} MB of Python stdlib source as bytes, "
        f"{jax.device_count()} {jax.devices()[0].platform} devices"
    )
    cfg = TransformerConfig(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=384,
                            max_seq_len=args.seq)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), zero=3, clip_grad_norm=1.0,
                       seed=args.seed)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, min(50, args.steps // 5 + 1),
                                                  max(args.steps, 1), 3e-4)
    state = engine.prepare(lambda rngs: Transformer(cfg, rngs=rngs),
                           optax.adamw(schedule, weight_decay=0.1))
    console.print(
        f"model: {jc.models.count_params(cfg) / 1e6:.2f}M parameters; mesh "
        f"{dict(engine.mesh.shape)}; ZeRO-3 (parameters, gradients and optimizer sharded)"
    )
    step = engine.train_step(lm_loss)
    evaluate = engine.eval_step(lm_loss)
    val_batches = list(window_batches(val, args.batch, args.seq, seed=1234, count=4))

    def val_loss() -> float:
        mean = jc.MeanMetrics()
        for b in val_batches:
            mean.update(evaluate(state, b))
        return mean.compute()["loss"]

    before = val_loss()
    console.print(f"validation loss before training: {before:.3f} (ln 256 = 5.545)")
    batches = window_batches(train, args.batch, args.seq, seed=args.seed, count=args.steps)
    start, losses = time.perf_counter(), []
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                  TextColumn("{task.fields[info]}"), console=console) as progress:
        task = progress.add_task("training", total=args.steps, info="")
        for i, batch in enumerate(batches):
            state, metrics = step(state, batch)
            if i % 10 == 0 or i == args.steps - 1:
                losses.append(float(metrics["loss"]))
                tok_s = (i + 1) * args.batch * args.seq / (time.perf_counter() - start)
                progress.update(task, info=f"loss {losses[-1]:.3f}  {tok_s:,.0f} tok/s")
            progress.advance(task)
    after = val_loss()
    console.print(
        f"train loss {losses[0]:.3f} -> {losses[-1]:.3f}; validation loss {before:.3f} -> "
        f"{after:.3f} in {time.perf_counter() - start:.0f} s"
    )
    if not after < before:
        console.print("[red]the validation loss did not fall[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
