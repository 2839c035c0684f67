"""DPO through the jaxcore engine, with the reference log-probs computed once up front.

A batch is ``{"chosen", "rejected": int (batch, length), "chosen_mask", "rejected_mask":
(batch, length)}`` where a mask marks the completion tokens (1) whose log-probs count;
`with_reference` adds ``ref_chosen`` / ``ref_rejected`` (batch,) from the frozen policy,
so training never holds a second model (TRL's ``precompute_ref_log_probs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore import BatchError, ConfigError, Engine, TrainState
from rlhf.losses import dpo_loss
from rlhf.models import token_logprobs

DPO_KEYS = ("chosen", "rejected", "chosen_mask", "rejected_mask")


def sequence_logprob(model: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum of log p over the tokens ``mask`` marks (the first token is never predicted)."""
    return jnp.sum(token_logprobs(model, tokens) * mask[:, 1:].astype(jnp.float32), axis=1)


def _check(batch: dict[str, Any], keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in batch]
    if missing:
        raise BatchError(
            f"DPO batch lacks {missing}: it needs 'chosen'/'rejected' token arrays (batch, "
            "length) and 'chosen_mask'/'rejected_mask' marking completion tokens; "
            "'ref_chosen'/'ref_rejected' come from rlhf.dpo.with_reference."
        )


def _pair_logprobs(model: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    tokens = jnp.concatenate([batch["chosen"], batch["rejected"]], axis=0)
    mask = jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]], axis=0)
    logp = sequence_logprob(model, tokens, mask)
    n = batch["chosen"].shape[0]
    return logp[:n], logp[n:]


def _reference_loss(model, batch, rng):
    del rng
    _check(batch, DPO_KEYS)
    chosen, rejected = _pair_logprobs(model, batch)
    return jnp.zeros(()), {"ref_chosen": chosen, "ref_rejected": rejected}


def with_reference(
    engine: Engine, reference: TrainState, batches: list[dict[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """Each batch plus the frozen reference's sequence log-probs (one pass, done once).

    With several processes ``batches`` are this process's rows (`Engine.local_rows`), and
    so are the log-probs added to them."""
    score = engine.eval_step(_reference_loss)
    out = []
    for batch in batches:
        metrics = score(reference, batch)
        out.append(
            {
                **batch,
                "ref_chosen": _host_rows(engine, metrics["ref_chosen"]),
                "ref_rejected": _host_rows(engine, metrics["ref_rejected"]),
            }
        )
    return out


def _host_rows(engine: Engine, x: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded result, as the rows it passed in (with
    several processes the result also spans the others' devices)."""
    if x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    full = np.asarray(multihost_utils.process_allgather(x, tiled=True))
    lo, hi = engine.local_rows(len(full))
    return full[lo:hi]


def dpo_objective(
    *, beta: float = 0.1, label_smoothing: float = 0.0, reference_free: bool = False
) -> Callable:
    """A jaxcore ``loss_fn``: the sigmoid DPO loss on batches from `with_reference`.

    ``reference_free`` (TRL's ``reference_free=True``): the reference is a uniform model
    whose log-probs are 0, so batches need no ``ref_*`` arrays (no reference pass)."""
    if not beta > 0:
        raise ConfigError(
            f"DPO beta={beta}: must be > 0 (loss.beta in a config; TRL's default is 0.1): "
            "0 trains nothing and a negative beta prefers the rejected answers."
        )
    if not 0 <= label_smoothing <= 0.5:
        raise ConfigError(
            f"DPO label_smoothing={label_smoothing}: must be in [0, 0.5] (cDPO's label-noise "
            "rate); above 0.5 the loss prefers the rejected answers."
        )

    def loss_fn(model, batch, rng):
        del rng
        _check(batch, DPO_KEYS if reference_free else (*DPO_KEYS, "ref_chosen", "ref_rejected"))
        chosen, rejected = _pair_logprobs(model, batch)
        zero = jnp.zeros_like(chosen)
        loss, stats = dpo_loss(
            chosen,
            rejected,
            zero if reference_free else batch["ref_chosen"],
            zero if reference_free else batch["ref_rejected"],
            beta=beta,
            label_smoothing=label_smoothing,
        )
        return loss, stats

    return loss_fn
