"""What a process other than 0 does in a multi-process `jaxcore run`: follow the leader.

It runs no host-local phase and never opens the store; it waits for process 0's events
(`jaxcore.run.hosts`) and, in the train and search phases, runs each announced trial with
`FollowerContext`: the trial function of `jaxcore.run.trial`, the same restore and
checkpoint calls (Orbax saves each process's shards), the leader's stop decisions. What
it trained goes to ``<run_dir>/processes/process-<i>.json`` (per trial: the steps and the
losses it computed), to check a multi-host run against process 0's store.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from jaxcore.run.hosts import Hosts, check_probe

COLLECTIVE_PHASES = ("train", "search")  # every process runs these; the rest: process 0


class FollowerContext:
    """The `TrialContext` calls `jaxcore.run.trial.train` makes, on a follower.

    Reports are not stored here (process 0 records them); the stop decisions come from
    process 0 through `Hosts.agree`.
    """

    store = None

    def __init__(self, spec: dict[str, Any]):
        self.trial_id: int = int(spec["trial_id"])
        self.hparams: dict[str, Any] = dict(spec["hparams"])
        self.max_steps: int = int(spec["max_steps"])
        self.milestones: tuple[int, ...] = tuple(spec["milestones"])
        self.validation_period: int | None = spec["validation_period"]
        self.checkpoint_dir = pathlib.Path(spec["checkpoint_dir"])
        self.start_step = 0
        self.model_config: dict[str, Any] | None = None
        self.tokenizer_path: str | None = None
        self.lineage: dict[str, Any] | None = None
        self.losses: list[tuple[int, float]] = []
        self._checkpointer: Any = None

    def validation_due(self, step: int) -> bool:
        from jaxcore.experiments.trial_context import TrialContext

        return TrialContext.validation_due(self, step)  # the leader's rule, same fields

    def report(self, step: int, metrics: dict[str, Any]) -> None:
        if "loss" in metrics and "val_loss" not in metrics:
            self.losses.append((step, float(metrics["loss"])))

    def checkpointer(self) -> Any:
        """The same `jaxcore.Checkpointer` settings as the leader's `TrialContext`."""
        if self._checkpointer is None:
            from jaxcore.experiments.trial_context import trial_checkpointer

            self._checkpointer = trial_checkpointer(
                self.checkpoint_dir, self.trial_id, self.hparams, self.lineage
            )
        return self._checkpointer

    def restore(self, engine: Any, model: Any, optimizer: Any, loader: Any) -> Any:
        from jaxcore.experiments.trial_context import apply_hyperparams

        ckpt = self.checkpointer()
        state, loader = ckpt.restore_or_init(engine, model, optimizer, loader)
        self.start_step = ckpt.resumed_step or 0
        if ckpt.resumed_step is not None:  # the trial's own lr wins, as on the leader
            state = state.replace(
                opt_state=apply_hyperparams(state.opt_state, optimizer, state.params)
            )
        return state, loader

    def checkpoint(self, state: Any, loader: Any = None, *, step: int) -> None:
        ckpt = self.checkpointer()
        ckpt.save(state, loader, force=True, step=int(step))
        ckpt.wait()

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None


def follow(run_dir: pathlib.Path, hosts: Hosts) -> dict[str, Any]:
    """Follow process 0 through every phase; returns (and writes) what this process did."""
    from jaxcore.run import trial

    me = f"process {hosts.index}"
    done: dict[str, Any] = {"process": hosts.index, "phases": {}, "trials": []}
    hello = hosts.receive("process 0 to start the run")
    check_probe(hello["folders"], hello["token"])
    while True:
        event = hosts.receive("the next phase")
        if event["kind"] == "end":
            break
        phase, action = event["phase"], event["action"]
        done["phases"][phase] = action
        if action == "skip":
            continue
        if phase not in COLLECTIVE_PHASES:
            hosts.say(f"{me}: waiting for process 0 to finish the {phase} phase")
            hosts.receive(f"process 0's {phase} phase")  # its phase_done
            continue
        hosts.say(f"{me}: {phase} phase: training the trials process 0 announces")
        while (event := hosts.receive(f"the next trial of the {phase} phase"))["kind"] == "trial":
            ctx = FollowerContext(event["spec"])
            try:
                trial.train(ctx)
            finally:
                ctx.close()
            done["trials"].append({"phase": phase, "trial_id": ctx.trial_id, "losses": ctx.losses})
    out = run_dir / "processes" / f"process-{hosts.index}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(done, indent=1) + "\n")
    os.replace(tmp, out)
    hosts.say(f"{me}: done; what it trained is in {out}")
    return done
