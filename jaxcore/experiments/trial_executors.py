"""Where trials run: inline (tests, ``jaxcore train``), local subprocesses, or Ray tasks.

Every trial executor answers the same four calls from the experiment loop: how many
trials fit (``capacity``), ``launch`` a trial, ``poll`` for trials that ended (with their
exit status), and ``signal`` one (SIGTERM to preempt, SIGKILL to kill). (Not to be
confused with the data pipeline's executors in ``data/executor.py``, which run shards.)

Trial processes die with the loop that started them: each runs in its own process group
(so a signal reaches the trial and its children) with ``PR_SET_PDEATHSIG`` = SIGKILL
(Linux ``prctl``; the kernel kills the child when the loop dies, even by ``kill -9``).
A restarted loop therefore never finds a live trial it did not start, and never runs
two copies of one trial or more trials than its concurrency limit (the same recipe
torchrun and Ray's raylet use for their workers).

The local executor splits the machine's devices into slots: a trial asking for ``d``
devices gets ``d`` GPU ids in ``CUDA_VISIBLE_DEVICES`` (TPU: ``TPU_VISIBLE_CHIPS``), or
on CPU ``d`` fake XLA devices, so several trials share a node without seeing each
other's accelerators (what Determined's agent does with its slots).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import pathlib
import signal
import subprocess
import sys
import traceback
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.runtime import nvidia_gpu_count

log = logging.getLogger(__name__)


def detect_platform() -> tuple[str, int]:
    """``("gpu", n)`` when ``nvidia-smi -L`` lists GPUs, else ``("cpu", cpu_count)``."""
    n = nvidia_gpu_count()
    return ("gpu", n) if n else ("cpu", os.cpu_count() or 1)


def trial_env(platform: str, devices: list[int], base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if platform == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    elif platform == "tpu":
        env["TPU_VISIBLE_CHIPS"] = ",".join(map(str, devices))
    else:
        flags = [
            f
            for f in env.get("XLA_FLAGS", "").split()
            if "xla_force_host_platform_device_count" not in f
        ]
        flags.append(f"--xla_force_host_platform_device_count={len(devices)}")
        env["XLA_FLAGS"] = " ".join(flags)
        env["JAX_PLATFORMS"] = "cpu"
    return env


def live_trial_processes(db_url: str, trial_ids: set[int]) -> dict[int, list[int]]:
    """``{trial id: [pid, ...]}`` of the live trial processes of ``trial_ids`` on this host
    that report to ``db_url`` (read from ``/proc/<pid>/environ``; Linux only, else {}).

    How a resumed loop makes sure the processes of its predecessor are gone before it
    launches any trial, and how the tests count the trials alive at a moment.
    """
    out: dict[int, list[int]] = {}
    want_url = f"JAXCORE_DB_URL={db_url}".encode()
    proc = pathlib.Path("/proc")
    if not proc.is_dir():
        return out
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or want_url not in env:
            continue
        for item in env:
            if item.startswith(b"JAXCORE_TRIAL_ID="):
                trial = int(item.split(b"=", 1)[1])
                if trial in trial_ids:
                    out.setdefault(trial, []).append(int(d.name))
    return out


class TrialExecutor(abc.ABC):
    """Where trials run: local subprocesses, Ray tasks, or inline (tests)."""

    inline = False

    @abc.abstractmethod
    def capacity(self) -> int:
        """How many trials can run at once."""

    @abc.abstractmethod
    def launch(self, trial_id: int, env: dict[str, str], log_path: pathlib.Path) -> int | None:
        """Start trial ``trial_id`` with ``env``, its output going to ``log_path``;
        returns the process id when the trial is a local process."""

    @abc.abstractmethod
    def poll(self) -> list[tuple[int, int]]:
        """``(trial_id, exit code)`` of the trials that ended since the last poll."""

    def signal(self, trial_id: int, sig: int) -> None:  # noqa: B027 (optional hook)
        """Send ``sig`` to a running trial; executors that cannot signal ignore it."""

    def running(self) -> set[int]:
        return set()

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the executor's resources (nothing by default)."""


