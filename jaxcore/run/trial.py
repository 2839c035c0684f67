"""The trial `jaxcore run`'s train and search phases run: the reference decoder on a
dataset version's token shards, FSDP over every device, with lineage on every checkpoint.

The experiment's constant hyperparameters say everything the trial needs (``tokens``:
the tokens ``index.json``; ``lineage``: a JSON file written by the data phases; the
model shape; ``batch``, ``seq``, ``zero``...), so the same trial runs under the train
phase's ``single`` searcher and the search phase's ASHA, and restarts from its latest
checkpoint when an interrupted phase is run again. Every validation reports ``loss`` and
``val_loss``; the end of the trial reports ``tokens_per_s`` and ``mfu``.

Under several processes, process 0's run of it announces the trial and each validation's
stop decision (`jaxcore.run.hosts`); the other processes run this same function with a
`jaxcore.run.follower.FollowerContext`, so every collective lines up.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jaxcore as jc

VAL_FRACTION = 0.1  # at most this share of the documents is held out
VAL_BATCHES = 2

# Test seam: called after every training step with (ctx, step); fault-injection tests
# replace it to interrupt a phase at an exact step.
after_step: Any = None


def held_out_count(docs: Any, row_tokens: int, want_tokens: int) -> int:
    """How many of the last documents to hold out: at least one row of ``row_tokens``,
    then up to ``want_tokens`` (a batch) within `VAL_FRACTION` of the documents; one
    document always stays for training."""
    limit = max(1, int(len(docs) * VAL_FRACTION))
    held, tokens = 0, 0
    while held < len(docs) - 1 and (tokens < row_tokens or (held < limit and tokens < want_tokens)):
        held += 1
        tokens += len(docs[len(docs) - held])
    return held


def model_config(hp: dict[str, Any]) -> Any:
    from jaxcore.models import TransformerConfig

    return TransformerConfig(
        vocab_size=int(hp["vocab_size"]),
        d_model=int(hp["d_model"]),
        n_layers=int(hp["n_layers"]),
        n_heads=int(hp["n_heads"]),
        n_kv_heads=int(hp["n_kv_heads"]),
        d_ff=int(hp["d_ff"]),
        max_seq_len=int(hp["seq"]),
    )


def build_engine(hp: dict) -> jc.Engine:
    """ZeRO-``zero`` FSDP over every device, with the run's remat, precision, accumulation
    and layer loop."""
    import jaxcore as jc

    return jc.Engine(
        parallel=jc.ParallelConfig(fsdp=-1),
        zero=int(hp.get("zero", 3)),
        remat=str(hp.get("remat", "none")),
        precision=str(hp.get("precision", "fp32")),
        grad_accum=int(hp.get("grad_accum", 1)),
        unroll_layers=hp.get("unroll_layers"),
        clip_grad_norm=1.0,
    )


def optimizer(hp: dict[str, Any]) -> Any:
    import optax

    lr, warmup = float(hp["lr"]), int(hp.get("warmup", 0))
    schedule = optax.linear_schedule(0.0, lr, warmup) if warmup else lr
    # Hyperparameters in the optimizer state: trials differing only in lr share one
    # program (and the restored state takes this trial's lr, see TrialContext.restore).
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=schedule, weight_decay=float(hp.get("weight_decay", 0.0))
    )


def train(ctx: Any) -> None:
    """Train to ``ctx.max_steps``, validating and checkpointing where the searcher asks."""
    import jaxcore as jc
    from data.tokens import open_dataset
    from jaxcore.models import Transformer, lm_loss, training_flops_per_token
    from jaxcore.profiling import StepMeter
    from jaxcore.progress import TrainProgress
    from jaxcore.run.hosts import current

    hosts = current()
    if hosts.is_leader:
        announce(hosts, ctx)
    hp = ctx.hparams
    cfg = model_config(hp)
    batch, seq, seed = int(hp["batch"]), int(hp["seq"]), int(hp.get("seed", 0))
    ctx.model_config = dataclasses.asdict(cfg)
    ctx.lineage = json.loads(pathlib.Path(hp["lineage"]).read_text())
    index = pathlib.Path(hp["tokens"])
    ctx.tokenizer_path = str(index.parent / "tokenizer.json")
    docs = open_dataset(index)
    held = held_out_count(docs, seq + 1, batch * (seq + 1))
    train_docs, val_docs = docs[:-held], docs[-held:]
    eos = json.loads(index.read_text())["eos_id"]
    engine = build_engine(hp)
    input_cfg = jc.InputConfig(global_batch_size=batch, seq_len=seq, seed=seed, pad_id=eos)
    loader = jc.Loader(train_docs, input_cfg, engine.batch_sharding)
    factory = lambda rngs: Transformer(cfg, rngs=rngs)
    state, loader = ctx.restore(engine, factory, optimizer(hp), loader)
    step_fn = engine.train_step(lm_loss)
    evaluate = engine.eval_step(lm_loss)
    val_cfg = dataclasses.replace(input_cfg, shuffle=False)
    val_loader = jc.Loader(val_docs, val_cfg, engine.batch_sharding)
    held_out = [next(val_loader) for _ in range(VAL_BATCHES)]
    val_loader.close()
    every = int(hp.get("checkpoint_every", 0))
    peak = float(hp["peak_flops"]) if hp.get("peak_flops") else None
    meter = StepMeter(
        tokens_per_step=batch * seq,
        flops_per_step=training_flops_per_token(cfg, seq) * batch * seq,
        peak_flops=peak,
        every=1,  # the progress bar shows the loss every step anyway
    )
    step = ctx.start_step
    # Own metric kinds: the store keeps one row per (trial, step, kind), and these share
    # steps with the training and validation reports.
    if step:
        _record(ctx, step, {"resumed_from_step": step}, kind="resume")
    log_every = int(hp.get("log_every", 10))
    progress = TrainProgress(total_steps=ctx.max_steps, description=f"trial {ctx.trial_id}")
    stop = False  # the searcher decides at validations only (the inline loop's turns)
    try:
        progress.__enter__()  # closed in the finally below, with the loader
        progress.update(step)
        while step < ctx.max_steps and not stop:
            step += 1
            state, metrics = step_fn(state, next(loader))
            stats = meter.update(metrics["loss"])
            progress.update(step, loss=metrics["loss"] if stats else None, stats=stats)
            if after_step is not None:
                after_step(ctx, step)
            if step % log_every == 0:
                ctx.report(step, {"loss": float(metrics["loss"])})
            if ctx.validation_due(step) or (every and step % every == 0):
                mean = jc.MeanMetrics()
                for b in held_out:
                    mean.update(evaluate(state, b))
                ctx.report(
                    step, {"loss": float(metrics["loss"]), "val_loss": mean.compute()["loss"]}
                )
                meter.reset_clock()  # validation and the save are not training time
                # Process 0's decision on every process: they all save, or all stop.
                stop = hosts.agree(lambda: ctx.should_stop(), "stop")
                if stop and step < ctx.max_steps:
                    break  # cut by ASHA: nobody resumes it, skip the checkpoint
                ctx.checkpoint(state, loader, step=step)
                meter.reset_clock()
        stats = meter.stats()
        if stats is not None:
            speed = {"tokens_per_s": stats.tokens_per_s}
            if stats.mfu is not None:
                speed["mfu"] = stats.mfu
            _record(ctx, step, speed, kind="speed")
    finally:
        progress.close()
        loader.close()


def announce(hosts: Any, ctx: Any) -> None:
    """Tell the other processes (`jaxcore.run.follower`) which trial to train with us."""
    hosts.publish(
        "trial",
        spec={
            "trial_id": ctx.trial_id,
            "hparams": ctx.hparams,
            "max_steps": ctx.max_steps,
            "milestones": list(ctx.milestones),
            "validation_period": ctx.validation_period,
            "checkpoint_dir": str(ctx.checkpoint_dir),
        },
    )
    hosts.wait_followers(f"at the start of trial {ctx.trial_id}")


def _record(ctx: Any, step: int, values: dict[str, float], *, kind: str) -> None:
    """A metric of its own kind in the store (process 0 only: followers have none)."""
    if ctx.store is not None:
        ctx.store.add_metrics(ctx.trial_id, step, values, kind=kind)
