"""Property tests: torch's LR schedulers as torchbridge schedules, against torch itself.

For random hyperparameters, and after a random number of steps already taken in torch
before the bridge reads the scheduler, the bridged schedule's learning rate at each step
equals the one torch's scheduler gives its optimizer at that step.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbridge.optim import schedule_of

STEPS = 60


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr, momentum=0.9)


def _torch_lrs(make, lr: float, taken: int, steps: int) -> list[float]:
    opt = _optimizer(lr)
    sched = make(opt)
    lrs = []
    for _ in range(taken + steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs[taken:]


def _bridged_lrs(make, lr: float, taken: int, steps: int) -> list[float]:
    opt = _optimizer(lr)
    sched = make(opt)
    for _ in range(taken):
        opt.step()
        sched.step()
    schedule, _ = schedule_of(sched, 0, schedule_steps=steps)
    return [float(schedule(n)) for n in range(steps)]


S = torch.optim.lr_scheduler
schedulers = st.one_of(
    st.builds(
        lambda size, gamma: lambda o: S.StepLR(o, step_size=size, gamma=gamma),
        st.integers(1, 20),
        st.floats(0.1, 1.0),
    ),
    st.builds(
        lambda t_max, eta: lambda o: S.CosineAnnealingLR(o, T_max=t_max, eta_min=eta),
        st.integers(1, 80),
        st.floats(0.0, 1e-3),
    ),
    st.builds(
        lambda start, end, total: (
            lambda o: S.LinearLR(o, start_factor=start, end_factor=end, total_iters=total)
        ),
        st.floats(0.05, 1.0),
        st.floats(0.05, 1.0),
        st.integers(1, 40),
    ),
    st.builds(
        lambda peak, pct, strategy, div, three: (
            lambda o: S.OneCycleLR(
                o,
                max_lr=peak,
                total_steps=3 * STEPS,
                pct_start=pct,
                anneal_strategy=strategy,
                div_factor=div,
                three_phase=three,
            )
        ),
        st.floats(1e-3, 1.0),
        st.floats(0.05, 0.45),
        st.sampled_from(["cos", "linear"]),
        st.floats(2.0, 50.0),
        st.booleans(),
    ),
    st.builds(
        lambda warm, total: (
            lambda o: S.LambdaLR(o, lambda s: min(1.0, (s + 1) / warm) * max(0.0, 1 - s / total))
        ),
        st.integers(1, 20),
        st.integers(30, 200),
    ),
)


@settings(max_examples=80, deadline=None)
@given(make=schedulers, lr=st.floats(1e-4, 1.0), taken=st.integers(0, 30))
def test_bridged_schedules_give_torchs_learning_rates(make, lr, taken):
    want = _torch_lrs(make, lr, taken, STEPS)
    got = _bridged_lrs(make, lr, taken, STEPS)
    assert all(math.isfinite(x) for x in got)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-8)
