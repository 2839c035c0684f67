"""A real trial: the tiny reference decoder on byte-level stdlib source.

Used by the example configs, the search-efficiency benchmark and the tests that need real
training (fault tolerance, the registry). Hyperparameters: ``lr`` (AdamW), and optionally
``batch``, ``seq``, ``warmup`` (steps), ``seed``, ``files`` (how many stdlib files; the
last 16 are held out for the validation loss), ``report_every`` (validate every k steps
besides the searcher's milestones). Every validation reports ``loss`` (the
training batch) and ``val_loss`` (4 fixed held-out batches), then checkpoints.
"""

from __future__ import annotations

from typing import Any

VAL_FILES = 16

# The programs of the last setup in this process, keyed by every hyperparameter that
# shapes them: an inline search relaunches a trial in the same process (a preemption, a
# PBT parent continuing), and reusing its jitted steps skips the retrace, the lowering
# and the compile (or compile-cache read) of each (seconds per launch on CPU).
_PROGRAMS: dict[tuple, dict[str, Any]] = {}


def _program_key(hparams: dict[str, Any]) -> tuple:
    return (
        int(hparams.get("seq", 32)),
        int(hparams.get("batch", 8)),
        int(hparams.get("seed", 0)),
        int(hparams.get("files", 200)),
        int(hparams.get("warmup", 0)),
        float(hparams["lr"]),
        float(hparams.get("weight_decay", 0.0)),
    )


def _programs(key: tuple) -> dict[str, Any]:
    """Engine, model factory, optimizer, plan and jitted steps for ``key`` (one kept)."""
    if key in _PROGRAMS:
        return _PROGRAMS[key]
    import optax

    import jaxcore as jc
    from jaxcore.models import Transformer, TransformerConfig, lm_loss

    seq, _batch, seed, _files, warmup, lr, weight_decay = key
    cfg = TransformerConfig.tiny(max_seq_len=seq)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), seed=seed)
    schedule = optax.linear_schedule(0.0, lr, warmup) if warmup else lr
    # The learning rate and weight decay live in the optimizer state (not as constants in
    # the program), so trials that differ only in them compile to the same XLA program
    # and a persistent compilation cache serves every trial after the first.
    optimizer = optax.inject_hyperparams(optax.adamw)(
        learning_rate=schedule, weight_decay=weight_decay
    )

    def factory(rngs: Any) -> Any:
        return Transformer(cfg, rngs=rngs)

    plan = engine.plan(factory, optimizer)
    _PROGRAMS.clear()  # one model's programs at a time: a grid over shapes stays small
    _PROGRAMS[key] = dict(
        engine=engine,
        cfg=cfg,
        optimizer=optimizer,
        factory=factory,
        plan=plan,
        train_step=plan.train_step(lm_loss),
        eval_step=plan.eval_step(lm_loss),
        loss_fn=lm_loss,
    )
    return _PROGRAMS[key]


def setup(hparams: dict[str, Any]) -> dict[str, Any]:
    """Engine, model factory, optimizer, plan, jitted steps and loaders for ``hparams``.

    The programs are shared with the previous call of this process when every
    hyperparameter that shapes them is the same; the loaders are always new.
    """
    import grain

    import jaxcore as jc

    key = _program_key(hparams)
    seq, batch, seed, files = key[:4]
    env = dict(_programs(key))
    docs = grain.MapDataset.source(jc.stdlib_source(max_files=files))
    train_docs, val_docs = docs[:-VAL_FILES], docs[-VAL_FILES:]
    env["loader"] = jc.Loader(
        train_docs,
        jc.InputConfig(global_batch_size=batch, seq_len=seq, seed=seed, prefetch=2, num_threads=1),
        env["engine"].batch_sharding,
    )
    return dict(env, val_docs=val_docs, batch=batch, seq=seq)


def val_batches(env: dict[str, Any], n: int = 4) -> list[Any]:
    import jaxcore as jc

    loader = jc.Loader(
        env["val_docs"],
        jc.InputConfig(global_batch_size=env["batch"], seq_len=env["seq"], shuffle=False),
        env["engine"].batch_sharding,
    )
    out = [next(loader) for _ in range(n)]
    loader.close()
    return out


def evaluate(env: dict[str, Any], state: Any, batches: list[Any]) -> float:
    import jaxcore as jc

    evaluate = env["eval_step"]
    mean = jc.MeanMetrics()
    for b in batches:
        mean.update(evaluate(state, b))
    return float(mean.compute()["loss"])


def effective_lr(state: Any) -> float:
    """The learning rate the optimizer state holds (what the next step uses)."""
    from jaxcore.experiments.trial_context import inject_states

    return float(inject_states(state.opt_state)[0].hyperparams["learning_rate"])


def train(ctx: Any, *, on_step: Any = None, on_restore: Any = None) -> None:
    """The trial function: train, validate at the searcher's steps, checkpoint, stop.

    ``on_step(ctx, step)`` / ``on_restore(ctx, state)``: test hooks.
    """
    import dataclasses

    env = setup(ctx.hparams)
    ctx.model_config = dataclasses.asdict(env["cfg"])  # registered versions carry it
    # The restored optimizer state gets this trial's lr and weight decay (hparams_into):
    # a PBT child trains with its own hyperparameters, not its parent's.
    state, loader = ctx.restore(env["plan"], optimizer=env["optimizer"], loader=env["loader"])
    if on_restore is not None:
        on_restore(ctx, state)
    step_fn = env["train_step"]
    held_out = val_batches(env)
    step = ctx.start_step
    try:
        while step < ctx.max_steps:
            step += 1
            state, metrics = step_fn(state, next(loader))
            if on_step is not None:
                on_step(ctx, step)
            every = int(ctx.hparams.get("report_every", 0))
            if ctx.validation_due(step) or (every and step % every == 0):
                ctx.report(
                    step,
                    {"loss": float(metrics["loss"]), "val_loss": evaluate(env, state, held_out)},
                )
                if ctx.should_stop() and step < ctx.max_steps:
                    break  # cut by the searcher: nobody resumes it, skip the checkpoint
                ctx.checkpoint(state, loader, step=step)
            if ctx.should_stop():
                break
            if ctx.preempted():
                ctx.checkpoint(state, loader, step=step)
                raise SystemExit(75)  # jaxcore.PREEMPTION_EXIT_CODE: requeue me
    finally:
        loader.close()