class TrialTerminated(KeyboardInterrupt):
    """SIGTERM reached a process running its trials inline: the trial saved its checkpoint
    and the loop stops, as the process was asked to (resume continues the trial)."""


class InlineTrialExecutor(TrialExecutor):
    """Runs each trial to its end inside this process, one at a time (deterministic)."""

    inline = True

    def __init__(self, *, stop_on_sigterm: bool = False) -> None:
        """``stop_on_sigterm``: a SIGTERM to this process ends the loop (`TrialTerminated`)
        after the trial's save; by default the trial is preempted and relaunched, as a
        subprocess trial would be (for a program whose SIGTERM means "stop", `jaxcore run`)."""
        self.loop: Any = None  # set by the experiment loop
        self.stop_on_sigterm = stop_on_sigterm
        self._done: list[tuple[int, int]] = []

    def capacity(self) -> int:
        return 1

    def launch(self, trial_id: int, env: dict[str, str], log_path: pathlib.Path) -> int | None:
        from jaxcore.experiments.runner import call_entrypoint
        from jaxcore.experiments.trial_context import TrialContext

        ctx = TrialContext(store=self.loop.store, trial_id=trial_id, channel=self.loop.channel)
        code = 0
        try:
            call_entrypoint(self.loop.entrypoint, ctx)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception:
            code = 1
            failure = traceback.format_exc()
            try:
                log_path.parent.mkdir(parents=True, exist_ok=True)
                with open(log_path, "a") as f:
                    f.write(failure)
            except OSError as e:  # a full disk must not turn the trial's error into ours
                log.error("trial %d: could not append its failure to %s: %s", trial_id, log_path, e)
            log.warning("trial %d failed:\n%s", trial_id, failure)
        finally:
            ctx.close()
        if ctx.terminated and self.stop_on_sigterm:
            # Relaunching the trial would swallow the SIGTERM (a `docker stop` or a Slurm
            # preemption would be ignored); the experiment is left to resume, as after a kill.
            raise TrialTerminated(
                f"SIGTERM: trial {trial_id} exited with {code}; a resume continues from its save"
            )
        self._done.append((trial_id, code))
        return None

    def poll(self) -> list[tuple[int, int]]:
        done, self._done = self._done, []
        return done


