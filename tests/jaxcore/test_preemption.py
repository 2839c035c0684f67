"""Real process deaths and preemptions, with 1 and 2 processes (`procs/ckpt_train.py`).

- A seeded fault-injection loop: 12 SIGKILLs at exact points of start-up, verification,
  restore, training and the async save (8 with one process, 4 with two under
  `jaxcore launch`; the points are fixed, their order and counts drawn from the seed);
  every resumed run repeats the uninterrupted run's losses bit for bit,
  every resume is verified, and no kill ever leaves a damaged step.
- `jaxcore launch -n 2` preempted by SIGTERM to the launcher, and to both ranks: both save
  the same step, the launcher exits 75, and the run continues with 2 processes exactly and
  with 1 process within float tolerance.

Every run shares one compilation cache, with each rank writing its own entries
(`procs/ckpt_train.py`), so only the first start of a layout compiles; the two
uninterrupted reference runs are one module fixture.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from jaxcore.checkpoint import PREEMPTION_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(__file__).parent / "procs" / "ckpt_train.py")
# One xdist worker for the module (`--dist loadgroup`): the reference runs are shared.
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("preemption")]
STEPS_1, STEPS_2 = 24, 16
TIMEOUT = 600


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jax-cache")


def _env(cache, devices=None):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GLIBC_TUNABLES")}
    flags = "--xla_backend_optimization_level=0"  # the launcher adds the device count
    if devices:
        flags += f" --xla_force_host_platform_device_count={devices}"
    env.update(
        PYTHONPATH=str(ROOT),
        XLA_FLAGS=flags,
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    return env


def _start(cache, directory, out, steps, *extra, procs=1, devices=None):
    """One process (8 devices) directly, or ``procs`` under ``jaxcore launch``."""
    args = [SCRIPT, str(directory), str(out), "--steps", str(steps), *extra]
    if procs == 1 and devices is None:
        cmd, env = [sys.executable, *args], _env(cache, devices=8)
    else:
        per = devices or 8 // procs
        launch = ["-m", "jaxcore.launch", "-n", str(procs), "--devices-per-process", str(per)]
        launch += ["--grace", "2", "--init-timeout", "600"]
        env = _env(cache)
        cmd = [sys.executable, *launch, *args]
    return subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _run(*args, **kwargs):
    proc = _start(*args, **kwargs)
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _losses(path):
    return [(r["step"], r["loss"]) for r in _records(path) if "step" in r]


@pytest.fixture(scope="module")
def references(tmp_path_factory, cache):
    """Uninterrupted runs, side by side: 1 process x 8 devices (it fills the cache the
    single-process runs share), and 2 x 4 under the launcher."""
    t = tmp_path_factory.mktemp("reference")
    results = {}

    def go(name, steps, procs):
        results[name] = _run(cache, t / name, t / f"{name}.jsonl", steps, procs=procs)

    threads = [threading.Thread(target=go, args=a) for a in (("1", STEPS_1, 1), ("2", STEPS_2, 2))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for code, _, err in results.values():
        assert code == 0, err[-3000:]
    return {name: dict(_losses(t / f"{name}.jsonl")) for name in results}


# ----------------------------------------------------------------- fault injection
def _schedule(seed):
    """12 faults at seeded points; each chain first dies right after a finalized save, so
    every later start has a step to verify and restore."""
    rng = random.Random(seed)

    def k():
        return rng.randint(1, 3)

    one = ["startup:0", f"verify:{k()}", "restore:0", f"train:{k()}", f"save-inflight:{k()}"]
    one += [f"save-manifest:{k()}", f"save-rename:{k()}"]
    two = [f"train:{k()}", f"save-rename:{k()}", rng.choice([f"verify:{k()}", "restore:0"])]
    rng.shuffle(one)
    rng.shuffle(two)
    one, two = [f"saved:{rng.randint(1, 2)}", *one], [f"saved:{rng.randint(1, 2)}", *two]
    # Process 0 finalizes saves, so its manifest and rename are where those faults live.
    two = [(f, 0 if f.startswith("save-") else rng.randint(0, 1)) for f in two]
    return [(f, 0) for f in one], two


def _chain(cache, t, faults, steps, procs):
    """Start, die at each fault in turn, then finish; return what each start saw."""
    t.mkdir(parents=True, exist_ok=True)
    directory, out = t / "run", t / "run.jsonl"
    deaths = []
    for fault, rank in faults:
        extra = ["--die-at", fault, "--die-rank", str(rank)]
        code, stdout, err = _run(cache, directory, out, steps, *extra, procs=procs)
        deaths.append((fault, rank, code, stdout + err))
        assert not (directory / "damaged").exists(), (fault, err[-3000:])
    code, _, err = _run(cache, directory, out, steps, procs=procs)
    assert code == 0, err[-3000:]
    return deaths, _records(out)


# Faults that stop a start before it records itself (see procs/ckpt_train.py).
BEFORE_RECORD = ("startup:", "verify:", "restore:")


def test_twelve_sigkills_resume_bit_identically_and_verified(tmp_path, cache, references):
    one, two = _schedule(seed=13)
    results = {}

    def go(name, faults, steps, procs):
        try:
            results[name] = _chain(cache, tmp_path / name, faults, steps, procs)
        except BaseException as e:  # reported below, in the test's thread
            results[name] = e

    threads = [
        threading.Thread(target=go, args=("1", one, STEPS_1, 1)),
        threading.Thread(target=go, args=("2", two, STEPS_2, 2)),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    kills = 0
    for name in ("1", "2"):
        if isinstance(results[name], BaseException):
            raise results[name]
        deaths, records = results[name]
        for fault, rank, code, text in deaths:
            assert f"DYING at {fault}" in text, (name, fault, text[-3000:])
            assert "(there was nothing" not in text, (name, fault, "came before any save")
            if name == "1":
                assert code == -signal.SIGKILL, (fault, code)
            else:  # the launcher names the killed rank and stops the other
                assert code == 128 + signal.SIGKILL, (fault, code, text[-3000:])
                assert f"rank {rank} was killed by SIGKILL" in text, text[-3000:]
            kills += 1
        starts = [r for r in records if "start" in r]
        recorded = [f for f, *_ in deaths if not f.startswith(BEFORE_RECORD)]
        assert len(starts) == len(recorded) + 1, (name, recorded, starts)
        assert starts[0]["start"] == [None] * int(name), starts  # the first start is fresh
        resumed = starts[1:]
        assert resumed, "no run ever resumed: the faults came too early to test anything"
        for r in resumed:  # every rank restored the same step, each one verified
            assert len(set(r["start"])) == 1 and r["start"][0] is not None, starts
            assert r["verified"] == [True] * int(name), starts
        reference = references[name]
        rows = [(r["step"], r["loss"]) for r in records if "step" in r]
        for step, loss in rows:  # every step, first run or rerun, repeats bit for bit
            assert loss == reference[step], (name, step, loss, reference[step])
        assert {s for s, _ in rows} == set(range(1, len(reference) + 1))
    assert kills == 12


# ----------------------------------------------------------------- preemption
def _saved_steps(text):
    """``rank -> step`` from each rank's "preempted: saved step N" line."""
    found = {}
    for line in text.splitlines():
        if "preempted: saved step" in line and line.startswith("[rank "):
            rank = int(line[len("[rank ") : line.index("]")])
            found[rank] = int(line.split("preempted: saved step ")[1].split()[0])
    return found


