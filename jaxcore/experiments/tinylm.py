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

# The programs of the last setup in this process, keyed by what shapes them: an inline
# search launches trials one after another in one process (PBT's rounds, a preemption's
# relaunch), and reusing the jitted steps skips the retrace, the lowering and the compile
# (or compile-cache read) of each, seconds per launch on CPU.
_PROGRAMS: dict[tuple, dict[str, Any]] = {}


def _program_key(hparams: dict[str, Any]) -> tuple:
    """What the programs depend on: shapes, the engine's seed and the schedule.

    A constant learning rate and the weight decay are not in it: with
    ``inject_hyperparams`` they live in the optimizer state, so the update program reads
    them from there (a warmup schedule's peak is a constant of the program, so it is).
    """
    warmup = int(hparams.get("warmup", 0))
    return (
        int(hparams.get("seq", 32)),
        int(hparams.get("batch", 8)),
        int(hparams.get("seed", 0)),
        warmup,
        float(hparams["lr"]) if warmup else None,
    )


def _optimizer(hparams: dict[str, Any]) -> Any:
    import optax

    warmup = int(hparams.get("warmup", 0))
    lr = float(hparams["lr"])
    schedule = optax.linear_schedule(0.0, lr, warmup) if warmup else lr
    # The learning rate and weight decay live in the optimizer state (not as constants in
    # the program), so trials that differ only in them run the same programs.
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=schedule, weight_decay=float(hparams.get("weight_decay", 0.0))
    )


def _programs(key: tuple, optimizer: Any) -> dict[str, Any]:
    """Engine, model factory, plan and jitted steps for ``key`` (the last one is kept)."""
    if key in _PROGRAMS:
        return _PROGRAMS[key]
    import jaxcore as jc
    from jaxcore.models import Transformer, TransformerConfig, lm_loss

    seq, _batch, seed, _warmup, _lr = key
    cfg = TransformerConfig.tiny(max_seq_len=seq)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), seed=seed)

    def factory(rngs: Any) -> Any:
        return Transformer(cfg, rngs=rngs)

    plan = engine.plan(factory, optimizer)
    _PROGRAMS.clear()  # one model's programs at a time: a grid over shapes stays small
    _PROGRAMS[key] = dict(
        engine=engine,
        cfg=cfg,
        factory=factory,
        plan=plan,
        train_step=plan.train_step(lm_loss),
        eval_step=plan.eval_step(lm_loss),
        loss_fn=lm_loss,
    )
    return _PROGRAMS[key]


def setup(hparams: dict[str, Any]) -> dict[str, Any]:
    """Engine, model factory, this trial's optimizer, plan, jitted steps and loaders.

    The plan and steps are shared with the previous call of this process when the
    programs are the same (`_program_key`); a state the shared plan initialises carries
    that call's optimizer values until `TrialContext.hparams_into` puts this trial's in
    (`train` does). The optimizer and the loaders are always this call's.
    """
    import grain

    import jaxcore as jc

    optimizer = _optimizer(hparams)
    env = dict(_programs(_program_key(hparams), optimizer), optimizer=optimizer)
    seq, batch, seed = (int(hparams.get(k, d)) for k, d in (("seq", 32), ("batch", 8), ("seed", 0)))
    docs = grain.MapDataset.source(jc.stdlib_source(max_files=int(hparams.get("files", 200))))
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
    if ctx.start_step == 0:  # a fresh state from a shared plan: this trial's values
        state = ctx.hparams_into(state, env["optimizer"])
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
