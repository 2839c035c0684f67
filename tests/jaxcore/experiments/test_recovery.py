"""kill -9 of the experiment loop only, mid-ASHA, then `resume` at once: nothing is lost,
nothing runs twice, and the search ends where an uninterrupted one does."""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from jaxcore.experiments import Store, parse_config, run_experiment
from jaxcore.experiments.cli import main
from jaxcore.experiments.trial_context import trial_dir
from jaxcore.experiments.trial_executors import live_trial_processes
from tests.jaxcore.experiments.conftest import entry

LIMIT, TRIALS = 4, 12
HOLD_STEP = 5  # past the first rung (4): a promoted trial trains it


def _raw(workdir: pathlib.Path) -> dict:
    return {
        "name": "asha-kill",
        "entrypoint": entry("asha_ckpt"),
        "workdir": str(workdir),
        "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        "searcher": {
            "name": "adaptive_asha",
            "metric": "loss",
            "max_length": 16,
            "max_trials": TRIALS,
            "mode": "aggressive",
            "max_concurrent_trials": LIMIT,
            "seed": 7,
        },
        "resources": {"devices": 1, "slots": LIMIT},
        "max_restarts": 0,  # a trial killed by its loop's death is not a failure to retry
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0},
    }


class Sampler(threading.Thread):
    """Counts the live trial processes of the store every 0.2 s."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.samples, self.doubles = url, [], []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            live = live_trial_processes(self.url, set(range(1, 10 * TRIALS)))
            self.samples.append(sum(len(p) for p in live.values()))
            self.doubles += [(t, p) for t, p in live.items() if len(p) > 1]
            self.halt.wait(0.2)


def _ranking(store: Store, exp_id: int) -> list[tuple]:
    out = []
    for t in store.trials(exp_id):
        vals = [m["values"]["loss"] for m in store.metrics(t["id"], kind="validation")]
        out.append(
            (round(min(vals), 12), round(t["hparams"]["x"], 12), t["steps_done"], t["state"])
        )
    return sorted(out)


def _attempts(log: pathlib.Path) -> list[dict]:
    """The processes of one trial in order: what each trained and checkpointed."""
    by_pid: dict[str, dict] = collections.OrderedDict()
    for line in log.read_text().splitlines():
        kind, step, pid = line.split()
        rec = by_pid.setdefault(pid, {"train": [], "save": [], "ckpt": []})
        rec[kind].append(int(step))
    return list(by_pid.values())


@pytest.mark.slow
@pytest.mark.multiprocess
def test_kill_9_of_the_loop_mid_asha_then_resume(tmp_path):
    raw = _raw(tmp_path / "killed")
    cfg_path = tmp_path / "asha.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    url = parse_config(raw).database_url
    sampler = Sampler(url)
    sampler.start()
    loop = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxcore.experiments.cli",
            "experiment",
            "create",
            str(cfg_path),
            "--quiet",
        ],
        env={
            **{k: v for k, v in os.environ.items() if k not in ("JAXCORE_DB", "JAXCORE_DB_URL")},
            "JAXCORE_TEST_HOLD_STEP": str(HOLD_STEP),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: os.path.exists(url.removeprefix("sqlite:///")))
        store = Store(url)

        def mid_asha() -> bool:
            acked = [t for t in store.trials(1) if t["acked_step"] >= 4]
            return len(acked) >= 5 and sum(t["state"] == "RUNNING" for t in store.trials(1)) >= 2

        _wait(mid_asha)
        # One trial waits after training a step it has not checkpointed (objectives
        # `_hold_once`): the kill surely interrupts a trial mid-way (without it, every
        # trial could be between steps, or done, when the kill landed: 1 run in 4).
        _wait(lambda: any((tmp_path / "killed").glob("*/held")))
        loop.send_signal(signal.SIGKILL)  # the loop only: its trials are not signalled
        loop.wait()
        killed_at = {t["id"]: t["state"] for t in store.trials(1)}
        assert "RUNNING" in killed_at.values()
        # at once: the dead loop is detected by its pid, not by a heartbeat timeout
        assert main(["experiment", "resume", "1", "--db", url, "--quiet"]) == 0
    finally:
        if loop.poll() is None:
            loop.kill()
        sampler.halt.set()
        sampler.join()
    assert max(sampler.samples) <= LIMIT, sampler.samples
    assert not sampler.doubles, f"two live copies of a trial: {sampler.doubles}"
    assert store.experiment(1)["state"] == "COMPLETED"
    trials = store.trials(1)
    assert len(trials) == TRIALS and all(t["state"] in ("COMPLETED", "STOPPED") for t in trials)

    # No duplicate metric rows.
    keys = [(m["trial_id"], m["step"], m["kind"]) for m in store.metrics(exp_id=1)]
    assert len(keys) == len(set(keys))

    # No trial trained twice past its last checkpoint: every later process of a trial
    # started right after the newest checkpoint its earlier processes had written.
    restarted = 0
    for t in trials:
        attempts = _attempts(trial_dir(store.experiment(1), t["id"]) / "trained.log")
        for i, a in enumerate(attempts[1:], start=1):
            # The newest checkpoint the earlier processes wrote: their "ckpt" lines and
            # the one the previous process (checked in the turn before) resumed from.
            saved = max(
                [s for b in attempts[:i] for s in b["ckpt"]] + [attempts[i - 1]["train"][0] - 1]
            )
            # A kill inside the save of step k (after "save k", before "ckpt k") leaves
            # k saved or not, depending on whether its record was committed: the next
            # process starts after k or retrains it, nothing else.
            prev = attempts[i - 1]
            in_flight = prev["save"][-1] if prev["save"][-1:] != prev["ckpt"][-1:] else saved
            assert a["train"][0] in {saved + 1, in_flight + 1}, (t["id"], attempts)
            restarted += 1
    assert restarted >= 1  # the kill interrupted at least one trial mid-way

    # The same ranking as an uninterrupted run on the same seeds.
    clean = run_experiment(_raw(tmp_path / "clean"), executor="local")
    clean_store = Store(parse_config(_raw(tmp_path / "clean")).database_url)
    assert _ranking(store, 1) == _ranking(clean_store, clean.experiment_id)

    # The trial processes started without JAX or torch (a start-up cost per launch).
    clean_exp = clean_store.experiment(clean.experiment_id)
    logs = [trial_dir(clean_exp, t["id"]) / "heavy_imports.log" for t in clean.trials]
    finished = [line.split() for p in logs for line in p.read_text().splitlines()]
    assert len(finished) == TRIALS and all(heavy == "-" for _, heavy in finished), finished


def _wait(cond, timeout=180.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise AssertionError("condition not met in time")
