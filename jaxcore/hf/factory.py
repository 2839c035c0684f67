"""A Hugging Face directory as a model for the engine: fine-tune from pretrained weights.

``engine.prepare(jaxcore.hf.model_factory(HF_DIR, engine), optimizer)`` gives a
`TrainState` whose parameters are the checkpoint's, placed in the engine's layout by
`jaxcore.hf.load` (each process reads only its slices). Without an engine the weights
are loaded sharded over all devices (ZeRO-3 style) and the engine reshards them on
device, so no host ever holds the whole model either way.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
from flax import nnx

from jaxcore.adapters import ModelAdapter, from_nnx_factory
from jaxcore.hf.reader import load
from jaxcore.mesh import ParallelConfig, build_mesh
from jaxcore.models.transformer import Transformer, TransformerConfig


def model_factory(
    path: str | os.PathLike, plan_or_mesh: Any = None, *, dtype: Any = "float32"
) -> ModelAdapter:
    """A `jc.ModelAdapter` holding the checkpoint at ``path`` (for ``engine.prepare``).

    ``plan_or_mesh`` (a `jc.Engine`, a jaxcore mesh or a plan) is where the weights are
    read to; pass the engine that will train them to skip a reshard.
    """
    target = plan_or_mesh if plan_or_mesh is not None else build_mesh(ParallelConfig(fsdp=-1))
    cfg, params = load(path, target, dtype=dtype)
    return with_params(lambda rngs: Transformer(cfg, rngs=rngs), params)


def with_params(nnx_factory: Any, params: dict[str, Any]) -> ModelAdapter:
    """A `jc.ModelAdapter` of ``nnx_factory``'s model (``rngs -> nnx.Module``, no state
    but parameters) starting from ``params``: its init runs nowhere, so loaded weights are
    never drawn at random first (a checkpoint's, or a checkpoint's trunk with a new head)."""
    adapter = from_nnx_factory(nnx_factory)
    initial = (params, {})
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), initial)
    return dataclasses.replace(
        adapter, init=lambda key: initial, initial=initial, abstract=abstract
    )


def build_model(cfg: TransformerConfig, params: dict[str, Any]) -> Transformer:
    """A `Transformer` holding ``params`` (from `load`), without running its init."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state, rest)
