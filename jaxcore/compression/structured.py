"""Structured pruning of the reference Transformer: attention heads and MLP neurons.

Heads and neurons are ranked per layer by an importance score, and the least important
ones are removed for real: `shrink` returns a smaller `TransformerConfig` and sliced
parameters, which ``inference.LLM(params, config=...)`` serves as any other model.
`mask_structure` zeroes the same units without changing shapes; the two compute the same
function (a zeroed head's output projection and a zeroed neuron's gate contribute nothing).

With ``qkv_bias`` the query/key/value biases of a removed head go with it.

Scores (higher = keep):

- ``magnitude``: the L2 norm of the unit's weights (query and output projections of a
  head; gate, up and down projections of a neuron).
- ``taylor``: the first-order Taylor estimate of the loss change when the unit is removed,
  ``|sum_w w * dL/dw|`` over the unit's weights, averaged over batches (Molchanov et al.
  2019, "Importance Estimation for Neural Network Pruning", group form).

Grouped-query attention: query head ``h`` reads key/value head ``h // g`` (``g = n_heads /
n_kv_heads``), and every group must keep the same size for the stacked layers to share
one shape. Two ways to prune consistently per kv group:

- ``by="query"`` (default): every kv group keeps its ``g'`` best query heads (the same
  ``g'`` in every group and layer); key/value heads are all kept.
- ``by="kv_group"``: whole groups go, a key/value head with all its query heads, ranked by
  the sum of their scores (and the key/value weights' norm for ``magnitude``).

Each layer keeps its own best units; only the counts are shared across layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore.errors import ConfigError
from jaxcore.models import TransformerConfig

METHODS = ("magnitude", "taylor")
HEAD_MODES = ("query", "kv_group")


@dataclasses.dataclass(frozen=True)
class Structure:
    """Which units each layer keeps (sorted indices, one row per layer).

    Attributes:
        heads: ``(layers, kept query heads)``, grouped by kv head in order.
        kv_heads: ``(layers, kept kv heads)``.
        neurons: ``(layers, kept MLP neurons)``.
    """

    heads: np.ndarray
    kv_heads: np.ndarray
    neurons: np.ndarray

    def config(self, cfg: TransformerConfig) -> TransformerConfig:
        """The smaller model's config (``head_dim`` pinned: ``d_model`` stays)."""
        return dataclasses.replace(
            cfg,
            n_heads=self.heads.shape[1],
            n_kv_heads=self.kv_heads.shape[1],
            d_ff=self.neurons.shape[1],
            head_dim=cfg.head_size,
        )


def _sq(x: jax.Array, axes: tuple[int, ...]) -> np.ndarray:
    return np.asarray(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axes))


def _dot(w: jax.Array, g: jax.Array, axes: tuple[int, ...]) -> np.ndarray:
    return np.asarray(jnp.sum(w.astype(jnp.float32) * g.astype(jnp.float32), axis=axes))


_UNITS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """The shapes of the unit weights of ``cfg``'s `Transformer` (stacked layers first)."""
    L, D, H, K, Dh, F, _ = cfg.dims
    return {
        "wq": (L, D, H, Dh),
        "wk": (L, D, K, Dh),
        "wv": (L, D, K, Dh),
        "wo": (L, H, Dh, D),
        "w_gate": (L, D, F),
        "w_up": (L, D, F),
        "w_down": (L, F, D),
    }


def _check_names(params: Any, what: str) -> None:
    missing = [n for n in _UNITS if not isinstance(params, dict) or n not in params]
    if missing:
        keys = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ConfigError(
            f"{what}: the params have no {missing} (they hold {keys}); pass the top-level "
            "params dict of a jaxcore.models.Transformer (a DistillPair's params['student'])."
        )


def _check_params(params: dict[str, Any], cfg: TransformerConfig, what: str) -> None:
    """Refuse params of another model: out-of-range unit indices would gather NaN."""
    _check_names(params, what)
    for name, shape in _shapes(cfg).items():
        got = tuple(np.shape(params[name]))
        if got != shape:
            raise ConfigError(
                f"{what}: params[{name!r}] has shape {got}, the config's model has {shape} "
                f"(n_layers={cfg.n_layers}, d_model={cfg.d_model}, n_heads={cfg.n_heads}, "
                f"n_kv_heads={cfg.n_kv_heads}, d_ff={cfg.d_ff}); pass the config the params "
                "were built with."
            )


