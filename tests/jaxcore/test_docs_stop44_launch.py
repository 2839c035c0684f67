"""docs/launching.md driven as written, then one step off it (stop 44).

- `jaxcore launch` numbers that cannot work (``--init-timeout 0``, ``--timeout -1``,
  ``--grace -1``, ``--port 70000``) and a script path with a typo are a usage error
  before any rank starts, not a traceback per rank, a run that times out at once, an
  OverflowError, or N "can't open file" ranks; ``--devices-per-process`` with
  ``--platform auto`` (ignored: 2 x 4 ran on 2 devices) is refused.
- `notebook_launcher(fn, args=20)` (``(20)`` for ``(20,)``), ``devices_per_process=0``
  and zero timeouts are a `ConfigError` that says so, not a ``TypeError`` from the error
  helper, a run on one device per process, or a failure in every rank.
- Half-set cluster variables (a rank without the process count, a count below 1, a rank
  outside the count, a port above 65535) are a `ConfigError` naming the variable, not a
  silent single-process run of what was meant to be one rank of several.
- `sys.exit(5)` on one rank while another waits for it in a collective ends the launch at
  once with 5, naming that rank (it waited in JAX's shutdown barrier until the other's
  collective timed out, and the launcher named the other with code 1).
"""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jaxcore as jc
from jaxcore.distributed import detect
from jaxcore.launch import main as launch_main
from jaxcore.notebook import notebook_launcher

from .test_launch import ROOT, clean_env, launch_cmd

CLUSTER_VARS = (
    "JAXCORE_COORDINATOR",
    "JAXCORE_NUM_PROCESSES",
    "JAXCORE_PROCESS_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
)


@pytest.fixture
def marker_script(tmp_path: Path) -> tuple[Path, Path]:
    """A script that leaves a file behind when any rank of it starts."""
    marker = tmp_path / "started"
    script = tmp_path / "mark.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    return script, marker


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--init-timeout", "0"], "--init-timeout"),
        (["--timeout", "-1"], "--timeout"),
        (["--grace", "-1"], "--grace"),
        (["--sigterm-grace", "-3"], "--sigterm-grace"),
        (["-n", "0"], "-n"),
        (["--devices-per-process", "0"], "--devices-per-process"),
        (["--port", "70000"], "--port"),  # was an OverflowError traceback from bind()
    ],
)
def test_launch_numbers_that_cannot_work_are_refused_before_any_rank(
    marker_script, capsys, flags, named
):
    script, marker = marker_script
    with pytest.raises(SystemExit) as exit_:
        launch_main([*flags, str(script)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert named in err and "Traceback" not in err, err
    assert not marker.exists(), "a rank started"


def test_launch_of_a_script_that_is_not_there_is_one_line(tmp_path, capsys):
    missing = tmp_path / "trian.py"  # a typo of train.py
    rc = launch_main(["-n", "2", str(missing)])
    captured = capsys.readouterr()
    assert rc == 2
    assert "[rank" not in captured.out + captured.err, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "no such" in lines[0], lines


@pytest.mark.parametrize("args, shown", [(20, "args=(20,)"), ("data.txt", "args=('data.txt',)")])
def test_notebook_launcher_args_that_are_not_a_tuple_say_so(args, shown):
    # One-element tuples are easy to get wrong: `args=(20)` is the int 20.
    with pytest.raises(jc.ConfigError, match=re.escape(f"args={args!r}") + ".*" + re.escape(shown)):
        notebook_launcher(lambda *a: a, args=args, num_processes=1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"devices_per_process": 0},  # ran on one device per process
        {"devices_per_process": -1},  # every rank's XLA client failed (vector::reserve)
        {"init_timeout_s": 0},  # every rank's initialize raised
        {"timeout_s": 0},  # timed out at once
    ],
)
def test_notebook_launcher_refuses_numbers_that_cannot_work(kwargs):
    ((name, value),) = kwargs.items()
    with pytest.raises(jc.ConfigError, match=f"{name}={value}"):
        notebook_launcher(lambda: 1, num_processes=1, **kwargs)


