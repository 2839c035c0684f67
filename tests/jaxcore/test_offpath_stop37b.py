"""`jaxcore launch` off the tested path: signals, leftover children, a closed output."""

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcore.launch import run_group
from tests.jaxcore.helpers import process_alive

SCRIPT = Path(__file__).parent / "scripts" / "sleeper_stop37b.py"
ROOT = Path(__file__).resolve().parents[2]


def _start(*script_args: str) -> tuple[subprocess.Popen, list[int], list[str]]:
    """Launch 2 sleeper ranks; return the launcher, the ranks' children, lines so far."""
    cmd = [sys.executable, "-m", "jaxcore.launch", "-n", "2", "--grace", "2"]
    proc = subprocess.Popen(
        [*cmd, "--sigterm-grace", "3", str(SCRIPT), *script_args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    children, lines = [], []
    while len(children) < 2:
        line = proc.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
        if m := re.search(r"READY (\d+)", line):
            children.append(int(m[1]))
    return proc, children, lines


def _finish(proc: subprocess.Popen, children: list[int]) -> tuple[int, list[int]]:
    proc.stdout.read()
    rc = proc.wait(timeout=30)
    # The launcher's SIGKILL to each rank's group is queued when it exits, not yet acted
    # on: on a loaded machine a child can still be running for a moment (a fresh-clone run
    # of stop 40 saw it). Left alone, a child would sleep 60 s, far past this deadline.
    deadline = time.monotonic() + 10
    while any(process_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = [c for c in children if process_alive(c)]
    for c in left:
        os.kill(c, signal.SIGKILL)
    return rc, left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_launcher_leaves_no_process_behind(sig):
    proc, children, _ = _start()
    os.kill(proc.pid, sig)
    rc, left = _finish(proc, children)
    assert not left, f"{sig.name}: children of the ranks still running: {left}"
    assert rc == 128 + sig, rc


def test_a_failed_ranks_children_are_stopped_too():
    proc, children, _ = _start("3")
    rc, left = _finish(proc, children)
    assert rc == 3 and not left, (rc, left)


class _Closed(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_does_not_hang_the_ranks():
    """``jaxcore launch ... | head``: the ranks write more than a pipe holds and finish."""
    cmd = [sys.executable, "-c", "import sys\nfor i in range(4000): print('x' * 100)"]
    result = run_group([cmd, cmd], [dict(os.environ)] * 2, out=_Closed(), timeout_s=20)
    assert result.returncode == 0, result
    assert result.tails[0][-1] == "x" * 100


def test_a_modules_own_options_go_to_the_module():
    """``jaxcore launch -m module --flag``, as ``python -m module --flag``."""
    cmd = [sys.executable, "-m", "jaxcore.launch", "-n", "2", "-m", "json.tool", "--help"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "[rank 1] usage:" in out.stdout and "json.tool" in out.stdout, out.stdout
