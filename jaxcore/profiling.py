"""How fast and how big a run is: step time, tokens/s, MFU, memory, traces.

- **MFU** is model FLOPs per second over the devices' peak (PaLM, Chowdhery et al. 2022,
  appendix B). Model FLOPs come from the model's own count
  (`jaxcore.models.training_flops_per_token`), the traced program (`module_table`) or
  XLA's cost analysis (`compiled_flops`); the peak from `PEAK_FLOPS` for known
  accelerators, or `measure_matmul_peak` on the spot (CPUs, unknown parts).
- **Memory** per device from ``device.memory_stats()`` (GPU, TPU); where that is missing
  (CPU) from the live arrays each device holds. `memory_report` aggregates it, and each
  host's resident set size, over all processes.
- **Traces** of a chosen step window with ``jax.profiler`` (`TraceWindow`).
- Ahead-of-time estimates and the per-module table live in `jaxcore.costs` and are
  re-exported here.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import resource
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore.costs import (
    CompileEstimate,
    CostRow,
    CostTable,
    abstract_batch,
    abstract_state,
    compile_estimate,
    compiled_flops,
    estimate_from_compiled,
    function_table,
    module_table,
    topology_devices,
)
from jaxcore.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "PEAK_FLOPS",
    "CompileEstimate",
    "CostRow",
    "CostTable",
    "DeviceMemory",
    "MemoryReport",
    "StepMeter",
    "StepStats",
    "TraceWindow",
    "abstract_batch",
    "abstract_state",
    "compile_estimate",
    "compiled_flops",
    "device_memory",
    "estimate_from_compiled",
    "function_table",
    "host_rss_bytes",
    "measure_matmul_peak",
    "memory_report",
    "mfu",
    "module_table",
    "peak_flops",
    "topology_devices",
]

# Dense (no sparsity) peak FLOP/s per chip from the vendors' datasheets, by the substring
# of `device.device_kind` that identifies the part; more specific names come first.
# "fp32" on NVIDIA parts is the TF32 tensor-core rate XLA uses for float32 matmuls by
# default. CPUs are absent on purpose: measure them (`measure_matmul_peak`).
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("TPU v6 lite", {"bf16": 918e12}),  # Trillium
    ("TPU v5 lite", {"bf16": 197e12}),  # v5e
    ("TPU v5p", {"bf16": 459e12}),
    ("TPU v5", {"bf16": 459e12}),
    ("TPU v4", {"bf16": 275e12}),
    ("TPU v3", {"bf16": 123e12}),
    ("GB200", {"bf16": 2500e12, "fp32": 1250e12}),
    ("B200", {"bf16": 2250e12, "fp32": 1100e12}),
    ("H200", {"bf16": 989e12, "fp32": 494e12}),
    ("H100 PCIe", {"bf16": 756e12, "fp32": 378e12}),
    ("H100", {"bf16": 989e12, "fp32": 494e12}),  # SXM
    ("A100", {"bf16": 312e12, "fp32": 156e12}),
    ("L40S", {"bf16": 362e12, "fp32": 183e12}),
    ("L4", {"bf16": 121e12, "fp32": 60e12}),
    ("A10", {"bf16": 125e12, "fp32": 62.5e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
)
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _dtype_name(dtype: Any) -> str:
    name = str(jnp.dtype(dtype)) if not isinstance(dtype, str) else dtype
    return _DTYPE_NAMES.get(name, name)


def peak_flops(device: jax.Device | None = None, dtype: Any = "bf16") -> float | None:
    """The datasheet peak FLOP/s of one ``device`` for matmuls in ``dtype`` (or ``None``)."""
    device = device or jax.devices()[0]
    kind = device.device_kind
    want = _dtype_name(dtype)
    for key, peaks in PEAK_FLOPS:
        if key.lower() in kind.lower():
            if want in peaks:
                return peaks[want]
            if want == "bf16" and "fp16" in peaks:
                return peaks["fp16"]
            return None
    return None


def measure_matmul_peak(
    size: int | None = None,
    dtype: Any = jnp.float32,
    *,
    device: jax.Device | None = None,
    chain: int = 4,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Measure the FLOP/s of square matmuls on ``device`` (best of ``repeats``).

    ``chain`` dependent matmuls run inside one jitted call, so dispatch and transfer
    costs vanish next to the arithmetic. This is the denominator the MFU benchmark uses
    on CPUs, where no datasheet number applies (PERF-NOTES.md: ~180 GFLOP/s f32 here).
    ``clock=time.process_time`` measures FLOPs per CPU-second of this process instead:
    on a shared machine that is what is comparable with a step timed the same way.
    """
    device = device or jax.devices()[0]
    if size is None:
        size = 2048 if device.platform == "cpu" else 8192
    key = jax.random.key(0)
    # Scaled so that repeated products stay O(1): no overflow, no denormal slow paths.
    a = jax.device_put(jax.random.normal(key, (size, size), dtype), device)
    b = jax.device_put(
        (jax.random.normal(jax.random.fold_in(key, 1), (size, size)) / np.sqrt(size)).astype(dtype),
        device,
    )

    @jax.jit
    def run(x, y):
        return jax.lax.fori_loop(0, chain, lambda _, acc: acc @ y, x)

    run(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = clock()
        run(a, b).block_until_ready()
        times.append(clock() - t0)
    return 2.0 * size**3 * chain / min(times)


def mfu(flops_per_step: float, step_time_s: float, peak_flops_total: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all devices used."""
    if step_time_s <= 0 or peak_flops_total <= 0:
        raise ConfigError(
            f"mfu: step_time_s={step_time_s} and peak_flops_total={peak_flops_total} "
            "must both be positive."
        )
    return flops_per_step / step_time_s / peak_flops_total


@dataclasses.dataclass(frozen=True)
class StepStats:
    """Speed of the steps measured so far (means over the recent window)."""

    step: int
    step_time_s: float
    tokens_per_s: float | None
    flops_per_s: float | None
    mfu: float | None


class StepMeter:
    """Times training steps and turns them into tokens/s and MFU.

        meter = StepMeter(tokens_per_step=B * T, flops_per_step=6 * N * B * T,
                          peak_flops=measure_matmul_peak() * jax.device_count())
        for step in range(steps):
            state, metrics = train_step(state, batch)
            stats = meter.update(metrics)   # blocks on metrics every `every` steps

    The first ``warmup`` steps (compilation) are left out of the averages; ``window``
    steps are averaged. Blocking only every ``every`` steps keeps JAX's async dispatch
    running ahead between measurements.
    """

    def __init__(
        self,
        *,
        tokens_per_step: float | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
        warmup: int = 1,
        window: int = 20,
        every: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if every < 1 or window < 1 or warmup < 0:
            raise ConfigError(
                f"StepMeter: every={every} and window={window} must be >= 1, warmup={warmup} >= 0."
            )
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self.peak_flops = peak_flops
        self.warmup = warmup
        self.every = every
        self.clock = clock
        self.steps = 0
        self.times: deque[float] = deque(maxlen=window)
        self._last = clock()
        self._since = 0

    def reset_clock(self) -> None:
        """Start timing from now (e.g. after evaluation or a checkpoint save)."""
        self._last = self.clock()
        self._since = 0

    def update(self, outputs: Any = None) -> StepStats | None:
        """Count one step; on every ``every``-th, wait for ``outputs`` and return stats."""
        self.steps += 1
        self._since += 1
        if self._since < self.every and self.steps > self.warmup:
            return None
        if outputs is not None:
            jax.block_until_ready(outputs)
        now = self.clock()
        per_step = (now - self._last) / self._since
        self._last, self._since = now, 0
        if self.steps > self.warmup:
            self.times.append(per_step)
        return self.stats()

    def stats(self) -> StepStats | None:
        """Averages over the window (``None`` before the first timed step)."""
        if not self.times:
            return None
        t = statistics.fmean(self.times)
        tokens = self.tokens_per_step / t if self.tokens_per_step else None
        flops = self.flops_per_step / t if self.flops_per_step else None
        util = mfu(self.flops_per_step, t, self.peak_flops) if flops and self.peak_flops else None
        return StepStats(self.steps, t, tokens, flops, util)


# ------------------------------------------------------------------------------- memory
@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """Memory of one device.

    ``source`` is ``memory_stats`` (the runtime allocator: includes temporaries) or
    ``arrays`` (live arrays only; ``peak`` is then the largest value seen by this module).
    """

    device: str
    process: int
    in_use: int
    peak: int | None
    limit: int | None
    source: str


_array_peaks: dict[int, int] = {}


def _array_bytes(devices: Sequence[jax.Device]) -> dict[int, int]:
    ids = {d.id for d in devices}
    totals = dict.fromkeys(ids, 0)
    for arr in jax.live_arrays():
        try:
            shards = arr.addressable_shards
        except Exception:  # deleted or donated while we looked
            continue
        for s in shards:
            if s.device.id in ids:
                totals[s.device.id] += s.data.nbytes
    return totals


def device_memory(devices: Sequence[jax.Device] | None = None) -> list[DeviceMemory]:
    """Memory in use and peak for this process's devices (or ``devices``)."""
    devices = list(jax.local_devices() if devices is None else devices)
    out: list[DeviceMemory] = []
    missing = []
    for d in devices:
        stats = None
        try:
            stats = d.memory_stats()
        except Exception:  # backends without allocator statistics
            stats = None
        if stats and "bytes_in_use" in stats:
            out.append(
                DeviceMemory(
                    str(d),
                    d.process_index,
                    int(stats["bytes_in_use"]),
                    int(stats.get("peak_bytes_in_use", stats["bytes_in_use"])),
                    int(stats["bytes_limit"]) if "bytes_limit" in stats else None,
                    "memory_stats",
                )
            )
        else:
            missing.append(d)
    if missing:
        used = _array_bytes(missing)
        for d in missing:
            _array_peaks[d.id] = max(_array_peaks.get(d.id, 0), used[d.id])
            out.append(
                DeviceMemory(
                    str(d), d.process_index, used[d.id], _array_peaks[d.id], None, "arrays"
                )
            )
    return out


def host_rss_bytes() -> tuple[int, int]:
    """This process's resident set size now and at its peak, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    try:
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        now = peak
    # ru_maxrss is updated lazily by the kernel; the current value can be ahead of it.
    return now, max(peak, now)


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Memory over all processes: the fullest device, the total, and the hosts."""

    max_in_use: int
    max_peak: int
    total_in_use: int
    num_devices: int
    max_host_rss: int
    max_host_rss_peak: int
    source: str

    def short(self) -> str:
        gib = 2**30
        return (
            f"dev {self.max_in_use / gib:.2f}/{self.max_peak / gib:.2f} GiB "
            f"(max in use/peak), host {self.max_host_rss / gib:.2f} GiB"
        )


def memory_report(devices: Sequence[jax.Device] | None = None) -> MemoryReport:
    """Device and host memory aggregated over all processes (a collective when several)."""
    local = device_memory(devices)
    rss, rss_peak = host_rss_bytes()
    row = np.array(
        [
            max((m.in_use for m in local), default=0),
            max((m.peak or m.in_use for m in local), default=0),
            sum(m.in_use for m in local),
            len(local),
            rss,
            rss_peak,
        ],
        dtype=np.int64,
    )
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        rows = np.asarray(multihost_utils.process_allgather(row)).reshape(-1, row.size)
    else:
        rows = row[None]
    sources = sorted({m.source for m in local})
    return MemoryReport(
        max_in_use=int(rows[:, 0].max()),
        max_peak=int(rows[:, 1].max()),
        total_in_use=int(rows[:, 2].sum()),
        num_devices=int(rows[:, 3].sum()),
        max_host_rss=int(rows[:, 4].max()),
        max_host_rss_peak=int(rows[:, 5].max()),
        source="+".join(sources) or "none",
    )


# ------------------------------------------------------------------------------- traces
def _reset_profiler() -> None:
    """Free jax.profiler after a failed ``stop_trace``: it raises before clearing its
    state, and every later ``start_trace`` in the process then fails with "Profile has
    already been started"."""
    from jax._src import profiler as _jax_profiler

    state = getattr(_jax_profiler, "_profile_state", None)
    if state is not None and hasattr(state, "reset"):
        state.reset()


def _run_folder_taken(log_dir: Path) -> bool:
    """Whether the folder jax.profiler would export a trace stopping now to exists (it is
    named after the second, in local time or UTC depending on the build)."""
    now = time.time()
    return any(
        (log_dir / "plugins" / "profile" / time.strftime("%Y_%m_%d_%H_%M_%S", t)).exists()
        for t in (time.localtime(now), time.gmtime(now))
    )


class TraceWindow:
    """Capture a ``jax.profiler`` trace of steps ``start .. start + num_steps - 1``.

        trace = TraceWindow("/tmp/trace", start=10, num_steps=3)
        for step in range(steps):
            with trace.step(step):
                state, metrics = train_step(state, batch)
            trace.after(step, metrics)
        trace.close()

    Skipping the first steps keeps compilation out of the trace. Each window writes
    ``plugins/profile/<time>/<host>.xplane.pb`` (TensorBoard's profile plugin, xprof) and
    ``<host>.trace.json.gz`` (Chrome trace JSON: Perfetto, ``chrome://tracing``) under
    ``log_dir``; with several processes each writes under ``log_dir/process_<i>``, since
    processes on one host would share the file name. A run resumed inside the window
    traces the rest of it; a process that exits inside the window (``Preempted``,
    ``sys.exit``) writes the steps traced so far; a window the run never reaches, or a
    trace that cannot be written (read-only or full disk), is one warning line and
    training continues. A killed process (SIGKILL) writes nothing.
    """

    def __init__(self, log_dir: str | os.PathLike, *, start: int = 3, num_steps: int = 3):
        if start < 0 or num_steps < 1:
            raise ConfigError(
                f"TraceWindow(start={start}, num_steps={num_steps}): start must be >= 0 and "
                "num_steps >= 1."
            )
        self.log_dir = Path(log_dir)
        try:  # now, not when the window opens mid-run
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"TraceWindow: cannot create {self.log_dir} ({e.strerror}); give a directory "
                "this process can write."
            ) from None
        self.start, self.stop_after = start, start + num_steps - 1
        self.active = False
        self.done = False
        self.trace_dir: Path | None = None  # where the trace goes (set when it opens)
        self._last_step: int | None = None

    def _window(self) -> str:
        return f"steps {self.start}..{self.stop_after}"

    def _never_opened(self, why: str) -> None:
        self.done = True
        log.warning(
            "TraceWindow(%s): %s; no trace written to %s.", self._window(), why, self.log_dir
        )

    def _open(self, step: int) -> None:
        count = jax.process_count()
        trace_dir = self.log_dir / f"process_{jax.process_index()}" if count > 1 else self.log_dir
        try:  # fail here, before tracing, where the directory cannot take a trace
            (trace_dir / "plugins" / "profile").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.done = True
            log.warning(
                "TraceWindow(%s): cannot write a trace under %s (%s); training continues "
                "without it.",
                self._window(),
                trace_dir,
                e.strerror or e,
            )
            return
        try:
            jax.profiler.start_trace(str(trace_dir))
        except RuntimeError as e:  # "Profile has already been started": one per process
            self.done = True
            log.warning(
                "TraceWindow(%s): not traced, another trace is running in this process "
                "(%s); training continues. Make the windows not overlap.",
                self._window(),
                str(e).splitlines()[0],
            )
            return
        self.trace_dir, self.active = trace_dir, True
        # A run that exits inside the window (`Preempted` after a SIGTERM, sys.exit, an
        # exception outside `step`) still writes the steps it traced.
        atexit.register(self._at_exit)
        log.info("profiler trace started at step %d -> %s", step, trace_dir)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Context for one step: starts the trace in the window and annotates the step.

        The trace opens at the first step in the window (``start``, or a later one when
        the run resumed inside it). A step that raises ends the window: the trace so far
        is written and the profiler is free for the next one (it allows one trace per
        process at a time).
        """
        self._last_step = step
        if self.active and step > self.stop_after:
            # A loop that never calls `after` (the window's last step is over): stop here,
            # not at exit with every later step in the trace.
            self._stop()
        if not self.active and not self.done:
            if self.start <= step <= self.stop_after:
                self._open(step)
            elif step > self.stop_after:
                self._never_opened(f"this run started at step {step}, after the window")
        try:
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                yield
        except BaseException:
            self.close()
            raise

    def after(self, step: int, outputs: Any = None) -> None:
        """Call after the step: stops the trace (waiting for ``outputs``) at its last step.

        Without it the trace stops when the step after the window starts (its last
        step's device work may then be cut short)."""
        if self.active and step >= self.stop_after:
            jax.block_until_ready(outputs)
            self._stop()

    def _at_exit(self) -> None:
        if self.active:
            log.warning(
                "TraceWindow(%s): the process is exiting at step %s, inside the window; "
                "writing the trace so far to %s.",
                self._window(),
                self._last_step,
                self.trace_dir,
            )
            self._stop()

    def _stop(self) -> None:
        assert self.trace_dir is not None
        atexit.unregister(self._at_exit)
        # jax.profiler names the run folder after the second the trace stops: a second
        # window stopping within the same second would overwrite the first one's files.
        deadline = time.monotonic() + 2.0
        while _run_folder_taken(self.trace_dir) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.active, self.done = False, True
        try:
            jax.profiler.stop_trace()
        except Exception as e:  # unwritable or full disk: the trace is lost, the run is not
            _reset_profiler()
            log.warning(
                "TraceWindow(%s): could not write the trace to %s (%s); training continues "
                "without it.",
                self._window(),
                self.trace_dir,
                str(e).splitlines()[0] if str(e) else type(e).__name__,
            )
            return
        log.info("profiler trace written to %s", self.trace_dir)

    def close(self) -> None:
        """Stop a trace still running (a loop that ended inside the window); say so when
        the run ended before the window opened."""
        if self.active:
            self._stop()
        elif not self.done:
            last = "no step" if self._last_step is None else f"step {self._last_step}"
            self._never_opened(f"the run ended at {last}, before the window")
