"""Ranks outlive no launcher: `jaxcore launch` or a notebook kernel killed (kill -9, a
kernel restart) takes its ranks and their children with it."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.jaxcore.helpers import process_alive

ROOT = Path(__file__).resolve().parents[2]
RANK = Path(__file__).parent / "scripts" / "lifeline_rank_stop38.py"


def _pids_when_ready(proc: subprocess.Popen, ranks: int) -> list[int]:
    pids, lines = [], []
    while len(pids) < 2 * ranks:
        line = proc.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
        if m := re.search(r"READY (\d+) (\d+)", line):
            pids += [int(m[1]), int(m[2])]
    return pids


def _gone_after_kill(proc: subprocess.Popen, pids: list[int]) -> list[int]:
    """SIGKILL ``proc``; the pids still running once they had 30 s to notice."""
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if process_alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


def _popen(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_kill_9_of_the_launcher_stops_every_rank_and_its_children():
    proc = _popen(
        [sys.executable, "-m", "jaxcore.launch", "-n", "2", "--sigterm-grace", "3", str(RANK)]
    )
    pids = _pids_when_ready(proc, 2)
    assert not _gone_after_kill(proc, pids)


def test_a_killed_notebook_kernel_takes_the_launched_processes_with_it():
    """What "Restart kernel" does to a cell blocked in `notebook_launcher`."""
    kernel = textwrap.dedent(
        """
        import os, subprocess, sys, time
        from jaxcore import notebook_launcher

        def fn():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            print("READY", os.getpid(), child.pid, flush=True)
            time.sleep(120)

        notebook_launcher(fn, num_processes=2)
        """
    )
    proc = _popen([sys.executable, "-u", "-c", kernel])
    pids = _pids_when_ready(proc, 2)
    assert not _gone_after_kill(proc, pids)


def test_an_inherited_variable_naming_another_file_is_ignored(tmp_path):
    """A rank's own subprocess inherits the variable, not the pipe: its fd number may be
    any file there, which must not be read (or taken for a dead launcher)."""
    from jaxcore import lifeline

    with open(tmp_path / "f", "w+b") as f:
        env = {lifeline.ENV_LIFELINE: f"{f.fileno()}:{os.fstat(f.fileno()).st_ino + 1}:1"}
        assert lifeline.watch_lifeline(env) is False
        env = {lifeline.ENV_LIFELINE: f"{f.fileno()}:{os.fstat(f.fileno()).st_ino}:1"}
        assert lifeline.watch_lifeline(env) is False  # the right inode, but not a pipe
    assert lifeline.watch_lifeline({lifeline.ENV_LIFELINE: "999:1:1"}) is False
    assert lifeline.watch_lifeline({}) is False
