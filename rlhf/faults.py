"""Deterministic fault injection for the resume tests of ``jaxcore rlhf``.

``JAXCORE_RLHF_KILL_AT`` and ``JAXCORE_RLHF_TERM_AT`` hold comma-separated
``<iteration>:<point>`` entries; at each named point the process sends itself SIGKILL
(a crash) or SIGTERM (a preemption notice). Points: ``step`` (iteration ``i`` about to
run), ``before_save`` (iteration's metrics written, its checkpoint not begun), ``saving``
(inside the save: roles written, the step not yet marked complete), ``saved`` (checkpoint
complete). For SFT, reward and DPO the iteration is the batch index.

With several processes every one reads the same variables: ``<iteration>:<point>@<rank>``
fires in process ``<rank>`` only (``JAXCORE_PROCESS_ID``), and ``@parent`` signals the
parent instead (the `jaxcore launch` that started the processes: a scheduler's SIGTERM).
"""

from __future__ import annotations

import os
import signal

KILL_ENV = "JAXCORE_RLHF_KILL_AT"
TERM_ENV = "JAXCORE_RLHF_TERM_AT"


def fault_point(iteration: int, point: str) -> None:
    """Signal this process (or its parent) when an injection variable names this point."""
    here = f"{iteration}:{point}"
    rank = os.environ.get("JAXCORE_PROCESS_ID", "0")
    for env, sig in ((KILL_ENV, signal.SIGKILL), (TERM_ENV, signal.SIGTERM)):
        for entry in os.environ.get(env, "").split(","):
            where, _, target = entry.partition("@")
            if where != here or target not in ("", rank, "parent"):
                continue
            os.kill(os.getppid() if target == "parent" else os.getpid(), sig)