def _preempt(cache, t, signal_ranks):
    directory, out = t / "run", t / "run.jsonl"
    proc = _start(cache, directory, out, 40, "--step-sleep", "0.3", procs=2)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (out.exists() and len(_losses(out)) >= 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never got to step 3"
            time.sleep(0.2)
        if signal_ranks:
            for r in range(2):
                os.kill(int(Path(f"{directory}.pid{r}").read_text()), signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        stdout, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == PREEMPTION_EXIT_CODE, (stdout + err)[-3000:]
    assert "jaxcore launch: preempted: every rank saved" in err
    saved = _saved_steps(stdout)
    assert set(saved) == {0, 1} and saved[0] == saved[1], saved
    step = saved[0]
    assert (directory / str(step) / "jaxcore_manifest.json").exists()
    assert _losses(out)[-1][0] == step  # it stopped right after the step it saved
    return directory, out, step


@pytest.mark.parametrize("target", ["launcher", "both-ranks"])
def test_sigterm_saves_one_step_on_both_ranks_and_resumes(tmp_path, cache, references, target):
    directory, out, step = _preempt(cache, tmp_path, signal_ranks=target == "both-ranks")
    assert step + 3 <= STEPS_2, f"preempted at step {step}: too late for the reference"
    reference = references["2"]
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    # 2 -> 2: the same layout, bit for bit.
    code, stdout, err = _run(cache, directory, out, step + 3, procs=2)
    assert code == 0, err[-3000:]
    resumed = f"resumed from checkpoint {directory / str(step)} (step {step}, verified)"
    assert f"[rank 0] [jaxcore.checkpoint] {resumed}" in stdout
    rows = _losses(out)
    assert [s for s, _ in rows] == [*range(1, step + 1), *range(step + 1, step + 4)]
    for s, loss in rows:
        assert loss == reference[s], (s, loss, reference[s])
    # 2 -> 1: one process of 8 devices continues within float tolerance.
    code, _, err = _run(cache, copy, tmp_path / "one.jsonl", step + 3, procs=1, devices=8)
    assert code == 0, err[-3000:]
    one = _losses(tmp_path / "one.jsonl")
    assert [s for s, _ in one] == list(range(step + 1, step + 4))
    np.testing.assert_allclose([x for _, x in one], [reference[s] for s, _ in one], rtol=1e-5)
