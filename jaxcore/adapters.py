"""The engine's one model form, and the adapter that turns Flax NNX modules into it.

Whatever a model was written in, the engine sees a `ModelAdapter`: how to initialise
parameters (traceable, so ``jit`` can place them straight into their shards), how to bind
parameters to something the loss function calls, and the logical axis names of each
parameter. ``torchbridge`` builds the same object from a ``torch.nn.Module``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from jaxcore.errors import ConfigError

# Metadata keys a parameter's logical axis names may be stored under: ours first, then
# the names Flax's own partitioning helpers use.
_AXES_KEYS = ("logical_axes", "sharding_names", "sharding")


@dataclasses.dataclass(frozen=True)
class ModelAdapter:
    """A model as the engine uses it.

    Attributes:
        init: ``key -> (params, model_state)``, traceable; params are nested dicts of arrays.
        bind: ``(params, model_state) -> model``, what the loss function receives.
        state_of: ``model -> model_state`` after the loss function ran (updated buffers).
        abstract: ``(params, model_state)`` as ``jax.ShapeDtypeStruct`` trees.
        logical_axes: tree with the structure of params; each leaf a tuple of logical names,
            or ``None`` for parameters without names (the automatic rule shards them).
        initial: concrete ``(params, model_state)`` when the model was built eagerly;
            the engine then places these arrays instead of calling ``init``.
        vocab_size: token ids the model embeds, ``[0, vocab_size)`` (``None``: unknown);
            the engine checks batches against it.
        max_seq_len: the longest sequence the model takes (``None``: unknown).
        bind_eval: ``bind`` for evaluation (dropout off, normalisation from running
            statistics), what the eval step calls; ``None``: ``bind`` (an adapter whose
            model takes eval mode from ``rng=None``, as torchbridge's does).
    """

    init: Callable[[jax.Array], tuple[Any, Any]]
    bind: Callable[[Any, Any], Any]
    state_of: Callable[[Any], Any]
    abstract: tuple[Any, Any]
    logical_axes: Any
    initial: tuple[Any, Any] | None = None
    vocab_size: int | None = None
    max_seq_len: int | None = None
    bind_eval: Callable[[Any, Any], Any] | None = None


def _axes_of(variable: nnx.Variable) -> tuple | None:
    meta = variable.get_metadata()
    for key in _AXES_KEYS:
        names = meta.get(key)
        if isinstance(names, tuple | list):
            return tuple(names)
    return None


def _token_limits(module: nnx.Module) -> dict[str, int | None]:
    """``vocab_size`` and ``max_seq_len`` from a model's config (``cfg`` or ``config``)."""
    cfg = getattr(module, "cfg", None) or getattr(module, "config", None)
    out = {}
    for name in ("vocab_size", "max_seq_len"):
        value = getattr(cfg, name, None)
        out[name] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return out


def _split(module: nnx.Module):
    return nnx.split(module, nnx.Param, ...)


def _nnx_adapter(graphdef, abs_params, abs_rest, init, initial=None, limits=None) -> ModelAdapter:
    def bind(params: Any, model_state: Any) -> nnx.Module:
        p = jax.tree.map(lambda x: x, abs_params)
        nnx.replace_by_pure_dict(p, params)
        r = jax.tree.map(lambda x: x, abs_rest)
        nnx.replace_by_pure_dict(r, model_state)
        return nnx.merge(graphdef, p, r)

    def bind_eval(params: Any, model_state: Any) -> nnx.Module:
        # NNX's own switch: every submodule with ``deterministic`` / ``use_running_average``
        # (Dropout, BatchNorm) set for evaluation; the merged module is fresh per call.
        model = bind(params, model_state)
        model.eval()
        return model

    def state_of(module: nnx.Module) -> Any:
        return nnx.to_pure_dict(_split(module)[2])

    def shapes(state):
        return jax.tree.map(
            lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), nnx.to_pure_dict(state)
        )

    names = jax.tree.map(_axes_of, abs_params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return ModelAdapter(
        init=init,
        bind=bind,
        bind_eval=bind_eval,
        state_of=state_of,
        abstract=(shapes(abs_params), shapes(abs_rest)),
        logical_axes=nnx.to_pure_dict(names),
        initial=initial,
        **(limits or {}),
    )


def from_nnx_factory(factory: Callable[[nnx.Rngs], nnx.Module]) -> ModelAdapter:
    """Adapter for ``factory(rngs) -> nnx.Module``: parameters are created inside ``jit``."""
    try:
        abstract_module = nnx.eval_shape(lambda: factory(nnx.Rngs(0)))
    except TypeError as e:
        raise ConfigError(
            f"prepare(model): calling the model factory as factory(rngs) failed ({e}). Pass a "
            "function that takes an nnx.Rngs and returns an nnx.Module, e.g. "
            "`lambda rngs: Transformer(cfg, rngs=rngs)`, or a built nnx.Module."
        ) from e
    if not isinstance(abstract_module, nnx.Module):
        raise ConfigError(
            f"prepare(model): the factory returned {type(abstract_module).__name__}, not an "
            "nnx.Module."
        )
    graphdef, abs_params, abs_rest = _split(abstract_module)

    def init(key: jax.Array) -> tuple[Any, Any]:
        _, params, rest = _split(factory(nnx.Rngs(key)))
        return nnx.to_pure_dict(params), nnx.to_pure_dict(rest)

    return _nnx_adapter(graphdef, abs_params, abs_rest, init, limits=_token_limits(abstract_module))


def from_nnx_module(module: nnx.Module) -> ModelAdapter:
    """Adapter for a module that was already built (its arrays exist; they get resharded)."""
    graphdef, params, rest = _split(module)
    initial = (nnx.to_pure_dict(params), nnx.to_pure_dict(rest))

    def init(key: jax.Array) -> tuple[Any, Any]:
        del key
        return initial

    abs_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    abs_rest = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), rest)
    return _nnx_adapter(
        graphdef, abs_params, abs_rest, init, initial=initial, limits=_token_limits(module)
    )


def as_adapter(model: Any) -> ModelAdapter:
    """Turn what a user passes to ``prepare`` into a `ModelAdapter`."""
    if isinstance(model, ModelAdapter):
        return model
    if isinstance(model, nnx.Module):
        return from_nnx_module(model)
    if callable(model):
        return from_nnx_factory(model)
    raise ConfigError(
        f"prepare(model): got {type(model).__name__}. Pass an nnx.Module factory "
        "(`lambda rngs: Model(..., rngs=rngs)`, preferred: parameters are created straight "
        "into their shards), a built nnx.Module, or a jaxcore.ModelAdapter."
    )
