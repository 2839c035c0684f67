"""``jaxcore launch``: start N local processes wired into one JAX run, and watch them.

    jaxcore launch -n 2 --devices-per-process 4 train.py --steps 3
    python -m jaxcore.launch -n 2 --devices-per-process 4 train.py --steps 3

Each child gets ``JAXCORE_COORDINATOR`` / ``JAXCORE_NUM_PROCESSES`` / ``JAXCORE_PROCESS_ID``
(read by `jaxcore.initialize`), and on CPU ``K`` fake devices (``XLA_FLAGS``) with gloo
collectives; on GPU ``CUDA_VISIBLE_DEVICES`` gives each process its own K GPUs. Output is
streamed line by line, prefixed ``[rank i]``. When one process fails, the others are
stopped (SIGTERM, then SIGKILL after ``--grace``) and the launcher exits non-zero,
naming the failing rank and showing its last lines -- the behaviour of torchrun's elastic
agent (``torch/distributed/elastic/agent``), without restarts.

Preemption: a SIGTERM to the launcher (a scheduler's notice) is forwarded to every rank,
which then get ``--sigterm-grace`` seconds (default 120) to write their final checkpoint
(`jaxcore.Checkpointer` saves the same step on all of them and exits with
`PREEMPTION_EXIT_CODE`, 75). A rank that exits with 75 is not a failure: the others are
given the same grace to follow. When every rank ended with 0 or 75, and at least one with
75, the launcher exits 75 too, so the wrapper script can requeue the job; ranks still
running when the grace ends are killed and the exit code is 143.

``--print-slurm`` / ``--print-tpu-pod`` print the sbatch script and the
``gcloud compute tpus tpu-vm ssh --worker=all`` command for the same script instead.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from jaxcore.errors import ConfigError, JaxcoreError
from jaxcore.lifeline import ENV_LIFELINE, Lifeline
from jaxcore.runtime import (
    MALLOC_TUNABLES,
    PREEMPTION_EXIT_CODE,
    nvidia_gpu_count,
    port_unavailable,
    with_cpu_devices,
    with_malloc_tuning,
)

log = logging.getLogger(__name__)

TAIL_LINES = 30
SIGTERM_GRACE_S = 120.0  # seconds ranks get to save after a SIGTERM (GKE's default is 30,
# Slurm's --signal lead time is chosen by the user; 120 s covers an async save of a few GB)
_TOO_SLOW = -2  # _watch: ranks still running when the preemption grace ended


class LaunchError(JaxcoreError):
    """A launched process failed; the message names its rank and shows its last output."""


@dataclasses.dataclass(frozen=True)
class GroupResult:
    """How a group of processes ended.

    Attributes:
        returncode: 0 when every process succeeded, else the failing rank's exit code
            (128 + signal number when it was killed by a signal).
        failed_rank: the first rank seen to fail (``None`` on success).
        returncodes: each rank's raw return code (negative: killed by that signal).
        tails: each rank's last output lines.
        outlived_grace: ranks were still running when the grace after a SIGTERM ended
            (they were killed, without a final checkpoint).
    """

    returncode: int
    failed_rank: int | None
    returncodes: tuple[int | None, ...]
    tails: tuple[tuple[str, ...], ...]
    outlived_grace: bool = False

    @property
    def preempted(self) -> bool:
        """Whether the ranks stopped for a preemption, having saved (exit code 75)."""
        return self.returncode == PREEMPTION_EXIT_CODE

    def describe_failure(self) -> str:
        """A message naming the failing rank, how it ended, and its last output."""
        if self.failed_rank is None:
            return "preempted: every rank saved" if self.preempted else "all processes succeeded"
        rank = self.failed_rank
        code = self.returncodes[rank]
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code is not None and code < 0
            else f"exited with code {code}"
        )
        tail = "\n".join(f"  {line}" for line in self.tails[rank]) or "  (no output)"
        return (
            f"rank {rank} {how}; the other ranks were stopped. Last output of rank {rank}:\n{tail}"
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (for the coordinator)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_platform(platform: str) -> None:
    """Refuse ``platform="gpu"`` where ``nvidia-smi`` lists no GPU: JAX would fall back to
    CPU with one warning line per rank, and the run would train on one CPU device per
    process and exit 0 as if on GPUs."""
    if platform == "gpu" and not nvidia_gpu_count():
        raise ConfigError(
            "platform 'gpu': this machine shows no NVIDIA GPU (`nvidia-smi -L` lists none, "
            "or the driver and its nvidia-smi are missing). Run where the GPUs are, or use "
            "platform 'cpu' (the default; --platform cpu) for CPU devices."
        )


def _check_port(host: str, port: int) -> None:
    """Refuse a ``--port`` that is taken before any rank starts: rank 0 would otherwise
    die in ``jax.distributed.initialize`` with gRPC's bare "Failed to start RPC server"."""
    if why := port_unavailable(port):
        raise ConfigError(
            f"--port {port}: the coordinator cannot listen on {host}:{port}: {why}; another "
            "run or program may hold it. Pick another --port, or leave it out for a free one."
        )


