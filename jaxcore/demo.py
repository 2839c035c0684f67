"""`make demo`: train the reference decoder on byte-level Python source with FSDP.

The data is real text every machine has: the ``.py`` files of Python's own standard
library, read as bytes (vocabulary 256). The run uses 8 devices (fake CPU devices when
there is no accelerator) with ZeRO-3 FSDP, shows a progress bar, and reports the
validation loss before and after training.

Checkpoints go to ``demo_runs/checkpoints`` every 50 steps; running the demo again (or
after a crash) resumes from the last one and trains ``--steps`` more.

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
    p.add_argument("--val-files", type=int, default=64, help="files held out for validation")
    p.add_argument(
        "--run-dir",
        default="demo_runs/checkpoints",
        help="checkpoints go here; a second run resumes from them",
    )
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps={args.steps}: train at least 1 step")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # Fake devices must be requested before JAX initialises its CPU backend (importing
    # jax does not initialise it; the first device query does).
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flag = f"--xla_force_host_platform_device_count={args.devices}"
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()

    import grain
    import jax
    import optax
    from rich.console import Console

    import jaxcore as jc
    from jaxcore.models import Transformer, TransformerConfig, lm_loss, training_flops_per_token
    from jaxcore.profiling import StepMeter, measure_matmul_peak
    from jaxcore.progress import TrainProgress

    console = Console()
    source = jc.stdlib_source()
    docs = grain.MapDataset.source(source)
    train_docs, val_docs = docs[: -args.val_files], docs[-args.val_files :]
    console.print(
        f"[bold]jaxcore demo[/]: {source.lengths.sum() / 1e6:.1f} MB of Python stdlib source "
        f"as bytes ({len(source)} files, the last {args.val_files} held out), "
        f"{jax.device_count()} {jax.devices()[0].platform} devices"
    )
    cfg = TransformerConfig(
        d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=384, max_seq_len=args.seq
    )
    engine = jc.Engine(
        parallel=jc.ParallelConfig(fsdp=-1), zero=3, clip_grad_norm=1.0, seed=args.seed
    )
    # A fixed schedule (not tied to --steps) so that resumed runs continue the same one.
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 30, 300, 3e-4)
    optimizer = optax.adamw(schedule, weight_decay=0.1)
    loader = jc.Loader(
        train_docs,
        jc.InputConfig(global_batch_size=args.batch, seq_len=args.seq, seed=args.seed),
        engine.batch_sharding,
    )
    ckpt = jc.Checkpointer(
        jc.CheckpointConfig(directory=args.run_dir, save_every_steps=50, keep_last=2)
    )
    state, loader = ckpt.restore_or_init(
        engine, lambda rngs: Transformer(cfg, rngs=rngs), optimizer, loader
    )
    first = int(state.step)
    console.print(
        f"model: {jc.models.count_params(cfg) / 1e6:.2f}M parameters; mesh "
        f"{dict(engine.mesh.shape)}; ZeRO-3 (parameters, gradients and optimizer sharded); "
        + (f"resumed at step {first}" if first else "starting at step 0")
        + f"; checkpoints in {args.run_dir}/"
    )
    step = engine.train_step(lm_loss)
    evaluate = engine.eval_step(lm_loss)
    val_loader = jc.Loader(
        val_docs,
        jc.InputConfig(global_batch_size=args.batch, seq_len=args.seq, shuffle=False),
        engine.batch_sharding,
    )
    val_batches = [next(val_loader) for _ in range(4)]
    val_loader.close()

    def val_loss() -> float:
        mean = jc.MeanMetrics()
        for b in val_batches:
            mean.update(evaluate(state, b))
        return mean.compute()["loss"]

    before = val_loss()
    console.print(f"validation loss at step {first}: {before:.3f} (ln 256 = 5.545)")
    start, losses = time.perf_counter(), []
    tokens = args.batch * args.seq
    # On CPU the fake devices share the machine's cores: the peak is the machine's.
    meter = StepMeter(
        tokens_per_step=tokens,
        every=10,
        flops_per_step=training_flops_per_token(cfg, args.seq) * tokens,
        peak_flops=measure_matmul_peak(),
    )
    with TrainProgress(total_steps=first + args.steps, console=console) as progress:
        progress.update(first)
        for n in range(first + 1, first + args.steps + 1):
            state, metrics = step(state, next(loader))
            # Passing the step (a host counter) keeps the loop free of device syncs.
            ckpt.save(
                state,
                loader,
                metrics={"loss": metrics["loss"]},
                step=n,
                force=n == first + args.steps,
            )
            stats = meter.update(metrics["loss"])
            progress.update(n, loss=metrics["loss"] if stats else None, stats=stats)
            losses.append(metrics["loss"])
    ckpt.close()
    loader.close()
    after = val_loss()
    train0, train1 = float(losses[0]), float(losses[-1])
    console.print(
        f"steps {first} -> {int(state.step)}: train loss {train0:.3f} -> {train1:.3f}; "
        f"validation loss {before:.3f} -> {after:.3f} in {time.perf_counter() - start:.0f} s. "
        "Run `make demo` again to resume from the last checkpoint."
    )
    if not after < before:
        console.print("[red]the validation loss did not fall[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
