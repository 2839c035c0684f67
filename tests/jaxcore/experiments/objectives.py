"""Trial functions for the experiment tests: synthetic (pure Python) and real (tiny LM)."""

from __future__ import annotations

import math
import os
import random
import signal
import sys

BEST_X = 0.7


def asha_curve(x: float, step: int) -> float:
    """A learning curve whose ranking of ``x`` is the same at every step (best: 0.7)."""
    return (1 + (x - BEST_X) ** 2) * (1 + 10 / step)


def asha_quad(ctx) -> None:
    """Reports only where the searcher wants a validation (its rungs and the end)."""
    x = ctx.hparams["x"]
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        if ctx.validation_due(step):
            ctx.report(step, {"loss": asha_curve(x, step)})
            if ctx.should_stop():
                break


def smooth2d(x: float, y: float) -> float:
    """A smooth bowl with a tilted valley; minimum 0 at (0.5, -0.3)."""
    u, v = x - 0.5, y + 0.3
    return u**2 + 3 * v**2 + 0.8 * u * v


def bowl(ctx) -> None:
    ctx.report(1, {"loss": smooth2d(ctx.hparams["x"], ctx.hparams["y"])})


def noisy_sgd(ctx) -> None:
    """PBT's schedule-dependent problem: SGD on a noisy quadratic, 64 particles.

    A large learning rate converges fast but sits on a high noise floor (~lr * sigma^2 /
    2); a small one has a low floor but converges slowly. The best *schedule* starts
    large and decays, which a fixed learning rate cannot do and PBT can.
    """
    state = ctx.restore()
    if state is None:
        rng = random.Random(ctx.hparams.get("seed", 0))
        state = {"theta": [10.0] * 64, "rng": rng.getstate()[1][:1][0]}
    theta = state["theta"]
    rng = random.Random(state["rng"] + ctx.start_step * 7919 + ctx.trial_id)
    lr = ctx.hparams["lr"]
    step = ctx.start_step
    while step < ctx.max_steps:
        step += 1
        theta = [t - lr * (t + rng.gauss(0.0, 3.0)) for t in theta]
    loss = sum(t * t for t in theta) / len(theta)
    ctx.report(step, {"loss": loss})
    ctx.checkpoint({"theta": theta, "rng": state["rng"]}, step=step)


def ckpt_curve(ctx) -> None:
    """Checkpoints every 2 steps with a non-monotonic metric (best != latest)."""
    x = ctx.hparams["x"]
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        if step % 2 == 0:
            loss = abs(x - 0.5) + 0.3 * math.sin(step * 1.3 + 4 * x) + 1.0
            ctx.report(step, {"loss": loss})
            ctx.checkpoint({"x": x, "step": step}, step=step)
            if ctx.should_stop():
                break


def spam_metrics(ctx) -> None:
    """Concurrency: 1,000 training reports as fast as possible, then one validation."""
    for step in range(1, 1001):
        ctx.report(step, {"train_loss": 1.0 / step, "step_id": float(ctx.trial_id * 10000 + step)})
    ctx.report(1000, {"loss": float(ctx.trial_id)})


def always_fail(ctx) -> None:
    if ctx.hparams["fail"]:
        raise RuntimeError("this trial always fails")
    ctx.report(1, {"loss": 1.0})


def slow_steps(ctx) -> None:
    """For pause/kill: a trial that takes a while and honours preemption."""
    import time

    state = ctx.restore() or {"n": 0}
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        time.sleep(0.2)
        state["n"] += 1
        ctx.report(step, {"loss": 1.0 / step})
        ctx.checkpoint(state, step=step)
        if ctx.should_stop():
            return
        if ctx.preempted():
            raise SystemExit(75)


def tiny_kill_once(ctx) -> None:
    """The tiny LM; with ``kill_at`` it SIGKILLs itself once, right after that step."""
    from jaxcore.experiments import tinylm

    marker = ctx.trial_dir / "killed-once"

    def on_step(ctx, step):
        if ctx.hparams.get("kill_at") and step == ctx.hparams["kill_at"] and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)

    tinylm.train(ctx, on_step=on_step)


def every_step_quad(ctx) -> None:
    """Like `asha_quad`, but validates at every step (for Optuna's pruners)."""
    x = ctx.hparams["x"]
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        ctx.report(step, {"loss": asha_curve(x, step)})
        if ctx.should_stop():
            break


STEP_S = 0.05