def process_env(
    rank: int,
    num_processes: int,
    coordinator: str,
    *,
    devices_per_process: int | None = None,
    platform: str = "cpu",
    init_timeout_s: float | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of local process ``rank`` of a launched run."""
    env = dict(os.environ if base is None else base)
    env.update(
        JAXCORE_COORDINATOR=coordinator,
        JAXCORE_NUM_PROCESSES=str(num_processes),
        JAXCORE_PROCESS_ID=str(rank),
        PYTHONUNBUFFERED="1",
    )
    if init_timeout_s is not None:
        env["JAXCORE_INIT_TIMEOUT"] = str(init_timeout_s)
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
        with_cpu_devices(env, devices_per_process or 1)
    elif platform == "gpu":
        k = devices_per_process or 1
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(rank * k + i) for i in range(k))
    elif platform != "auto":
        raise ConfigError(f"platform={platform!r}: use 'cpu', 'gpu' or 'auto'.")
    elif devices_per_process is not None:
        # 'auto' leaves the devices to JAX: the count was ignored, and a 2 x 4 run trained
        # on 2 CPU devices without a word.
        raise ConfigError(
            f"devices_per_process={devices_per_process} with platform 'auto': 'auto' lets "
            "each process use what JAX finds, so the count cannot be applied. Choose "
            "platform 'cpu' (K fake devices) or 'gpu' (K GPUs each) with it, or leave it out."
        )
    with_malloc_tuning(env)
    return env


def rank_envs(num_processes: int, coordinator: str, **kwargs: Any) -> list[dict[str, str]]:
    """`process_env` for every rank of a run (``kwargs`` as `process_env` takes them)."""
    return [process_env(r, num_processes, coordinator, **kwargs) for r in range(num_processes)]


def _stream(
    rank: int, pipe, out: TextIO, lock: threading.Lock, tail: collections.deque, prefix: bool
) -> None:
    """Copy one rank's output to ``out``, a whole line at a time.

    The pipe is read to its end even once ``out`` is closed (``jaxcore launch ... | head``):
    a rank blocks on a full pipe, so a reader that stopped would hang the run.
    """
    writable = True
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        tail.append(line)
        if not writable:
            continue
        with lock:
            try:
                out.write(f"[rank {rank}] {line}\n" if prefix else f"{line}\n")
                out.flush()
            except (OSError, ValueError):  # a closed pipe, terminal or file
                writable = False
    pipe.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def run_group(
    commands: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]],
    *,
    out: TextIO | None = None,
    prefix: bool = True,
    grace_s: float = 5.0,
    timeout_s: float | None = None,
    cwd: str | None = None,
    stop: threading.Event | None = None,
    sigterm_grace_s: float = SIGTERM_GRACE_S,
) -> GroupResult:
    """Run one command per rank, stream their output, stop all when one fails.

    Each child runs in its own session so that stopping it also stops what it started.
    ``timeout_s`` bounds the whole run (every rank is stopped and the result fails with
    rank ``None`` reported as code 124). Once ``stop`` is set (the launcher's SIGTERM),
    every rank gets SIGTERM and ``sigterm_grace_s`` seconds to save and exit (see the
    module docstring for the exit codes).
    """
    out = sys.stdout if out is None else out
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    tails = [collections.deque(maxlen=TAIL_LINES) for _ in commands]
    threads = []
    # Held until every rank is gone: if this process is killed, the ranks see the pipe
    # end and stop themselves (`jaxcore.lifeline`), as they run in their own sessions.
    lifeline = Lifeline(sigterm_grace_s)
    try:
        for rank, (cmd, env) in enumerate(zip(commands, envs, strict=True)):
            proc = subprocess.Popen(
                list(cmd),
                env={**env, ENV_LIFELINE: lifeline.env_value},
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(lifeline.read_fd,),
            )
            procs.append(proc)
            t = threading.Thread(
                target=_stream,
                args=(rank, proc.stdout, out, lock, tails[rank], prefix),
                daemon=True,
            )
            t.start()
            threads.append(t)
        lifeline.started()
        failed = _watch(procs, timeout_s, stop, sigterm_grace_s)
    except BaseException:  # Ctrl-C or an error here: never leave orphans behind
        try:
            _stop(procs, grace_s)
        finally:
            lifeline.close()
        raise
    slow = [r for r, p in enumerate(procs) if p.poll() is None]
    # After the preemption grace the ranks already had their SIGTERM: kill at once.
    try:
        _stop(procs, 0.0 if failed == _TOO_SLOW else grace_s)
    finally:
        lifeline.close()
    for t in threads:
        t.join(timeout=5)
    codes = tuple(p.poll() for p in procs)
    final = tuple(tuple(t) for t in tails)
    if failed is None:
        return GroupResult(
            PREEMPTION_EXIT_CODE if PREEMPTION_EXIT_CODE in codes else 0, None, codes, final
        )
    if failed == -1:  # the overall timeout
        return GroupResult(124, None, codes, final)
    if failed == _TOO_SLOW:
        return GroupResult(128 + signal.SIGTERM, slow[0], codes, final, outlived_grace=True)
    code = codes[failed]
    rc = 128 - code if code is not None and code < 0 else (code or 1)
    return GroupResult(rc, failed, codes, final)


def _watch(
    procs: list[subprocess.Popen],
    timeout_s: float | None,
    stop: threading.Event | None = None,
    sigterm_grace_s: float = SIGTERM_GRACE_S,
) -> int | None:
    """Wait until all end well (``None``: 0 or 75), one fails (its rank), time runs out
    (-1), or ranks outlive the preemption grace (``_TOO_SLOW``)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    wind_down: float | None = None  # every rank must be gone by then (preemption)
    forwarded = False
    while True:
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0, PREEMPTION_EXIT_CODE)]
        if bad:
            # Seen together: a rank killed by a signal is the likelier cause of the others'
            # errors (their collectives lost a peer), so name it.
            return min(bad, key=lambda r: (codes[r] > 0, r))
        if all(c is not None for c in codes):
            return None
        now = time.monotonic()
        if stop is not None and stop.is_set() and not forwarded:
            forwarded = True
            log.warning("SIGTERM: forwarding it to every rank; %.0f s to save", sigterm_grace_s)
            for p in procs:
                if p.poll() is None:  # the rank only: its data workers must live to the save
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
            wind_down = now + sigterm_grace_s if wind_down is None else wind_down
        if wind_down is None and PREEMPTION_EXIT_CODE in codes:
            wind_down = now + sigterm_grace_s  # one rank was preempted: the rest follow
        if wind_down is not None and now > wind_down:
            return _TOO_SLOW
        if deadline is not None and now > deadline:
            return -1
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """Stop every rank and everything it started: SIGTERM, then SIGKILL after ``grace_s``.

    Each rank's process group is killed at the end, even when the rank itself has ended:
    what it started (data workers, a shell's children) would otherwise be orphaned and keep
    its output pipe open. A second Ctrl-C while waiting kills at once.
    """
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    try:
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            _signal_group(p, signal.SIGKILL)
        for p in procs:
            p.wait()


