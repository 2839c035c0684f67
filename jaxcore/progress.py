"""A one-line ``rich`` progress display for training, shown by process 0 only.

    with TrainProgress(total_steps=1000) as progress:
        for step in range(1000):
            state, metrics = train_step(state, batch)
            stats = meter.update(metrics)
            progress.update(step + 1, loss=metrics["loss"], stats=stats)

Every process may call it (the loop stays identical on all hosts); the others draw
nothing, so a pod's logs are not flooded with N copies of the same bar.

When the output is not a terminal (a log file, a pipe, the ranks of ``jaxcore launch``,
the processes of ``notebook_launcher``, even with ``FORCE_COLOR``) a live bar cannot
redraw: rich would print its last frame once, at the end, cut to 80 columns, which dropped
the step count and the times (or, forced, a new line per redraw). There it writes plain,
whole lines instead: the first update, then one every ``log_every_s`` seconds, and the
last step at close (as tqdm's ``mininterval`` and Keras' ``verbose=2`` do for logs).
"""

from __future__ import annotations

import time
from typing import Any, TextIO

import jax
import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from jaxcore.profiling import MemoryReport, StepStats


def format_info(
    *,
    loss: Any = None,
    stats: StepStats | None = None,
    memory: MemoryReport | None = None,
) -> str:
    """``loss 2.3456 | 1,234 tok/s | MFU 45.1% | dev 1.20/1.40 GiB ...`` (what is given)."""
    parts = []
    if loss is not None:
        parts.append(f"loss {float(np.asarray(loss)):.4f}")
    if stats is not None:
        if stats.tokens_per_s is not None:
            parts.append(f"{stats.tokens_per_s:,.0f} tok/s")
        else:
            parts.append(f"{stats.step_time_s * 1e3:.0f} ms/step")
        if stats.mfu is not None:
            parts.append(f"MFU {100 * stats.mfu:.1f}%")
    if memory is not None:
        parts.append(memory.short())
    return " | ".join(parts)


def _redraws(console: Console) -> bool:
    """Whether a live bar can redraw on ``console``: a terminal, really. Jupyter kernels
    set ``FORCE_COLOR=1``, which makes rich treat the pipes of `notebook_launcher`'s
    processes as terminals: every redraw became a new line in the cell."""
    try:
        return console.is_terminal and console.file.isatty()
    except (AttributeError, ValueError):  # a file without isatty, or a closed one
        return False


class TrainProgress:
    """Step counter with loss, tokens/s, MFU and memory; a no-op off process 0."""

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        description: str = "train",
        enabled: bool | None = None,
        console: Console | None = None,
        log_every_s: float = 30.0,
    ):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.total_steps = total_steps
        self.description = description
        self.log_every_s = log_every_s
        self.info = ""
        self._progress: Progress | None = None
        self._lines: TextIO | None = None  # plain lines when the output cannot redraw
        self._start = time.monotonic()
        self._logged_at: float | None = None
        self._step: int | None = None
        self._logged_step: int | None = None
        console = console or Console()
        if self.enabled and not (console.is_jupyter or _redraws(console)):
            self._lines = console.file
        elif self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )
            self._task = self._progress.add_task(description, total=total_steps, info="")

    def __enter__(self) -> TrainProgress:
        if self._progress is not None:
            self._progress.start()
        self._start = time.monotonic()
        return self

    def _line(self) -> None:
        total = f"/{self.total_steps}" if self.total_steps is not None else ""
        elapsed = int(time.monotonic() - self._start)
        h, rest = divmod(elapsed, 3600)
        parts = [
            f"{self.description} {self._step}{total}",
            self.info,
            f"{h}:{rest // 60:02d}:{rest % 60:02d}",
        ]
        assert self._lines is not None
        self._lines.write(" | ".join(p for p in parts if p) + "\n")
        self._lines.flush()
        self._logged_at, self._logged_step = time.monotonic(), self._step

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(
        self,
        step: int,
        *,
        loss: Any = None,
        stats: StepStats | None = None,
        memory: MemoryReport | None = None,
    ) -> None:
        """Show ``step`` steps done, with whatever metrics are given."""
        if not self.enabled:
            return
        if loss is not None or stats is not None or memory is not None:
            self.info = format_info(loss=loss, stats=stats, memory=memory)
        self._step = step
        if self._lines is not None:
            now = time.monotonic()
            if self._logged_at is None or now - self._logged_at >= self.log_every_s:
                self._line()
        elif self._progress is not None:
            self._progress.update(self._task, completed=step, info=self.info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self._lines is not None and self._step is not None and self._step != self._logged_step:
            self._line()
