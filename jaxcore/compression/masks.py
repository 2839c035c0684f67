"""Pruning masks kept in the optimizer state, so pruned weights stay exactly zero.

`magnitude_pruning(inner, schedule)` wraps any optax optimizer. Its state holds one
boolean mask per parameter next to the inner optimizer's state; the optimizer state is
part of `jaxcore.TrainState`, so the engine shards the masks like the parameters (each
mask leaf has its parameter's shape), checkpoints them and resumes them with the run.

Each update, inside the jitted step:

1. at the schedule's mask steps the masks are recomputed from the current weights by
   magnitude (`magnitude_mask`), to the schedule's sparsity for that step count;
2. gradients of pruned weights are zeroed before the inner optimizer sees them (its
   moments stay zero there);
3. the update of a pruned weight is replaced by ``-w``, so ``w + (-w)`` is exactly zero in
   floating point whatever the inner optimizer adds (AdamW's decoupled weight decay, a
   learning-rate schedule, momentum from before the weight was pruned).

This follows the masked-update design of the TensorFlow Model Optimization toolkit's
``prune_low_magnitude`` (masks as optimizer-side variables updated on a schedule), in
optax's ``GradientTransformation`` form. Masks of parameters that are not pruned are all
true (they cost one byte per weight, sharded like the weight).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcore.compression.magnitude import SparsitySchedule, magnitude_mask
from jaxcore.errors import ConfigError
from jaxcore.sharding import path_str

# The reference Transformer's matmul weights (embedding, norms and the head stay dense,
# as in Zhu & Gupta's language-model experiments, which keep the embedding unpruned).
DEFAULT_TARGETS = r"(^|/)(wq|wk|wv|wo|w_gate|w_up|w_down)$"


class PruningState(NamedTuple):
    """State of `magnitude_pruning`: update count, one mask per parameter, inner state."""

    count: jax.Array
    masks: Any
    inner: Any


def _selector(targets: str):
    try:
        pattern = re.compile(targets)
    except re.error as e:
        raise ConfigError(
            f"magnitude_pruning(targets={targets!r}): not a valid regular expression ({e})."
        ) from e
    return lambda path: bool(pattern.search(path_str(path)))


def _check_targets(
    params: Any, selected: Callable[[Any], bool], targets: str, stacked: bool
) -> None:
    """Refuse a ``targets`` regex that prunes nothing, and per-layer pruning of parameters
    without a layers axis (each "layer" of a vector holds one weight, never pruned)."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    chosen = [(path_str(path), jnp.shape(p)) for path, p in leaves if selected(path)]
    if not chosen:
        names = sorted(path_str(path) for path, _ in leaves)
        more = f" and {len(names) - 20} more" if len(names) > 20 else ""
        raise ConfigError(
            f"magnitude_pruning(targets={targets!r}) matches no parameter, so nothing would "
            f"be pruned; the parameters are {names[:20]}{more}."
        )
    flat = [(name, shape) for name, shape in chosen if stacked and len(shape) < 2]
    if flat:
        raise ConfigError(
            f"magnitude_pruning(targets={targets!r}, stacked=True): {flat} have no "
            "(layers, weights...) shape, so each layer would hold one weight and none would "
            "be pruned; pass stacked=False or narrow targets to the stacked block weights."
        )


def magnitude_pruning(
    inner: optax.GradientTransformation,
    schedule: SparsitySchedule,
    *,
    targets: str = DEFAULT_TARGETS,
    stacked: bool = True,
) -> optax.GradientTransformation:
    """``inner`` with magnitude pruning to ``schedule``'s sparsity on matching parameters.

    Args:
        inner: the optimizer whose updates are masked (e.g. ``optax.adamw(3e-4)``).
        schedule: when masks are recomputed and to which sparsity.
        targets: regex searched in each parameter's path (``"wq"``, ``"student/w_up"``);
            matching parameters are pruned.
        stacked: matching parameters carry a leading ``layers`` axis and each layer is
            pruned to the sparsity on its own (the reference model's stacked blocks).

    ``init`` raises `ConfigError` when ``targets`` matches no parameter, or (with
    ``stacked``) matches one with fewer than two axes.
    """
    selected = _selector(targets)

    def init(params: Any) -> PruningState:
        _check_targets(params, selected, targets, stacked)
        masks = jax.tree.map(lambda p: jnp.ones(jnp.shape(p), bool), params)
        return PruningState(count=jnp.zeros((), jnp.int32), masks=masks, inner=inner.init(params))

    def update(updates: Any, state: PruningState, params: Any = None):
        if params is None:
            raise ConfigError(
                "magnitude_pruning: the optimizer update needs the parameters "
                "(tx.update(grads, state, params)); the jaxcore engine passes them."
            )
        sparsity = schedule.sparsity(state.count)

        def recompute(masks):
            return jax.tree_util.tree_map_with_path(
                lambda path, m, p: (
                    magnitude_mask(p, sparsity, stacked=stacked) if selected(path) else m
                ),
                masks,
                params,
            )

        masks = jax.lax.cond(schedule.updates_at(state.count), recompute, lambda m: m, state.masks)
        grads = jax.tree.map(lambda g, m: jnp.where(m, g, 0).astype(g.dtype), updates, masks)
        new_updates, inner_state = inner.update(grads, state.inner, params)
        # -w for pruned weights: w + (-w) == 0 exactly, so the weight lands on zero.
        new_updates = jax.tree.map(
            lambda u, m, p: jnp.where(m, u, -p).astype(u.dtype), new_updates, masks, params
        )
        return new_updates, PruningState(count=state.count + 1, masks=masks, inner=inner_state)

    return optax.GradientTransformation(init, update)


def find_masks(opt_state: Any) -> Any:
    """The masks of the (first) `PruningState` inside an optimizer state."""
    for node in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, PruningState)):
        if isinstance(node, PruningState):
            return node.masks
    raise ConfigError(
        "find_masks: the optimizer state holds no PruningState; build the optimizer with "
        "jaxcore.compression.magnitude_pruning(inner, schedule)."
    )


def sparsity_report(
    params: Any, *, targets: str = DEFAULT_TARGETS, stacked: bool = True
) -> dict[str, list[float]]:
    """Fraction of exactly-zero weights per layer of each matching parameter (host side).

    ``{"wq": [layer 0, layer 1, ...], ...}``; with ``stacked=False`` each list has one entry.
    """
    selected = _selector(targets)
    out: dict[str, list[float]] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not selected(path):
            continue
        x = np.asarray(jax.device_get(leaf))
        rows = x.reshape((x.shape[0], -1) if stacked else (1, -1))
        out[path_str(path)] = [float(np.mean(r == 0)) for r in rows]
    return out
