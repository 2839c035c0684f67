"""A one-line ``rich`` progress display for training, shown by process 0 only.

    with TrainProgress(total_steps=1000) as progress:
        for step in range(1000):
            state, metrics = train_step(state, batch)
            stats = meter.update(metrics)
            progress.update(step + 1, loss=metrics["loss"], stats=stats)

Every process may call it (the loop stays identical on all hosts); the others draw
nothing, so a pod's logs are not flooded with N copies of the same bar.
"""

from __future__ import annotations

from typing import Any

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


class TrainProgress:
    """Step counter with loss, tokens/s, MFU and memory; a no-op off process 0."""

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        description: str = "train",
        enabled: bool | None = None,
        console: Console | None = None,
    ):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.total_steps = total_steps
        self.info = ""
        self._progress: Progress | None = None
        if self.enabled:
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
        return self

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
        if self._progress is None:
            return
        if loss is not None or stats is not None or memory is not None:
            self.info = format_info(loss=loss, stats=stats, memory=memory)
        self._progress.update(self._task, completed=step, info=self.info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
