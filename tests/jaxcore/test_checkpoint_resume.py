"""Exact resume through real process deaths: SIGKILL, SIGKILL mid-save, SIGTERM.

Each scenario runs `procs/train.py` (one-layer tiny model, 8 CPU devices, seeded bytes) in
subprocesses sharing one compilation cache: the straight run compiles, the others start
once its first step is done and find their programs in the cache.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcore.checkpoint import PREEMPTION_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _start(directory, out, *args):
    # A shared compilation cache lets the restarts skip the compiles of the first round.
    cache = Path(directory).parent / "jax-cache"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.jaxcore.procs.train", str(directory), str(out), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(proc, word, timeout=600):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if word in line:
            return lines
    proc.kill()
    raise AssertionError(f"never printed {word!r}: {lines} {proc.stderr.read()[-3000:]}")


def _finish(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _losses(path):
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Round 1: a straight run, and three runs that die; round 2: their restarts."""
    t = tmp_path_factory.mktemp("resume")
    # 12 steps: every resumed run repeats at least 3 steps after its resume (the kill at 8
    # resumes at 9), which is what the bit-for-bit comparison needs.
    straight = _start(t / "a", t / "a.jsonl", "--steps", "12")
    # Its first step has put every program in the cache: the others start on cache hits
    # instead of four processes compiling the same programs side by side.
    _wait_for(straight, "step 1")
    killed = _start(t / "b", t / "b.jsonl", "--steps", "12", "--pause-after", "8")
    mid_save = _start(
        t / "c",
        t / "c.jsonl",
        "--steps",
        "12",
        "--pause-after",
        "8",
        "--slow-finalize-step",
        "8",
    )
    termed = _start(t / "d", t / "d.jsonl", "--steps", "10", "--pause-after", "6")
    _wait_for(killed, "PAUSED")
    killed.send_signal(signal.SIGKILL)
    _wait_for(mid_save, "PAUSED")  # step 8's save is held in flight
    mid_save.send_signal(signal.SIGKILL)
    _wait_for(termed, "PAUSED")
    termed.send_signal(signal.SIGTERM)
    first = {
        "a": _finish(straight),
        "b": _finish(killed),
        "c": _finish(mid_save),
        "d": _finish(termed),
    }
    second = {
        "b": _start(t / "b", t / "b.jsonl", "--steps", "12"),
        "c": _start(t / "c", t / "c.jsonl", "--steps", "12"),
        "d": _start(t / "d", t / "d.jsonl", "--steps", "10"),
    }
    second = {k: _finish(p) for k, p in second.items()}
    return t, first, second


def _assert_matches_straight(t, name):
    straight = dict(_losses(t / "a.jsonl"))
    rows = _losses(t / f"{name}.jsonl")
    for step, loss in rows:  # steps rerun after a resume must repeat bit for bit
        assert loss == straight[step], (name, step, loss, straight[step])
    return rows


def test_sigkill_then_resume_repeats_the_losses_exactly(runs):
    t, first, second = runs
    assert first["a"][0] == 0 and first["b"][0] == -signal.SIGKILL
    code, _, err = second["b"]
    assert code == 0, err[-2000:]
    assert f"resumed from checkpoint {t / 'b' / '8'} (step 8, verified)" in err
    rows = _assert_matches_straight(t, "b")
    assert [s for s, _ in rows] == list(range(1, 13))
    assert [loss for _, loss in rows] == [loss for _, loss in _losses(t / "a.jsonl")]


def test_kill_during_async_save_resumes_from_last_complete(runs):
    t, first, second = runs
    assert first["c"][0] == -signal.SIGKILL
    code, _, err = second["c"]
    assert code == 0, err[-2000:]
    assert f"resumed from checkpoint {t / 'c' / '4'} (step 4, verified)" in err
    rows = _assert_matches_straight(t, "c")
    assert [s for s, _ in rows] == [*range(1, 9), *range(5, 13)]
    assert not any(p.name.startswith("8.") for p in (t / "c").iterdir()), "temp dir left"


def test_sigterm_saves_and_exits_with_preemption_code(runs):
    t, first, second = runs
    code, _, err = first["d"]
    assert code == PREEMPTION_EXIT_CODE, err[-2000:]
    assert "preempted: saved step 7" in err
    code, _, err = second["d"]
    assert code == 0, err[-2000:]
    assert f"resumed from checkpoint {t / 'd' / '7'} (step 7, verified)" in err
    rows = _assert_matches_straight(t, "d")
    assert [s for s, _ in rows] == list(range(1, 11))
