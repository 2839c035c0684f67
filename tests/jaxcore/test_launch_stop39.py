"""`jaxcore launch`: a rank whose script raises while another waits for it in a collective.

The failing rank used to stay alive in `jax.distributed.shutdown` (atexit), a barrier the
waiting rank never reaches, until that rank's collective timed out (gloo: 30 s); only then
did the launcher see a failure. Now an uncaught exception in a rank of a multi-process run
ends it at once after its traceback (`jaxcore.distributed._exit_on_uncaught_error`)."""

import subprocess
import time

import pytest

from .test_launch import ROOT, SCRIPTS, clean_env, launch_cmd

GLOO_TIMEOUT_S = 30  # what the waiting rank's collective waits before it fails


@pytest.mark.multiprocess
def test_a_rank_that_raises_ends_the_launch_before_the_collective_times_out():
    start = time.monotonic()
    proc = subprocess.run(
        launch_cmd(
            "-n",
            "2",
            "--devices-per-process",
            "2",
            "--grace",
            "2",
            str(SCRIPTS / "raise_in_collective_stop39.py"),
        ),
        env=clean_env(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
    )
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rank 1 exited with code 1" in proc.stderr
    assert "RuntimeError: rank 1 broke before the barrier" in proc.stderr
    # The waiting rank was stopped by the launcher, not by its collective's deadline.
    assert "DEADLINE_EXCEEDED" not in proc.stdout + proc.stderr
    assert took < GLOO_TIMEOUT_S, took
