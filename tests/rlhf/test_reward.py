"""A reward model trained through the engine (fsdp=8) separates held-out preference pairs."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxcore as jc
from rlhf.models import scalar_head_factory
from rlhf.reward import pair_scores, reward_loss

from .helpers import CFG, adam, engine, preference_pairs


def test_reward_model_reaches_90_percent_held_out():
    eng = engine()
    state = eng.prepare(scalar_head_factory(CFG), adam(3e-3), seed=0)
    step = eng.train_step(reward_loss(center_coef=0.01))
    evaluate = eng.eval_step(reward_loss())
    held_out = preference_pairs(128, 12, seed=999)
    before = float(evaluate(state, held_out)["accuracy"])
    for i in range(60):
        state, _ = step(state, preference_pairs(32, 12, seed=i))
    after = float(evaluate(state, held_out)["accuracy"])
    print(f"held-out accuracy {before:.3f} -> {after:.3f}")
    assert after >= 0.9, (before, after)


def test_reward_batch_errors_name_the_missing_keys():
    with pytest.raises(jc.BatchError, match="rejected_len"):
        pair_scores(
            None,
            {
                "chosen": jnp.zeros((1, 2)),
                "rejected": jnp.zeros((1, 2)),
                "chosen_len": jnp.ones((1,)),
            },
        )


def test_margin_enters_the_loss():
    class Fixed:
        def score(self, tokens, lengths):
            return jnp.where(jnp.arange(tokens.shape[0]) < tokens.shape[0] // 2, 1.0, 0.0)

    batch = {k: np.ones((2, 3), np.int32) for k in ("chosen", "rejected")}
    batch |= {"chosen_len": np.full(2, 3), "rejected_len": np.full(2, 3)}
    no_margin, _ = reward_loss()(Fixed(), batch, None)
    with_margin, _ = reward_loss()(Fixed(), batch | {"margin": jnp.ones(2)}, None)
    np.testing.assert_allclose(no_margin, np.log1p(np.exp(-1.0)), rtol=1e-6)
    np.testing.assert_allclose(with_margin, np.log(2.0), rtol=1e-6)