@pytest.fixture
def no_cluster(monkeypatch):
    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(
    "env, named",
    [
        # A hand-wired rank 1 that forgot the count trained alone, as a single process.
        (
            {"JAXCORE_PROCESS_ID": "1", "JAXCORE_COORDINATOR": "10.0.0.2:8476"},
            "JAXCORE_NUM_PROCESSES",
        ),
        ({"JAXCORE_COORDINATOR": "10.0.0.2:8476"}, "JAXCORE_NUM_PROCESSES"),
        ({"RANK": "3", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "WORLD_SIZE"),
        ({"JAXCORE_NUM_PROCESSES": "0"}, "JAXCORE_NUM_PROCESSES=0"),
        (
            {"WORLD_SIZE": "-2", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "WORLD_SIZE=-2",
        ),
        ({"WORLD_SIZE": "1", "RANK": "1"}, "process_id=1 is outside 0..0"),
        (  # process 0 checked the port with bind(): an OverflowError traceback
            {
                "JAXCORE_COORDINATOR": "h:70000",
                "JAXCORE_NUM_PROCESSES": "2",
                "JAXCORE_PROCESS_ID": "0",
            },
            "port 70000",
        ),
    ],
)
def test_half_set_cluster_variables_name_what_is_missing(no_cluster, env, named):
    with pytest.raises(jc.ConfigError, match=named):
        detect(environ=env)


@pytest.mark.parametrize(
    "env",
    [
        {},
        # torchrun --nproc-per-node 1, and containers that preset MASTER_ADDR/MASTER_PORT
        {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
        {"MASTER_ADDR": "h", "MASTER_PORT": "1"},
        {"JAXCORE_NUM_PROCESSES": "1", "JAXCORE_PROCESS_ID": "0"},
    ],
)
def test_a_single_process_stays_a_no_op(no_cluster, env):
    assert not detect(environ=env).multi_process


EXIT_IN_COLLECTIVE = """
import sys
import jaxcore as jc

jc.initialize()
import jax
from jax.experimental import multihost_utils

if jax.process_index() == 1:
    try:
        sys.exit(7)  # caught by the script: it goes on
    except SystemExit:
        pass
    print("rank 1 gives up", flush=True)
    sys.exit(5)
print("rank 0 waiting in a collective", flush=True)
multihost_utils.sync_global_devices("never reached by rank 1")
"""


@pytest.mark.multiprocess
def test_sys_exit_of_one_rank_ends_the_launch_with_its_code(tmp_path):
    """``sys.exit(5)`` on rank 1 while rank 0 waits for it in a collective: rank 1 used to
    wait in JAX's shutdown barrier (atexit) until rank 0's collective timed out (gloo:
    30 s), and the launcher then blamed rank 0 with code 1."""
    script = tmp_path / "exit_in_collective.py"
    script.write_text(EXIT_IN_COLLECTIVE)
    start = time.monotonic()
    proc = subprocess.run(
        launch_cmd("-n", "2", "--grace", "1", str(script)),
        env=clean_env(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    took = time.monotonic() - start
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert "rank 1 exited with code 5" in proc.stderr, proc.stderr[-2000:]
    assert "rank 1 gives up" in proc.stderr  # the failing rank's last output
    assert took < 20, took  # the collective's 30 s timeout did not decide it


def test_sys_exit_with_a_message_prints_it_and_skips_the_shutdown_barrier():
    # What `initialize` installs in a multi-process run, without starting one: the
    # message is printed once, the status is 1, and atexit functions (JAX's shutdown
    # barrier among them) do not run.
    code = (
        "import atexit, sys\n"
        "from jaxcore.distributed import _rank_exit\n"
        "sys.exit = _rank_exit\n"
        "atexit.register(print, 'atexit ran')\n"
        "sys.exit('no data found in /data')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 1
    assert proc.stderr == "no data found in /data\n", proc.stderr
    assert "atexit ran" not in proc.stdout


def test_a_device_count_with_platform_auto_is_refused(marker_script, capsys):
    # 'auto' sets no device count: `-n 2 --devices-per-process 4` ran on 2 CPU devices.
    script, marker = marker_script
    rc = launch_main(["-n", "2", "--devices-per-process", "4", "--platform", "auto", str(script)])
    err = capsys.readouterr().err
    assert rc == 2 and "devices_per_process=4 with platform 'auto'" in err, err
    assert not marker.exists(), "a rank started"
    with pytest.raises(jc.ConfigError, match="platform 'auto'"):
        notebook_launcher(lambda: 1, num_processes=1, devices_per_process=2, platform="auto")
