"""Models RLHF adds to the reference decoder: a scalar head (reward model and critic) and
the per-token log-probabilities every role computes the same way.

The scalar head reads the trunk's final-normed hidden states, so a reward model or critic
is ``Transformer`` + one ``(d_model,)`` vector and a bias, with the same logical axes (and
so the same shardings) as the actor.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcore import axes
from jaxcore.models import Transformer, TransformerConfig


class ScalarHeadModel(nnx.Module):
    """The decoder trunk with a linear head to one scalar per position.

    ``model.values(tokens)`` is ``(batch, length)`` (the PPO critic's per-token values);
    ``model.score(tokens, lengths)`` reads the last real token's value (the reward model's
    sequence score, as TRL's ``get_reward`` reads the last non-pad token).
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs, bias: bool = True):
        self.cfg = cfg
        self.trunk = Transformer(cfg, rngs=rngs)
        std = 1.0 / (cfg.d_model + 1) ** 0.5
        self.head = nnx.Param(
            std * jax.random.normal(rngs.params(), (cfg.d_model,)), logical_axes=(axes.EMBED,)
        )
        # ``bias=False``: the head of transformers' ``*ForSequenceClassification`` (its
        # ``score`` is a Linear without bias, what TRL's RewardTrainer trains), so the
        # model exports to it exactly (`rlhf.export_reward_model`).
        self.bias = nnx.Param(jnp.zeros(()), logical_axes=()) if bias else None

    def values(self, tokens: jax.Array) -> jax.Array:
        h = self.trunk.hidden_states(tokens).astype(jnp.float32)
        out = h @ self.head[...].astype(jnp.float32)
        return out if self.bias is None else out + self.bias[...]

    def score(self, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        values = self.values(tokens)
        last = jnp.clip(lengths - 1, 0, tokens.shape[1] - 1)
        return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]

    def __call__(self, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        return self.score(tokens, lengths)


def scalar_head_factory(cfg: TransformerConfig, *, bias: bool = True):
    """``rngs -> ScalarHeadModel`` for ``jaxcore.Engine.prepare``."""
    return lambda rngs: ScalarHeadModel(cfg, rngs=rngs, bias=bias)


def hf_scalar_head_factory(path: str, engine: Any, *, seed: int = 0) -> Any:
    """A `ScalarHeadModel` without bias whose trunk is the Hugging Face checkpoint at
    ``path`` (read onto ``engine``'s mesh, `jaxcore.hf.load`) and whose head is fresh, as
    TRL's RewardTrainer starts ``AutoModelForSequenceClassification(num_labels=1)``."""
    import numpy as np

    from jaxcore import hf
    from jaxcore.hf.factory import with_params

    cfg, trunk = hf.load(path, engine)
    std = 1.0 / (cfg.d_model + 1) ** 0.5
    head = std * np.random.default_rng(seed).standard_normal(cfg.d_model).astype(np.float32)
    return with_params(
        scalar_head_factory(cfg, bias=False), {"trunk": trunk, "head": jnp.asarray(head)}
    )


def lm_factory(cfg: TransformerConfig):
    """``rngs -> Transformer`` for ``jaxcore.Engine.prepare``."""
    return lambda rngs: Transformer(cfg, rngs=rngs)


def token_logprobs(model: Any, tokens: jax.Array) -> jax.Array:
    """``log p(tokens[:, t+1] | tokens[:, :t+1])``: ``(batch, length - 1)`` in float32.

    The one definition the trainer uses for the actor, the reference and DPO, computed as
    ``logit - logsumexp(logits)`` in float32 as the sampler's ``log_softmax`` is.
    """
    logits = model(tokens[:, :-1]).astype(jnp.float32)
    chosen = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
    return chosen - jax.nn.logsumexp(logits, axis=-1)


def logprobs_and_entropy(model: Any, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`token_logprobs` and the entropy of each position's distribution, one forward."""
    logits = model(tokens[:, :-1]).astype(jnp.float32)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
    return chosen, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