def launch(
    command: Sequence[str],
    *,
    num_processes: int,
    devices_per_process: int | None = None,
    platform: str = "cpu",
    host: str = "127.0.0.1",
    port: int | None = None,
    init_timeout_s: float | None = None,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
    out: TextIO | None = None,
    prefix: bool = True,
    stop: threading.Event | None = None,
    sigterm_grace_s: float = SIGTERM_GRACE_S,
) -> GroupResult:
    """Run ``command`` (e.g. ``[python, script, *args]``) as ``num_processes`` ranks.

    ``stop`` and ``sigterm_grace_s``: preemption, as in `run_group`.
    """
    if num_processes < 1:
        raise ConfigError(f"num_processes={num_processes}: must be >= 1.")
    if devices_per_process is not None and devices_per_process < 1:
        raise ConfigError(f"devices_per_process={devices_per_process}: must be >= 1.")
    if port is not None:
        _check_port(host, port)
    check_platform(platform)
    coordinator = f"{host}:{port or free_port(host)}"
    envs = rank_envs(
        num_processes,
        coordinator,
        devices_per_process=devices_per_process,
        platform=platform,
        init_timeout_s=init_timeout_s,
    )
    log.info("launching %d processes, coordinator %s", num_processes, coordinator)
    return run_group(
        [command] * num_processes,
        envs,
        out=out,
        prefix=prefix,
        grace_s=grace_s,
        timeout_s=timeout_s,
        stop=stop,
        sigterm_grace_s=sigterm_grace_s,
    )