class SubprocessTrialExecutor(TrialExecutor):
    """Trial subprocesses on this machine, each with its own device slot."""

    def __init__(
        self, *, devices_per_trial: int = 1, slots: int | None = None, platform: str | None = None
    ):
        detected, count = detect_platform() if platform is None or slots is None else (platform, 0)
        self.platform = platform or detected
        self.total = slots or count
        self.per_trial = devices_per_trial
        self.free = list(range(self.total))
        self.procs: dict[int, tuple[subprocess.Popen, list[int], Any]] = {}

    def capacity(self) -> int:
        return max(1, self.total // self.per_trial)

    def launch(self, trial_id: int, env: dict[str, str], log_path: pathlib.Path) -> int | None:
        devices, self.free = self.free[: self.per_trial], self.free[self.per_trial :]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")  # noqa: SIM115 (held open for the process's life)
        out.write(f"=== trial {trial_id} on {self.platform} devices {devices} ===\n".encode())
        out.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxcore.experiments.runner"],
            env=trial_env(self.platform, devices, env),
            stdout=out,
            stderr=subprocess.STDOUT,
            # Own process group (signalled as one) that dies with this process.
            preexec_fn=_group_dying_with(os.getpid()),
        )
        self.procs[trial_id] = (proc, devices, out)
        return proc.pid

    def poll(self) -> list[tuple[int, int]]:
        done = []
        for trial_id, (proc, devices, out) in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            out.close()
            self.free = sorted(self.free + devices)
            del self.procs[trial_id]
            done.append((trial_id, code))
        return done

    def signal(self, trial_id: int, sig: int) -> None:
        if trial_id in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.procs[trial_id][0].pid, sig)

    def running(self) -> set[int]:
        return set(self.procs)

    def close(self) -> None:
        for trial_id in list(self.procs):
            self.signal(trial_id, signal.SIGKILL)
        for proc, _, out in self.procs.values():
            proc.wait()
            out.close()
        self.procs.clear()


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int | None = None) -> None:
    """Linux: this (child) process gets SIGKILL when its parent dies.

    Runs between fork and exec. If the parent died before the ``prctl`` took effect the
    signal never comes, so the parent pid is checked afterwards (the race documented
    in ``prctl(2)``). Elsewhere (macOS) a no-op.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def _group_dying_with(parent: int) -> Any:
    def setup() -> None:
        os.setsid()
        _die_with_parent(parent)

    return setup


def _ray_trial(env: dict[str, str], log_path: str) -> int:
    """A Ray task: run the trial in a child process (fresh JAX, its own devices)."""
    pathlib.Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxcore.experiments.runner"],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()


class RayTrialExecutor(TrialExecutor):
    """Trials as Ray tasks on a cluster (``ray.init(address)``); the store must be shared.

    Each task asks Ray for ``devices`` GPUs (``num_gpus``) when the cluster has GPUs, or
    one CPU otherwise; Ray sets ``CUDA_VISIBLE_DEVICES`` for it. Use a PostgreSQL URL
    (or a shared filesystem for SQLite) so every node reaches the store.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        devices_per_trial: int = 1,
        max_concurrent: int | None = None,
    ):
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "--executor ray: Ray is not installed here; pip install 'ray==2.60.0' "
                "(the version jaxcore's data-ray extra pins), or use --executor local."
            ) from None
        self.ray = ray
        if not ray.is_initialized():
            try:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
            except ConnectionError as e:  # `--ray-address auto` and no cluster: a traceback
                raise ConfigError(
                    f"--ray-address {address}: {e} Start one with `ray start --head`, or leave "
                    "--ray-address out to start a local Ray for this command."
                ) from None
        resources = ray.cluster_resources()
        self.gpus = int(resources.get("GPU", 0))
        self.per_trial = devices_per_trial
        cpus = int(resources.get("CPU", 1))
        fit = self.gpus // devices_per_trial if self.gpus else cpus
        self.cap = max(1, min(fit, max_concurrent or fit))
        self.refs: dict[int, Any] = {}

    def capacity(self) -> int:
        return self.cap

    def launch(self, trial_id: int, env: dict[str, str], log_path: pathlib.Path) -> int | None:
        if self.gpus:
            task = self.ray.remote(num_gpus=self.per_trial, num_cpus=1)(_ray_trial)
        else:
            task = self.ray.remote(num_cpus=1)(_ray_trial)
            env = trial_env("cpu", list(range(self.per_trial)), env)
        self.refs[trial_id] = task.remote(env, str(log_path))
        return None

    def poll(self) -> list[tuple[int, int]]:
        if not self.refs:
            return []
        ready, _ = self.ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=0)
        done = []
        for trial_id, ref in list(self.refs.items()):
            if ref in ready:
                try:
                    code = int(self.ray.get(ref))
                except Exception as e:  # the task (or its node) died
                    log.warning("trial %d: Ray task failed: %s", trial_id, e)
                    code = 1
                del self.refs[trial_id]
                done.append((trial_id, code))
        return done

    def signal(self, trial_id: int, sig: int) -> None:
        # Ray cannot deliver a signal to a task's child; a kill cancels the task (its
        # child is killed with it), a preemption goes through the store (paused state).
        if sig == signal.SIGKILL and trial_id in self.refs:
            self.ray.cancel(self.refs[trial_id], force=True)

    def running(self) -> set[int]:
        return set(self.refs)

    def close(self) -> None:
        for ref in self.refs.values():
            self.ray.cancel(ref, force=True)
        self.refs.clear()
