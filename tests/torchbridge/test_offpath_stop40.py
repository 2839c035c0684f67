"""A ported torch training script's scheduler, resume, GAN and AMP habits, bridged.

Each run is compared with the same script in plain torch eager (the oracle): a scheduler
stepped per epoch, ``scheduler.state_dict()`` across a checkpointed resume, schedulers
the bridge cannot evaluate ahead stepped by the loop, two models with two optimizers,
``torch.autocast`` / ``GradScaler`` in the loop, and torch optimizers built with state.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxcore as jc
import torchbridge
from tests.torchbridge.helpers import max_abs_diff_to_torch

S = torch.optim.lr_scheduler


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _pair(make=Net):
    torch.manual_seed(0)
    ours, theirs = make(), make()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _batches(n, rows=8):
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((rows, 4), dtype=np.float32), rng.integers(0, 3, rows))
        for _ in range(n)
    ]


def _torch_step(module, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(module(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    opt.step()


def _bridged(module, opt, scheduler=None):
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, module, opt, scheduler)
    return state, engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))


def _adamw(module):
    return torch.optim.AdamW(module.parameters(), lr=0.05)


# ----------------------------------------------------------------------------- schedulers
def test_a_prepared_scheduler_stepped_per_epoch_is_refused_not_applied_per_step():
    """The ImageNet-script habit: ``scheduler.step()`` once per epoch. A scheduler given to
    prepare is applied per optimizer step inside the step; it used to ignore the loop's
    calls and decay 4x too fast (0.06 away from torch after 2 epochs), silently."""
    ours, _ = _pair()
    opt = _adamw(ours)
    sched = S.StepLR(opt, step_size=2, gamma=0.1)
    state, step = _bridged(ours, opt, sched)
    batches = _batches(5)
    for x, y in batches[:4]:
        state, _ = step(state, (x, y.astype(np.int32)))
    sched.step()  # end of the first epoch
    x, y = batches[4]
    with pytest.raises(
        torchbridge.UnsupportedError, match=r"1 time\(s\) by the loop after 4 "
    ) as e:
        step(state, (x, y.astype(np.int32)))
    assert "do not pass it to torchbridge.prepare" in str(e.value)


@pytest.mark.parametrize(
    "make, per",
    [
        (lambda o: S.StepLR(o, step_size=2, gamma=0.1), 4),  # per epoch of 4 steps
        (lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2), 1),
        (
            lambda o: S.SequentialLR(
                o,
                [S.LinearLR(o, 0.1, total_iters=3), S.CosineAnnealingLR(o, T_max=5)],
                milestones=[3],
            ),
            1,
        ),
        (
            lambda o: S.ChainedScheduler(
                [S.LinearLR(o, 0.1, total_iters=3), S.ExponentialLR(o, 0.9)]
            ),
            1,
        ),
    ],
    ids=["steplr-per-epoch", "warm-restarts", "sequential", "chained"],
)
def test_schedulers_the_loop_steps_itself_match_torch(make, per, recwarn):
    """Not given to prepare, any torch scheduler works as in torch: the loop's
    ``scheduler.step()`` sets ``group["lr"]`` and the next step reads it (torch's
    "lr_scheduler.step() before optimizer.step()" warning used to fire: the bridged step
    is the optimizer step)."""
    ours, theirs = _pair()
    opt, topt = _adamw(ours), _adamw(theirs)
    sched, tsched = make(opt), make(topt)
    state, step = _bridged(ours, opt)
    lrs = set()
    for i, (x, y) in enumerate(_batches(8)):
        state, _ = step(state, (x, y.astype(np.int32)))
        _torch_step(theirs, topt, x, y)
        if (i + 1) % per == 0:
            sched.step()
            tsched.step()
        lrs.add(round(topt.param_groups[0]["lr"], 8))
    assert len(lrs) > 1
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-5
    assert not [w for w in recwarn if "before `optimizer.step()`" in str(w.message)]


def test_a_scheduler_prepare_cannot_evaluate_names_the_loop_path():
    ours, _ = _pair()
    opt = _adamw(ours)
    sched = S.CosineAnnealingWarmRestarts(opt, T_0=3)
    with pytest.raises(torchbridge.UnsupportedError, match=r"call scheduler\.step\(\) in"):
        _bridged(ours, opt, sched)


def test_resume_with_the_schedulers_state_dict_continues_torchs_schedule(tmp_path):
    """A resumed torch script loads ``scheduler.state_dict()`` as well: the restored
    TrainState already counts those steps, and the schedule used to add them again
    (StepLR at step 8 instead of 4: 0.006 away from torch after 4 more steps)."""
    ours, theirs = _pair()
    resumed_model = copy.deepcopy(ours)

    def make(o):
        return S.StepLR(o, step_size=2, gamma=0.5)

    opt, topt = _adamw(ours), _adamw(theirs)
    sched, tsched = make(opt), make(topt)
    state, step = _bridged(ours, opt, sched)
    batches = _batches(8)
    with jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path)) as ckpt:
        for x, y in batches[:4]:
            state, _ = step(state, (x, y.astype(np.int32)))
            sched.step()  # once per optimizer step: what prepare applies too
            _torch_step(theirs, topt, x, y)
            tsched.step()
        ckpt.save(state, force=True)
    saved = sched.state_dict()

    opt2 = _adamw(resumed_model)
    sched2 = make(opt2)
    sched2.load_state_dict(saved)
    state2, step2 = _bridged(resumed_model, opt2, sched2)
    with jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path)) as ckpt:
        state2 = ckpt.restore(4, state2)
    for x, y in batches[4:]:
        state2, _ = step2(state2, (x, y.astype(np.int32)))
        sched2.step()
        _torch_step(theirs, topt, x, y)
        tsched.step()
    assert max_abs_diff_to_torch(state2.params, theirs) < 1e-5


# ----------------------------------------------------------------------------- two models
class GAN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.G = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
        self.D = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


_bce = torch.nn.functional.binary_cross_entropy_with_logits


def test_another_torch_module_called_inside_a_bridged_loss_is_named():
    """GAN habit: G prepared, D a separate module called in G's loss. torchax used to fail
    with an AssertionError about 'mixed math between XLATensor and torch.Tensor'."""
    torch.manual_seed(0)
    gan = GAN()
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, gan.G, torch.optim.Adam(gan.G.parameters(), 1e-2))

    def g_loss(model, batch, rng):
        def run(g, z):
            return _bce(gan.D(g(z)), torch.ones(z.shape[0], 1))

        return model.call(run, batch["z"], rng=rng), {}

    z = np.ones((8, 2), np.float32)
    with pytest.raises(
        torchbridge.UnsupportedError, match=r"module 'Sequential' .*not the one"
    ) as e:
        engine.train_step(g_loss)(state, {"z": z})
    assert "one nn.Module" in str(e.value)


def test_two_models_two_optimizers_alternating_like_a_gan_match_torch():
    """The recipe the error names: one container prepared once per optimizer, each
    optimizer holding its model's parameters, the other's copied in before each step."""
    torch.manual_seed(0)
    gan = GAN()
    ref = copy.deepcopy(gan)
    opt_g, opt_d = (
        torch.optim.Adam(gan.G.parameters(), 1e-2),
        torch.optim.Adam(gan.D.parameters(), 1e-2),
    )
    ref_g, ref_d = (
        torch.optim.Adam(ref.G.parameters(), 1e-2),
        torch.optim.Adam(ref.D.parameters(), 1e-2),
    )
    engine_g = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    engine_d = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state_g = torchbridge.prepare(engine_g, gan, opt_g)
    state_d = torchbridge.prepare(engine_d, gan, opt_d)

    def d_loss(model, batch, rng):
        def run(m, real, z):
            fake = m.G(z).detach()
            return _bce(m.D(real), torch.ones(real.shape[0], 1)) + _bce(
                m.D(fake), torch.zeros(fake.shape[0], 1)
            )

        return model.call(run, batch["real"], batch["z"], rng=rng), {}

    def g_loss(model, batch, rng):
        def run(m, z):
            return _bce(m.D(m.G(z)), torch.ones(z.shape[0], 1))

        return model.call(run, batch["z"], rng=rng), {}

    step_d, step_g = engine_d.train_step(d_loss), engine_g.train_step(g_loss)

    def fresh(params):  # a step donates its state's arrays: hand the other one copies
        return jax.tree.map(jnp.copy, params)

    rng = np.random.default_rng(0)
    for _ in range(3):
        real = rng.standard_normal((8, 4), dtype=np.float32)
        z = rng.standard_normal((8, 2), dtype=np.float32)
        state_d = state_d.replace(params={**state_d.params, "G": fresh(state_g.params["G"])})
        state_d, m_d = step_d(state_d, {"real": real, "z": z})
        state_g = state_g.replace(params={**state_g.params, "D": fresh(state_d.params["D"])})
        state_g, m_g = step_g(state_g, {"z": z})

        zt = torch.from_numpy(z)
        fake = ref.G(zt).detach()
        ref_d.zero_grad()
        ld = _bce(ref.D(torch.from_numpy(real)), torch.ones(8, 1)) + _bce(
            ref.D(fake), torch.zeros(8, 1)
        )
        ld.backward()
        ref_d.step()
        ref_g.zero_grad()
        lg = _bce(ref.D(ref.G(zt)), torch.ones(8, 1))
        lg.backward()
        ref_g.step()
        np.testing.assert_allclose(float(m_d["loss"]), ld.item(), rtol=1e-5)
        np.testing.assert_allclose(float(m_g["loss"]), lg.item(), rtol=1e-5)
    trained = {"G": state_g.params["G"], "D": state_d.params["D"]}
    assert max_abs_diff_to_torch(trained, ref) < 1e-5


# ----------------------------------------------------------------------------- torch.amp
def test_autocast_around_the_step_names_the_engines_precision():
    ours, _ = _pair()
    state, step = _bridged(ours, _adamw(ours))
    x, y = _batches(1)[0]
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(torchbridge.UnsupportedError, match=r"jc\.Engine\(precision='bf16'\)"),
    ):
        step(state, (x, y.astype(np.int32)))


def test_grad_scaler_in_the_loop_on_a_bridged_loss_names_the_engines_fp16():
    """``scaler.scale(loss).backward()`` copied into the loop: the step's loss is a JAX
    array, on which GradScaler failed with 'iteration over a 0-d array'."""
    ours, _ = _pair()
    state, step = _bridged(ours, _adamw(ours))
    x, y = _batches(1)[0]
    state, metrics = step(state, (x, y.astype(np.int32)))
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(torchbridge.UnsupportedError, match=r"jc\.Engine\(precision='fp16'\)"):
        scaler.scale(metrics["loss"])
    assert scaler.scale(torch.ones(())).item() == 2.0**16  # eager torch is untouched


# ----------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize(
    "opt_cls, kw, freeze",
    [
        (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.01}, True),
        (torch.optim.Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.1, "eps": 1e-6}, False),
        (torch.optim.RMSprop, {"lr": 0.01, "weight_decay": 0.01}, False),
        (
            torch.optim.RMSprop,
            {"lr": 0.01, "momentum": 0.9, "centered": True, "alpha": 0.9},
            True,
        ),
        (torch.optim.Adam, {"lr": 0.05, "amsgrad": True}, True),
        (
            torch.optim.AdamW,
            {"lr": 0.05, "amsgrad": True, "weight_decay": 0.1, "fused": True},
            False,
        ),
    ],
    ids=[
        "adagrad-decay",
        "adagrad-init",
        "rmsprop",
        "rmsprop-centered-momentum",
        "adam-amsgrad",
        "adamw-amsgrad-fused",
    ],
)
def test_more_torch_optimizers_match_torch(opt_cls, kw, freeze):
    """Adagrad builds its state in its constructor: it used to be refused as 'already
    holds state (stepped or loaded)'; RMSprop and amsgrad were refused as unsupported."""
    ours, theirs = _pair()
    opt, topt = opt_cls(ours.parameters(), **kw), opt_cls(theirs.parameters(), **kw)
    state, step = _bridged(ours, opt)
    for i, (x, y) in enumerate(_batches(6)):
        if freeze and i == 3:  # frozen mid-run: torch skips it (its step count, moments)
            ours.a.bias.requires_grad_(False)
            theirs.a.bias.requires_grad_(False)
        state, _ = step(state, (x, y.astype(np.int32)))
        _torch_step(theirs, topt, x, y)
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-5


def test_a_stepped_adagrad_is_still_refused_as_holding_state():
    ours, _ = _pair()
    opt = torch.optim.Adagrad(ours.parameters(), lr=0.1)
    x, y = _batches(1)[0]
    _torch_step(ours, opt, x, y)
    with pytest.raises(torchbridge.UnsupportedError, match=r"already holds state"):
        _bridged(ours, opt)