def _check_structure(structure: Structure, cfg: TransformerConfig, what: str) -> None:
    sizes = {"heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "neurons": cfg.d_ff}
    for field, size in sizes.items():
        index = np.asarray(getattr(structure, field))
        if (
            index.ndim != 2
            or index.shape[0] != cfg.n_layers
            or index.shape[1] == 0
            or index.min() < 0
            or index.max() >= size
        ):
            raise ConfigError(
                f"{what}: the structure keeps {field} {index.tolist()} (one row per layer), "
                f"but the model has {cfg.n_layers} layers of {size} {field}; build the "
                "structure with cz.select(cfg, scores) for this config."
            )


def unit_scores(
    params: dict[str, Any],
    *,
    method: str = "magnitude",
    grads: Sequence[dict[str, Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Importance of each query head, kv head and neuron: ``{"heads": (L, H), "kv_heads":
    (L, K), "neurons": (L, F)}``.

    ``taylor`` needs ``grads``: one gradient pytree (same structure as ``params``) per
    calibration batch, e.g. from ``jax.grad`` of the training loss.
    """
    if method not in METHODS:
        raise ConfigError(f"unit_scores(method={method!r}): use one of {METHODS}.")
    _check_names(params, "unit_scores")
    p = params
    if method == "magnitude":
        return {
            "heads": np.sqrt(_sq(p["wq"], (1, 3)) + _sq(p["wo"], (2, 3))),
            "kv_heads": np.sqrt(_sq(p["wk"], (1, 3)) + _sq(p["wv"], (1, 3))),
            "neurons": np.sqrt(
                _sq(p["w_gate"], (1,)) + _sq(p["w_up"], (1,)) + _sq(p["w_down"], (2,))
            ),
        }
    if not grads:
        raise ConfigError(
            "unit_scores(method='taylor') needs grads=[...]: the loss gradients of a few "
            "calibration batches (one params-shaped pytree per batch)."
        )
    total: dict[str, np.ndarray] = {}
    for i, g in enumerate(grads):
        _check_names(g, f"unit_scores: grads[{i}]")
        for name in _UNITS:
            if np.shape(g[name]) != np.shape(p[name]):
                raise ConfigError(
                    f"unit_scores: grads[{i}][{name!r}] has shape {np.shape(g[name])}, "
                    f"params[{name!r}] has {np.shape(p[name])}; pass gradients of the loss "
                    "with respect to these params (jax.grad over the params dict)."
                )
        one = {
            "heads": np.abs(_dot(p["wq"], g["wq"], (1, 3)) + _dot(p["wo"], g["wo"], (2, 3))),
            "kv_heads": np.abs(_dot(p["wk"], g["wk"], (1, 3)) + _dot(p["wv"], g["wv"], (1, 3))),
            "neurons": np.abs(
                _dot(p["w_gate"], g["w_gate"], (1,))
                + _dot(p["w_up"], g["w_up"], (1,))
                + _dot(p["w_down"], g["w_down"], (2,))
            ),
        }
        total = {k: total.get(k, 0.0) + v for k, v in one.items()}
    return {k: v / len(grads) for k, v in total.items()}


def _keep_count(total: int, fraction: float, what: str) -> int:
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"select({what}={fraction!r}): the pruned fraction must be in [0, 1).")
    return total - round(total * fraction)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    # Stable on ties (lower index first), sorted so kept units keep their order.
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    return np.sort(order, axis=-1)


def select(
    cfg: TransformerConfig,
    scores: dict[str, np.ndarray],
    *,
    heads: float = 0.0,
    neurons: float = 0.0,
    by: str = "query",
) -> Structure:
    """Keep the best units: prune the fraction ``heads`` of query heads and ``neurons`` of
    MLP neurons in every layer (see the module docstring for the kv-group rule ``by``)."""
    if by not in HEAD_MODES:
        raise ConfigError(f"select(by={by!r}): use one of {HEAD_MODES}.")
    L, H, K, F = cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff
    want = {"heads": (L, H), "neurons": (L, F)}
    if "kv_heads" in scores:
        want["kv_heads"] = (L, K)
    for name, shape in want.items():
        got = np.shape(scores[name]) if name in scores else None
        if got != shape:
            raise ConfigError(
                f"select: scores[{name!r}] has shape {got}, the config's model has "
                f"(n_layers, {'d_ff' if name == 'neurons' else 'n_' + name}) = {shape}; score "
                "this model's params (cz.unit_scores(params)) and pass its config."
            )
    g = H // K
    head_scores = np.asarray(scores["heads"]).reshape(L, K, g)
    keep_heads = _keep_count(H, heads, "heads")
    if keep_heads == 0:
        raise ConfigError(
            f"select(heads={heads}): would remove every query head ({H} - round({H} * "
            f"{heads}) = 0 kept); prune a smaller fraction."
        )
    if by == "query":
        if keep_heads % K:
            raise ConfigError(
                f"select(heads={heads}): keeping {keep_heads} of {H} query heads does not "
                f"split evenly over the {K} kv groups (each keeps the same number); prune "
                f"a fraction that leaves a multiple of {K}, or use by='kv_group'."
            )
        within = _top(head_scores, keep_heads // K)  # (L, K, g')
        kept = (within + np.arange(K)[None, :, None] * g).reshape(L, -1)
        kv = np.broadcast_to(np.arange(K), (L, K))
    else:
        if K == 1 and keep_heads < H:
            raise ConfigError(
                f"select(heads={heads}, by='kv_group'): the model has one kv head, so its "
                "only group cannot go without removing every head; use by='query' to prune "
                "query heads within the group."
            )
        if keep_heads % g:
            raise ConfigError(
                f"select(heads={heads}, by='kv_group'): keeping {keep_heads} of {H} query "
                f"heads is not a whole number of groups of {g}; prune a multiple of 1/{K}."
            )
        group = head_scores.sum(axis=2)
        if "kv_heads" in scores:
            group = group + np.asarray(scores["kv_heads"])
        kv = _top(group, keep_heads // g)  # (L, K')
        kept = (kv[:, :, None] * g + np.arange(g)[None, None, :]).reshape(L, -1)
    keep_neurons = _keep_count(F, neurons, "neurons")
    if keep_neurons == 0:
        raise ConfigError(f"select(neurons={neurons}): would remove every MLP neuron.")
    return Structure(
        heads=np.asarray(kept), kv_heads=np.array(kv), neurons=_top(scores["neurons"], keep_neurons)
    )


def _biases(params: dict[str, Any], structure: Structure) -> list[tuple[str, np.ndarray]]:
    """The per-head biases of a ``qkv_bias`` model with the units each keeps (none without)."""
    kept = {"bq": structure.heads, "bk": structure.kv_heads, "bv": structure.kv_heads}
    return [(name, index) for name, index in kept.items() if name in params]


def _take(x: jax.Array, index: np.ndarray, axis: int) -> jax.Array:
    shape = [1] * x.ndim
    shape[0], shape[axis] = index.shape
    return jnp.take_along_axis(x, jnp.asarray(index.reshape(shape)), axis=axis)


def shrink(
    params: dict[str, Any], cfg: TransformerConfig, structure: Structure
) -> tuple[TransformerConfig, dict[str, Any]]:
    """The smaller model: its config and the parameters sliced to the kept units."""
    _check_params(params, cfg, "shrink")
    _check_structure(structure, cfg, "shrink")
    out = dict(params)
    out["wq"] = _take(params["wq"], structure.heads, 2)
    out["wo"] = _take(params["wo"], structure.heads, 1)
    out["wk"] = _take(params["wk"], structure.kv_heads, 2)
    out["wv"] = _take(params["wv"], structure.kv_heads, 2)
    out["w_gate"] = _take(params["w_gate"], structure.neurons, 2)
    out["w_up"] = _take(params["w_up"], structure.neurons, 2)
    out["w_down"] = _take(params["w_down"], structure.neurons, 1)
    for name, index in _biases(params, structure):  # qkv_bias: (layers, heads, head_dim)
        out[name] = _take(params[name], index, 1)
    return structure.config(cfg), out


def _keep_mask(index: np.ndarray, size: int) -> np.ndarray:
    mask = np.zeros((index.shape[0], size), bool)
    np.put_along_axis(mask, index, True, axis=1)
    return mask


def mask_structure(
    params: dict[str, Any], cfg: TransformerConfig, structure: Structure
) -> dict[str, Any]:
    """Same shapes, the pruned units' weights set to zero (the reference for `shrink`)."""
    _check_params(params, cfg, "mask_structure")
    _check_structure(structure, cfg, "mask_structure")
    L = cfg.n_layers
    h = jnp.asarray(_keep_mask(structure.heads, cfg.n_heads))
    k = jnp.asarray(_keep_mask(structure.kv_heads, cfg.n_kv_heads))
    f = jnp.asarray(_keep_mask(structure.neurons, cfg.d_ff))
    out = dict(params)
    out["wq"] = _zero(params["wq"], h.reshape(L, 1, -1, 1))
    out["wo"] = _zero(params["wo"], h.reshape(L, -1, 1, 1))
    out["wk"] = _zero(params["wk"], k.reshape(L, 1, -1, 1))
    out["wv"] = _zero(params["wv"], k.reshape(L, 1, -1, 1))
    out["w_gate"] = _zero(params["w_gate"], f.reshape(L, 1, -1))
    out["w_up"] = _zero(params["w_up"], f.reshape(L, 1, -1))
    out["w_down"] = _zero(params["w_down"], f.reshape(L, -1, 1))
    for name, index in _biases(params, structure):
        keep = jnp.asarray(_keep_mask(index, params[name].shape[1]))[..., None]
        out[name] = _zero(params[name], keep)
    return out


def _zero(w: jax.Array, keep: jax.Array) -> jax.Array:
    """``w`` with the units outside ``keep`` exactly zero (a NaN or inf weight too, which
    ``w * 0`` would leave NaN; `shrink` drops those units whatever they hold)."""
    return jnp.where(keep, w, jnp.zeros((), w.dtype))
