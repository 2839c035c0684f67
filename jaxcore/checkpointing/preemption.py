"""When to write the final checkpoint: one decision, agreed by every process.

With several processes (``jax.distributed`` initialized), SIGTERM is JAX's business: its
coordination service installs a preemption notifier (a C++ SIGTERM handler) that tells
every process, and ``multihost_utils.reached_preemption_sync_point(step)`` (what Orbax's
``reached_preemption`` calls) turns true on all of them at the same step, the one after
the largest step any process had reached. A Python ``signal.signal`` handler would replace
that notifier -- the SIGTERM would then reach one process only, which cannot save alone
without deadlocking the others' collectives -- so none is installed.

A single process has no coordination service: there, and only there, a Python handler
sets a flag and the next save is the final one. Both paths end in the same place: the
step's save, then `Preempted` (exit code 75).

Ctrl-C is held while a save runs (`sigint_deferred`), so an interrupt never leaves a step
half-written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import jax

log = logging.getLogger(__name__)


def distributed() -> bool:
    """Whether this process is part of a ``jax.distributed`` run (JAX owns SIGTERM)."""
    return bool(jax.distributed.is_initialized()) or jax.process_count() > 1


class PreemptionWatch:
    """Says, at a step, whether the run was asked to stop (SIGTERM / JAX's notice)."""

    def __init__(self, *, install: bool):
        self._sigterm = False
        self._handler: Any = None
        self._previous: Any = None
        if not install:
            return
        if distributed():
            if not jax.config.jax_enable_preemption_service:
                log.warning(
                    "jax_enable_preemption_service is off: a SIGTERM will stop this run "
                    "without a final checkpoint. Turn it on to save on preemption."
                )
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("Checkpointer created off the main thread: no SIGTERM handler.")
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            self.request()

        self._handler = on_sigterm
        self._previous = signal.signal(signal.SIGTERM, on_sigterm)

    def request(self) -> None:
        """Act as if SIGTERM arrived: the next save (of a single process) is the final one."""
        self._sigterm = True
        log.warning("preemption requested: the next save() writes a final checkpoint.")

    @property
    def requested(self) -> bool:
        """Whether this (single) process received a SIGTERM not yet acted on."""
        return self._sigterm

    def stop_at(self, step: int) -> bool:
        """Whether a loop that saves its own way stops after ``step``; call it at every step.

        One process: a SIGTERM arrived. Several: JAX's preemption sync point, true at the
        same step on every process (each must call it at every step; never true with the
        preemption service off, which the constructor warns about).
        """
        if not distributed():
            return self._sigterm
        if not jax.config.jax_enable_preemption_service:
            return False
        from jax.experimental import multihost_utils

        return bool(multihost_utils.reached_preemption_sync_point(step))

    def reached(self, step: int, manager: Any) -> bool:
        """Whether ``step`` is the one to save before stopping (the same on every process)."""
        if manager.reached_preemption(step):
            return True
        # A process decides alone only when it is alone; otherwise processes could
        # disagree about the step and deadlock in the save's collectives.
        return self._sigterm and not distributed()

    def close(self) -> None:
        """Give SIGTERM back to whoever had it (unless someone replaced us meanwhile)."""
        if self._handler is not None and signal.getsignal(signal.SIGTERM) is self._handler:
            signal.signal(signal.SIGTERM, self._previous)
        self._handler = None


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, then deliver it to the handler it was meant for.

    A KeyboardInterrupt inside an Orbax save left the step half-written and Orbax's threads
    on a closed event loop (dozens of "Event loop is closed" tracebacks at exit); around a
    save, the save completes and the interrupt follows it. Off the main thread (where
    Python delivers no signal) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending and callable(previous):
        previous(signal.SIGINT, None)
    elif pending and previous == signal.SIG_DFL:  # the default action: end the process
        os.kill(os.getpid(), signal.SIGINT)
