"""Shared benchmark plumbing: alternating timing, a printed table, results JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


# Steps each turn runs before its timed ones. The first step after another program's turn
# pays for what that program left in the caches and the heap, a cost of neither program
# and not of training, where steps run back to back. Measured (2026-12-04, pipeline_bubble's
# five programs, 5 rounds): M=4's first step of a turn took 3.47 s (median) against 2.07 s
# for the next two; in mfu_cpu.py (which keeps its own in-process turns) the d=512 step
# after the peak's matmuls took 6.4-7.3 s, after its own step 4.7-5.2 s.
UNTIMED_STEPS_PER_TURN = 1


def rotated(items: Sequence, r: int) -> list:
    """``items`` rotated by ``r``: round r's order, so no program always follows another."""
    k = r % len(items)
    return [*items[k:], *items[:k]]


def time_alternating(
    fns: dict[str, Callable[[], None]],
    *,
    rounds: int,
    steps: int,
    untimed: int = UNTIMED_STEPS_PER_TURN,
) -> dict[str, float]:
    """Median seconds per call of each function, run in turns so drifting machine load
    hits every variant alike (the machines are shared: only ratios from one run count).
    Each turn runs ``untimed`` calls first; the order rotates every round."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in rotated(list(fns), r):
            fn = fns[name]
            for _ in range(untimed):
                fn()
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            samples[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(s) for name, s in samples.items()}


# A reply line of a step worker (JAX and torch may print to stdout too).
PROTOCOL = "@@ "


class StepWorker:
    """One program in its own process, built and warmed up, timing one step per request.

    Programs that share a process disturb each other. On a quiet machine the pipeline
    benchmark's M=16 step took 1.45-1.8 s with its five programs in one process against
    1.28-1.32 s alone, and the 26M model's jaxcore/torch ratio read 0.85-0.86 with both
    frameworks in one process against 0.885-0.935 with one each (same code, same host;
    benchmarks/training_speed.md). A process per program keeps each one's heap and caches
    its own; taking turns (`time_in_turns`) keeps what one process was for: drifting
    machine load hits every program alike.
    """

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None):
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.info = self._reply()  # blocks until built, compiled and warmed up

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                return json.loads(line[len(PROTOCOL) :])
        code = self.proc.wait()
        raise RuntimeError(f"{self.name}: the worker exited with code {code} before replying")

    def step(self) -> tuple[float, float]:
        """Wall and CPU seconds of one call of the program, timed inside the worker."""
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        reply = self._reply()
        return reply["wall"], reply["cpu"]

    def close(self) -> None:
        """End the worker (its stdin closing ends its loop); kill it if it does not exit."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def serve_steps(run: Callable[[], None], info: dict | None = None, warmup: int = 3) -> None:
    """The worker's side: ``run()`` ``warmup`` times (compile, first-run allocations), say
    ``info`` with the first call's seconds, then time one ``run()`` per request on stdin."""
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        run()
    print(PROTOCOL + json.dumps({**(info or {}), "first_call_s": first}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        reply = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
        print(PROTOCOL + json.dumps(reply), flush=True)


def time_in_turns(
    workers: Sequence[StepWorker],
    rounds: int,
    steps: int = 1,
    untimed: int = UNTIMED_STEPS_PER_TURN,
) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds per step of each worker: ``untimed`` steps that are not
    recorded, then ``steps`` timed ones per turn, one turn each per round, in an order
    rotated every round so no program always follows another."""
    samples = {w.name: {"wall": [], "cpu": []} for w in workers}
    for r in range(rounds):
        for w in rotated(workers, r):
            for _ in range(untimed):
                w.step()
            for _ in range(steps):
                wall, cpu = w.step()
                samples[w.name]["wall"].append(wall)
                samples[w.name]["cpu"].append(cpu)
    return samples


@dataclasses.dataclass(frozen=True)
class Turns:
    """What `run_in_turns` measured: per program its samples (pooled over its processes),
    the median wall seconds of each of its processes, and its first process's warm-up
    reply."""

    samples: dict[str, dict[str, list[float]]]
    info: dict[str, dict]
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    process_medians: dict[str, list[float]]


def run_in_turns(
    programs: Sequence[tuple[str, Sequence[str]]],
    rounds: int,
    steps: int = 1,
    untimed: int = UNTIMED_STEPS_PER_TURN,
    processes: int = 1,
) -> Turns:
    """Start ``processes`` `StepWorker` per ``(name, argv)``, one at a time (nothing
    compiles while another is timed), time them with `time_in_turns`, and end every worker
    started, also when one fails. The load average is read around the timed turns only.

    Why more than one process per program: the same program's processes can settle at
    different speeds for their whole life (the pipeline benchmark's M=16 had process
    medians of 1,999 and 1,674 ms in one run; 1,368-1,442 ms over five others), a spread
    larger than the 8% theory puts between M=16 and M=32. Pooling the samples of several
    processes measures the program, not the luck of one process.
    """
    if processes < 1:
        raise ValueError(f"processes={processes}: run each program in at least 1 process")
    label = lambda name, k: name if processes == 1 else f"{name} #{k + 1}"
    workers: list[StepWorker] = []
    try:
        for name, argv in programs:
            for k in range(processes):
                workers.append(StepWorker(label(name, k), argv))
                print(f"{label(name, k)}: built and warmed up", file=sys.stderr, flush=True)
        load_start = os.getloadavg()
        per_process = time_in_turns(workers, rounds, steps, untimed)
        names = [name for name, _ in programs]
        runs = {name: [per_process[label(name, k)] for k in range(processes)] for name in names}
        samples = {
            name: {c: [x for run in runs[name] for x in run[c]] for c in ("wall", "cpu")}
            for name in names
        }
        medians = {n: [statistics.median(run["wall"]) for run in runs[n]] for n in names}
        info = {name: workers[i * processes].info for i, name in enumerate(names)}
        return Turns(samples, info, load_start, os.getloadavg(), medians)
    finally:
        for w in workers:
            w.close()


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        **payload,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {path}")
    return path


def stdlib_batch(batch: int, seq: int, seed: int = 0) -> dict:
    """One packed batch of the stdlib's source bytes as NumPy arrays (real text)."""
    import jaxcore as jc

    loader = jc.Loader(
        jc.stdlib_source(), jc.InputConfig(global_batch_size=batch, seq_len=seq, seed=seed)
    )
    try:
        return next(loader)
    finally:
        loader.close()