# ----------------------------------------------------------------------- cluster scripts
def _run_line(args: argparse.Namespace, python: str) -> str:
    target = ["-m", args.module] if args.module else [args.script]
    return shlex.join([python, "-u", *target, *args.script_args])


def slurm_script(args: argparse.Namespace) -> str:
    """An sbatch script that runs the same command on ``--nodes`` nodes."""
    per_node = args.num_processes
    gpus = args.devices_per_process or 1
    return f"""#!/bin/bash
# Generated by `jaxcore launch --print-slurm`. Submit with: sbatch this_file.sbatch
#SBATCH --job-name={args.job_name}
#SBATCH --nodes={args.nodes}
#SBATCH --ntasks-per-node={per_node}
#SBATCH --gpus-per-task={gpus}
#SBATCH --time={args.time}
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=TERM@180
set -euo pipefail

# jaxcore.initialize() lets JAX read SLURM_*: coordinator = first node of the step,
# process count = SLURM_NTASKS, rank = SLURM_PROCID, one GPU set per task (SLURM_LOCALID).
# glibc keeps XLA's large host buffers instead of unmapping them every step (PERF-NOTES.md).
export GLIBC_TUNABLES="${{GLIBC_TUNABLES:-{MALLOC_TUNABLES}}}"
export JAXCORE_INIT_TIMEOUT="${{JAXCORE_INIT_TIMEOUT:-600}}"

# SIGTERM (--signal, preemption): every process saves the same step and exits
# {PREEMPTION_EXIT_CODE}; requeue then, and the next run resumes from that checkpoint.
rc=0
srun --kill-on-bad-exit=1 {_run_line(args, "python")} || rc=$?
if [ "$rc" -eq {PREEMPTION_EXIT_CODE} ]; then
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$rc"
"""