def _wait_for_earlier_first_rung(ctx) -> None:
    """Report the first rung in trial-id order, so ASHA's decisions (which depend on the
    order results arrive in) are the same in every run: the ranking of a run that was
    killed and resumed can then be compared with an uninterrupted one's exactly."""
    import time

    while True:
        earlier = [t for t in ctx.store.trials(ctx.experiment_id) if t["id"] < ctx.trial_id]
        reported = {
            m["trial_id"]
            for m in ctx.store.metrics(exp_id=ctx.experiment_id, kind="validation")
            if m["step"] == ctx.milestones[0]
        }
        if all(t["id"] in reported or t["state"] == "ERRORED" for t in earlier):
            return
        time.sleep(0.05)


def _hold_once(ctx, step: int) -> None:
    """``$JAXCORE_TEST_HOLD_STEP`` = k: the first process of the experiment to train step k
    (a step it has not checkpointed) writes ``<workdir>/<experiment>/held`` and waits
    there for ever, so a test kills the loop with that trial surely mid-way."""
    hold = os.environ.get("JAXCORE_TEST_HOLD_STEP")
    if hold is None or step != int(hold):
        return
    import time

    try:
        fd = os.open(ctx.trial_dir.parent / "held", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # another trial (or this one's earlier process) held already
    os.write(fd, str(ctx.trial_id).encode())
    os.close(fd)
    while True:
        time.sleep(0.05)


def asha_ckpt(ctx) -> None:
    """`asha_quad` with a checkpoint every step and a log of what each process trained.

    ``trained.log`` gets ``train <step> <pid>`` for every step trained, ``save <step>
    <pid>`` before its checkpoint and ``ckpt <step> <pid>`` once it is recorded, so a test
    can check that a restarted trial resumed from the last checkpoint its earlier
    processes wrote (or the one being written when the process died).
    """
    import time

    x = ctx.hparams["x"]
    ctx.restore()
    log = ctx.trial_dir / "trained.log"
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        time.sleep(STEP_S)
        with open(log, "a") as f:
            f.write(f"train {step} {os.getpid()}\n")
        _hold_once(ctx, step)
        if ctx.validation_due(step):
            if step == ctx.milestones[0]:
                _wait_for_earlier_first_rung(ctx)
            ctx.report(step, {"loss": asha_curve(x, step)})
        with open(log, "a") as f:
            f.write(f"save {step} {os.getpid()}\n")
        ctx.checkpoint({"x": x}, step=step)
        with open(log, "a") as f:
            f.write(f"ckpt {step} {os.getpid()}\n")
        if ctx.should_stop():
            break
    # A pure-Python trial that reports, checkpoints and writes TensorBoard events needs
    # neither JAX nor torch in its process (each costs seconds at every trial start).
    heavy = sorted(m for m in ("jax", "torch") if m in sys.modules)
    with open(ctx.trial_dir / "heavy_imports.log", "a") as f:
        f.write(f"{os.getpid()} {','.join(heavy) or '-'}\n")


def tiny_preempted(ctx) -> None:
    """The tiny LM, preempted once (marker file): ``preempt: "<how>@<step>"``.

    ``flag@4`` sets the context's preemption flag after step 4, a checkpoint step, so
    the trial saves step 4 a second time (it did at its validation) and exits 75;
    ``sigterm@6`` sends itself a real SIGTERM, which the Checkpointer acts on in the
    save that follows (its `Preempted` exit).
    """
    how, _, at = ctx.hparams["preempt"].partition("@")
    from jaxcore.experiments import tinylm

    marker = ctx.trial_dir / "preempted-once"
    starts = ctx.trial_dir / "starts.log"

    def on_restore(ctx, state):
        with open(starts, "a") as f:
            f.write(f"{ctx.start_step}\n")

    def on_step(ctx, step):
        if step == int(at) and not marker.exists():
            marker.touch()
            if how == "flag":
                ctx._sigterm = True
            else:
                os.kill(os.getpid(), signal.SIGTERM)

    tinylm.train(ctx, on_step=on_step, on_restore=on_restore)


def tiny_record_lr(ctx) -> None:
    """The tiny LM, recording the learning rate its optimizer state holds after restore."""
    import json

    from jaxcore.experiments import tinylm

    def on_restore(ctx, state):
        with open(ctx.trial_dir / "restored_lr.jsonl", "a") as f:
            f.write(
                json.dumps(
                    {
                        "start_step": ctx.start_step,
                        "lr": tinylm.effective_lr(state),
                        "hparam": ctx.hparams["lr"],
                    }
                )
                + "\n"
            )

    tinylm.train(ctx, on_restore=on_restore)


def not_a_trial(a, b) -> None:
    """An entrypoint with the wrong signature."""
