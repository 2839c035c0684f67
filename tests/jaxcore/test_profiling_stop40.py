"""`TraceWindow` driven as a user would: the trace files are read back (the Chrome trace
``*.trace.json.gz`` jax.profiler writes next to ``*.xplane.pb``), windows that never
open, a trace that cannot be written, two processes, two windows in one directory."""

import gzip
import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxcore import profiling as prof

from .test_launch import clean_env, run_two_ranks

ROOT = Path(__file__).resolve().parents[2]


def run_loop(trace: prof.TraceWindow, steps: range) -> None:
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((32, 32))
    for step in steps:
        with trace.step(step):
            y = f(x)
        trace.after(step, y)
    trace.close()


def traced_steps(root: Path) -> list[list[int]]:
    """The ``step_num`` of every ``train`` step annotation, per trace file under ``root``."""
    out = []
    for path in sorted(root.rglob("*.trace.json.gz")):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        steps = sorted(
            int(e["args"]["step_num"])
            for e in events
            if e.get("name") == "train" and e.get("ph") == "X"
        )
        out.append(steps)
    return out


def test_the_trace_holds_exactly_the_window_steps(tmp_path):
    run_loop(prof.TraceWindow(tmp_path, start=2, num_steps=3), range(7))
    assert len(list(tmp_path.rglob("*.xplane.pb"))) == 1
    assert traced_steps(tmp_path) == [[2, 3, 4]]


def test_a_run_resumed_inside_the_window_traces_the_rest_of_it(tmp_path, caplog):
    """Resumed at step 3 with a window of steps 2..4: steps 3 and 4 are traced (was: no
    trace and no word, since step 2 never came)."""
    with caplog.at_level(logging.INFO, logger="jaxcore.profiling"):
        run_loop(prof.TraceWindow(tmp_path, start=2, num_steps=3), range(3, 7))
    assert traced_steps(tmp_path) == [[3, 4]]
    assert "started at step 3" in caplog.text


