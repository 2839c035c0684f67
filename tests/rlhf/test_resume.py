"""PPO saved after two iterations and resumed in a fresh trainer repeats the third."""

from dataclasses import replace

import pytest

import jaxcore as jc
from inference import ServingConfig
from rlhf import restore_trainer, save_trainer
from rlhf.layout import memory_kinds
from rlhf.models import lm_factory, scalar_head_factory
from rlhf.ppo import PPOConfig, PPOTrainer
from rlhf.rollout import Sampler

from .helpers import CFG, adam, count_good, engine, prompts

CONFIG = PPOConfig(max_tokens=6, ppo_epochs=2, kl_target=1.0, kl_horizon=100)


def fresh(actor, critic, config=CONFIG):
    state = actor.prepare(lm_factory(CFG), adam(5e-3), seed=0)
    values = critic.prepare(scalar_head_factory(CFG), adam(3e-3), seed=1)
    sampler = Sampler(CFG, state.params, ServingConfig(slots=16, max_len=12))
    return PPOTrainer((actor, state), (critic, values), sampler, count_good, config)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Three iterations of the default layout, saved after the second: the run both tests
    compare with (built once: a trainer's first iteration is mostly compiling)."""
    actor, critic = engine(), engine()
    run = fresh(actor, critic)
    first = [run.step(prompts(i, 16)) for i in range(2)]
    saved = tmp_path_factory.mktemp("saved")
    save_trainer(run, saved)
    third = run.step(prompts(2, 16))
    return actor, critic, first, saved, third


def test_resume_repeats_the_uninterrupted_metrics(uninterrupted):
    actor, critic, first, saved, third = uninterrupted
    resumed = fresh(actor, critic)
    assert restore_trainer(resumed, saved) == 2
    assert resumed.kl_ctl.value == pytest.approx(run_kl(first))
    again = resumed.step(prompts(2, 16))
    for key in ("reward_mean", "kl", "kl_coef", "clip_frac", "approx_kl", "value_loss", "loss"):
        assert again[key] == pytest.approx(third[key], rel=1e-6, abs=1e-7), key


def test_colocated_offload_repeats_the_default_layout_metrics(uninterrupted):
    """Critic and reference parked in host memory between phases: same numbers."""
    actor, critic, default, _, _ = uninterrupted
    colocated = fresh(actor, critic, replace(CONFIG, offload_idle=True))
    assert memory_kinds(colocated.reference) == {"pinned_host"}
    assert memory_kinds(colocated.critic) == {"pinned_host"}
    for i, want in enumerate(default):
        got = colocated.step(prompts(i, 16))
        for key in ("reward_mean", "kl", "clip_frac", "approx_kl", "value_loss", "loss"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), (i, key)
    assert memory_kinds(colocated.critic) == {"pinned_host"}
    assert memory_kinds(colocated.roles()["critic"]) == {"device"}  # checkpoints see device


def run_kl(history):
    """The controller's value after the saved iterations, recomputed from the metrics."""
    from rlhf.kl import AdaptiveKLController

    ctl = AdaptiveKLController(CONFIG.kl_coef, CONFIG.kl_target, CONFIG.kl_horizon)
    for m in history:
        ctl.update(m["kl"], 16)
    return ctl.value


def test_restore_without_checkpoint_says_how(tmp_path):
    class Empty:
        def roles(self):
            return {}

    with pytest.raises(jc.ConfigError, match="save_trainer"):
        restore_trainer(Empty(), tmp_path)


def test_each_role_checkpoint_records_its_engine_plan(uninterrupted):
    # Stop 43: role checkpoints were saved without an engine, so every save of a PPO/GRPO
    # run logged "Checkpointer has no plan" and the steps recorded no engine config or axes.
    from rlhf.checkpoint import role_checkpointer

    _, _, _, saved, _ = uninterrupted
    for role in ("actor", "critic", "reference"):
        with role_checkpointer(saved / role) as ckpt:
            record = ckpt.read_record(2)
        assert record["engine"] is not None and record["logical_axes"], role