def tpu_pod_command(args: argparse.Namespace) -> str:
    """The ``gcloud`` commands that copy the code and run it on every TPU-VM worker."""
    where = f"--zone={args.zone}" + (f" --project={args.project}" if args.project else "")
    remote = (
        f"cd {args.remote_dir} && "
        f"GLIBC_TUNABLES={MALLOC_TUNABLES} JAXCORE_INIT_TIMEOUT=600 {_run_line(args, 'python3')}"
    )
    return (
        "# Copy the working directory to every worker, then start the same command on all\n"
        "# of them; jaxcore.initialize() reads the pod's topology from the TPU metadata.\n"
        f"gcloud compute tpus tpu-vm scp --recurse . {args.tpu_name}:{args.remote_dir} "
        f"--worker=all {where}\n"
        f"gcloud compute tpus tpu-vm ssh {args.tpu_name} --worker=all {where} "
        f"--command={shlex.quote(remote)}\n"
    )


def _number(
    kind: type, low: float, *, inclusive: bool = True, unit: str = "", high: float | None = None
):
    """An argparse type: a ``kind`` number >= ``low`` (> ``low`` unless ``inclusive``), so a
    value that cannot work (``--init-timeout 0``: every rank would fail in
    `jaxcore.initialize`) is a usage error before any rank starts."""
    bound = f"{'>=' if inclusive else '>'} {low:g}{unit}"
    if high is not None:
        bound = f"{low:g}..{high:g}{unit}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value != value:  # not a number, or NaN
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        if value < low or (value == low and not inclusive) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxcore launch",
        description="Run a script as N local processes of one JAX run, or print the "
        "Slurm / TPU-pod commands for it.",
    )
    p.add_argument(
        "-n", "--num-processes", type=_number(int, 1), default=2, help="processes (per node)"
    )
    p.add_argument(
        "--devices-per-process",
        type=_number(int, 1),
        default=None,
        help="CPU: fake devices per process; GPU: GPUs per process (default 1)",
    )
    p.add_argument("--platform", choices=("cpu", "gpu", "auto"), default="cpu")
    p.add_argument("--host", default="127.0.0.1", help="coordinator host (local runs)")
    p.add_argument(
        "--port",
        type=_number(int, 0, high=65535),
        default=None,
        help="coordinator port (default or 0: a free one)",
    )
    p.add_argument(
        "--init-timeout",
        type=_number(float, 0, inclusive=False, unit=" s"),
        default=120.0,
        help="seconds to wait for the coordinator",
    )
    p.add_argument(
        "--timeout",
        type=_number(float, 0, inclusive=False, unit=" s"),
        default=None,
        help="seconds for the whole run",
    )
    p.add_argument(
        "--grace",
        type=_number(float, 0, unit=" s"),
        default=5.0,
        help="when a rank fails: seconds between SIGTERM and SIGKILL for the others",
    )
    p.add_argument(
        "--sigterm-grace",
        type=_number(float, 0, unit=" s"),
        default=SIGTERM_GRACE_S,
        help="when the launcher gets SIGTERM: seconds the ranks get to save and exit "
        f"(they exit {PREEMPTION_EXIT_CODE}, and so does the launcher)",
    )
    p.add_argument("--no-prefix", action="store_true", help="do not prefix lines with the rank")
    p.add_argument("-m", "--module", default=None, help="run a module (like python -m)")
    p.add_argument("--print-slurm", action="store_true", help="print an sbatch script and exit")
    p.add_argument(
        "--print-tpu-pod", action="store_true", help="print the gcloud TPU-pod command and exit"
    )
    p.add_argument("--nodes", type=_number(int, 1), default=2, help="Slurm nodes (--print-slurm)")
    p.add_argument("--job-name", default="jaxcore", help="Slurm job name")
    p.add_argument("--time", default="01:00:00", help="Slurm time limit")
    p.add_argument("--tpu-name", default="my-tpu-pod", help="TPU VM name (--print-tpu-pod)")
    p.add_argument("--zone", default="us-central2-b", help="TPU zone")
    p.add_argument("--project", default=None, help="GCP project")
    p.add_argument("--remote-dir", default="~/jaxcore-run", help="directory on the workers")
    p.add_argument("script", nargs="?", help="the Python script to run")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def _split_module_args(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], list[str]]:
    """The launcher's arguments and the module's: after ``-m module`` every argument is the
    module's (``-m mod --steps 3``), as with ``python -m``."""
    for i, token in enumerate(argv):
        if token in ("-m", "--module") and i + 1 < len(argv):
            head, _ = parser.parse_known_args(argv[:i])
            if head.script is None:  # not an argument of a script named before it
                return argv[: i + 2], argv[i + 2 :]
            break
    return argv, []