@pytest.mark.parametrize("steps", [range(0, 4), range(6, 9)], ids=["ends-before", "starts-after"])
def test_a_window_the_run_never_reaches_says_so(tmp_path, caplog, steps):
    with caplog.at_level(logging.WARNING, logger="jaxcore.profiling"):
        run_loop(prof.TraceWindow(tmp_path, start=4, num_steps=2), steps)
    assert not list(tmp_path.rglob("*.xplane.pb"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "steps 4..5" in warnings[0] and "no trace" in warnings[0], warnings[0]


def test_a_trace_that_cannot_be_written_warns_once_and_training_continues(tmp_path, caplog):
    """A directory where the trace cannot go (here ``plugins`` is a file; read-only or full
    disks fail the same way) is one warning line; training continues and the profiler is
    free for the next window (was: JaxRuntimeError out of ``after``, and every later
    ``start_trace`` raised "Profile has already been started")."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "plugins").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="jaxcore.profiling"):
        run_loop(prof.TraceWindow(blocked, start=1, num_steps=2), range(5))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert str(blocked) in warnings[0] and "training continues" in warnings[0]
    good = tmp_path / "good"
    run_loop(prof.TraceWindow(good, start=0, num_steps=1), range(2))
    assert traced_steps(good) == [[0]]


def test_a_failed_write_at_the_end_of_the_window_frees_the_profiler(tmp_path, monkeypatch, caplog):
    """A write that fails only when the trace is exported (a disk that fills up meanwhile)."""
    trace = prof.TraceWindow(tmp_path / "a", start=0, num_steps=1)
    real_stop = jax.profiler.stop_trace

    def full_disk():
        from jax._src import profiler as jp

        monkeypatch.setattr(jp._profile_state, "log_dir", str(tmp_path / "a" / "no\0such"))
        real_stop()

    monkeypatch.setattr(jax.profiler, "stop_trace", full_disk)
    with caplog.at_level(logging.WARNING, logger="jaxcore.profiling"):
        run_loop(trace, range(2))
    assert trace.done and not trace.active
    assert "training continues" in caplog.text
    monkeypatch.setattr(jax.profiler, "stop_trace", real_stop)
    run_loop(prof.TraceWindow(tmp_path / "b", start=0, num_steps=1), range(1))
    assert traced_steps(tmp_path / "b") == [[0]]


def test_two_windows_in_one_directory_keep_both_traces(tmp_path):
    """Two windows of a fast loop end within one second: jax.profiler names the run folder
    after the second, so the second trace overwrote the first (was: one file, steps 3)."""
    run_loop(prof.TraceWindow(tmp_path / "warm", start=0, num_steps=1), range(1))  # compiled
    deadline = time.monotonic() + 5
    while time.time() % 1 > 0.2 and time.monotonic() < deadline:  # both stop in one second
        time.sleep(0.005)
    tmp_path = tmp_path / "both"
    run_loop(prof.TraceWindow(tmp_path, start=0, num_steps=1), range(1))
    run_loop(prof.TraceWindow(tmp_path, start=3, num_steps=1), range(3, 4))
    assert sorted(traced_steps(tmp_path)) == [[0], [3]]


RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp
    import jaxcore as jc
    from jaxcore import profiling as prof
    from jaxcore.distributed import initialize
    initialize()
    trace = prof.TraceWindow(sys.argv[1], start=1, num_steps=2)
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((32, 32))
    for step in range(4):
        with trace.step(step):
            y = f(x)
        trace.after(step, y)
    trace.close()
    print("rank", jax.process_index(), "of", jax.process_count())
    """
)


@pytest.mark.multiprocess
def test_each_process_writes_its_own_trace(tmp_path):
    """Two processes on one host share the host name jax.profiler names its file after, and
    stop their windows in the same second: one trace overwrote the other (was: one file)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "trace"
    proc = run_two_ranks(script, str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 of 2" in proc.stdout and "rank 1 of 2" in proc.stdout
    for rank in range(2):
        assert traced_steps(out / f"process_{rank}") == [[1, 2]], rank


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp
    from jaxcore import profiling as prof
    trace = prof.TraceWindow(sys.argv[1], start=1, num_steps=5)
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((32, 32))
    for step in range(6):
        with trace.step(step):
            y = f(x)
        trace.after(step, y)
        if step == 2:  # what Checkpointer.save raises after a SIGTERM: Preempted(75)
            raise SystemExit(75)
    """
)


def test_a_process_that_exits_inside_the_window_writes_the_steps_so_far(tmp_path):
    """`Preempted` (a SystemExit from `Checkpointer.save`, outside ``trace.step``) ended the
    process with the trace never stopped: nothing was written (was: no file)."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    env = clean_env()
    env.update(JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "trace")],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert traced_steps(tmp_path / "trace") == [[1, 2]]
    assert "exiting at step 2, inside the window" in proc.stderr


def test_overlapping_windows_trace_the_first_and_skip_the_second(tmp_path, caplog):
    """jax.profiler runs one trace per process: the second window's start raised
    RuntimeError out of ``trace.step`` and stopped training (was: RuntimeError)."""
    first = prof.TraceWindow(tmp_path / "a", start=0, num_steps=3)
    second = prof.TraceWindow(tmp_path / "b", start=1, num_steps=1)
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((32, 32))
    with caplog.at_level(logging.WARNING, logger="jaxcore.profiling"):
        for step in range(4):
            with first.step(step), second.step(step):
                y = f(x)
            second.after(step, y)
            first.after(step, y)
        first.close()
        second.close()
    # each step carries both windows' annotations: two ``train`` events per step
    assert traced_steps(tmp_path / "a") == [[0, 0, 1, 1, 2, 2]]
    assert not list((tmp_path / "b").rglob("*.xplane.pb"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "another trace is running" in warnings[0], warnings
