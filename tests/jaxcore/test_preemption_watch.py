"""`jc.PreemptionWatch.stop_at`: what a loop that saves its own way polls after each step
(one process here; several are driven through `jaxcore rlhf` in
tests/rlhf/test_offpath_stop37.py)."""

from __future__ import annotations

import os
import signal

import jaxcore as jc


def test_stop_at_turns_true_after_a_sigterm_and_the_handler_is_given_back():
    before = signal.getsignal(signal.SIGTERM)
    watch = jc.PreemptionWatch(install=True)
    try:
        assert not watch.stop_at(1)
        os.kill(os.getpid(), signal.SIGTERM)  # recorded, not fatal
        assert watch.stop_at(2) and watch.stop_at(3)
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGTERM) is before