class _HangUp(Exception):
    """The launcher got SIGHUP (its terminal closed)."""


def _hang_up(signum: int, frame: Any) -> None:
    raise _HangUp


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``jaxcore launch``; returns the exit code."""
    parser = build_parser()
    own, module_args = _split_module_args(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    args.script_args = [*args.script_args, *module_args]
    if args.module and args.script is not None:
        args.script_args = [args.script, *args.script_args]
        args.script = None
    if not args.module and not args.script:
        parser.error("give a script to run (or -m module)")
    if args.print_slurm:
        sys.stdout.write(slurm_script(args))
        return 0
    if args.print_tpu_pod:
        sys.stdout.write(tpu_pod_command(args))
        return 0
    if not args.module and not os.path.exists(args.script):
        # Every rank would print Python's "can't open file" and the launcher would report
        # rank 0 as failed; one line says it before any rank starts.
        print(
            f"jaxcore launch: {args.script}: no such file or directory (from "
            f"{os.getcwd()}). Give the script's path, or -m package.module for a module.",
            file=sys.stderr,
        )
        return 2
    target = ["-m", args.module] if args.module else [args.script]
    command = [sys.executable, "-u", *target, *args.script_args]
    previous = None
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        # A scheduler's SIGTERM is a preemption notice for the ranks too: forward it (in
        # _watch) and give them time to save, instead of orphaning or killing them.
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        # A closed terminal (SIGHUP) would end the launcher alone, orphaning the ranks in
        # their own sessions: stop them as for Ctrl-C.
        signal.signal(signal.SIGHUP, _hang_up)
    try:
        result = launch(
            command,
            num_processes=args.num_processes,
            devices_per_process=args.devices_per_process,
            platform=args.platform,
            host=args.host,
            port=args.port,
            init_timeout_s=args.init_timeout,
            timeout_s=args.timeout,
            grace_s=args.grace,
            prefix=not args.no_prefix,
            stop=stop,
            sigterm_grace_s=args.sigterm_grace,
        )
    except ConfigError as e:
        print(f"jaxcore launch: {e}", file=sys.stderr)
        return 2
    except _HangUp:
        print("jaxcore launch: SIGHUP; stopped all ranks", file=sys.stderr)
        return 128 + signal.SIGHUP
    except KeyboardInterrupt:
        print("jaxcore launch: interrupted; stopped all ranks", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if result.preempted:
        print(
            f"jaxcore launch: preempted: every rank saved and exited; exiting with "
            f"{PREEMPTION_EXIT_CODE} (requeue the job to resume)",
            file=sys.stderr,
        )
    elif result.outlived_grace:
        print(
            f"jaxcore launch: SIGTERM: rank {result.failed_rank} did not exit within "
            f"--sigterm-grace={args.sigterm_grace} s and was killed (no final checkpoint). "
            f"{result.describe_failure()}",
            file=sys.stderr,
        )
    elif result.returncode == 124 and result.failed_rank is None:
        print(
            f"jaxcore launch: timed out after {args.timeout} s; stopped all ranks", file=sys.stderr
        )
    elif result.returncode:
        print(f"jaxcore launch: {result.describe_failure()}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
