"""Where served arrays live: weights and the KV cache placed from the logical-axis rules.

Serving reads the same rules table as training (`jaxcore.sharding.logical_to_spec`), so a
rule such as ``("kv_heads", "tensor")`` moves the cache's key/value heads exactly as it
moves the ``wk``/``wv`` weights; no training engine (or optimizer) is built to get there.
Weights are never split over ``fsdp`` here: a served model is read every step, so ZeRO-3
style gathers would cost a collective per layer per token.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxcore as jc
from jaxcore import axes
from jaxcore.models import TransformerConfig
from jaxcore.models.decoding import CACHE_AXES
from jaxcore.models.paged_decoding import PAGE_AXES
from jaxcore.sharding import Rules, logical_to_spec, validate_rules

# Per-slot arrays (tokens, keys, sampling settings) are split like the batch.
SLOT_AXES = (axes.BATCH,)


@dataclasses.dataclass(frozen=True)
class Placement:
    """The mesh and the shardings of the decode weights, the KV cache and per-slot arrays."""

    mesh: Mesh
    weights: Any  # a tree of NamedSharding with the structure of `decoding_weights`
    cache: NamedSharding  # (layers, slots, kv_heads, length, head_dim)
    pages: NamedSharding  # (layers, pages, kv_heads, page_size, head_dim)
    slots: NamedSharding  # (slots, ...)
    replicated: NamedSharding


def _param_axes(abstract_model: Any) -> dict[str, tuple | None]:
    """Logical names of each parameter of the reference `Transformer` (from its metadata)."""
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(abstract_model, nnx.Param)):
        meta = var.get_metadata()
        names = meta.get("logical_axes") or meta.get("sharding_names")
        out[".".join(str(p) for p in path)] = tuple(names) if names else None
    return out


def _decode_weight_axes(cfg: TransformerConfig, names: dict[str, tuple | None]) -> dict:
    """Logical names with the structure of `jaxcore.models.decoding_weights`."""
    embed = names["embed"]
    head = tuple(reversed(embed)) if cfg.tie_embeddings else names["lm_head"]
    block_keys = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")
    # q/k/v biases (Qwen2) exist only when the config asks for them.
    block_keys += tuple(k for k in ("bq", "bk", "bv") if k in names)
    return {
        "embed": embed,
        "final_norm": names["final_norm"],
        "head": head,
        "blocks": {k: names[k] for k in block_keys},
    }


def place(
    cfg: TransformerConfig,
    abstract_model: Any,
    weight_shapes: dict[str, Any],
    *,
    slots: int,
    parallel: jc.ParallelConfig | None,
    rules: Rules,
) -> Placement:
    """Shardings for serving ``cfg`` with ``slots`` decode slots on the ``parallel`` mesh.

    ``weight_shapes`` is the `decoding_weights` tree (arrays or shape structs).
    """
    devices = jax.devices()[:1] if parallel is None else None
    mesh = jc.build_mesh(parallel or jc.ParallelConfig(fsdp=1), devices)
    rules = validate_rules(rules, mesh.axis_names)
    names = _decode_weight_axes(cfg, _param_axes(abstract_model))

    def weight(path, leaf, logical):
        where = jax.tree_util.keystr(path)
        spec = logical_to_spec(logical, leaf.shape, mesh, rules, exclude=("fsdp",), where=where)
        return NamedSharding(mesh, spec)

    flat, treedef = jax.tree_util.tree_flatten_with_path(weight_shapes)
    logical = jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))
    weights = jax.tree.unflatten(
        treedef, [weight(p, leaf, n) for (p, leaf), n in zip(flat, logical, strict=True)]
    )
    cache_shape = (cfg.n_layers, slots, cfg.n_kv_heads, 1, cfg.head_size)
    cache_spec = logical_to_spec(CACHE_AXES, cache_shape, mesh, rules, where="kv cache")
    page_shape = (cfg.n_layers, 1, cfg.n_kv_heads, 1, cfg.head_size)
    page_spec = logical_to_spec(PAGE_AXES, page_shape, mesh, rules, where="kv pages")
    slot_ways = _ways(mesh, rules, slots)
    if slots % slot_ways:
        raise jc.ConfigError(
            f"ServingConfig.slots={slots} does not split over the {slot_ways} data-parallel "
            f"ways of {parallel}; use a multiple of {slot_ways}."
        )
    slot_spec = logical_to_spec(SLOT_AXES, (slots,), mesh, rules, where="slots")
    return Placement(
        mesh=mesh,
        weights=weights,
        cache=NamedSharding(mesh, cache_spec),
        pages=NamedSharding(mesh, page_spec),
        slots=NamedSharding(mesh, slot_spec),
        replicated=NamedSharding(mesh, PartitionSpec()),
    )


def _ways(mesh: Mesh, rules: Rules, slots: int) -> int:
    """How many ways the ``batch`` rule wants to split the slots (before divisibility)."""
    for name, target in rules:
        if name == axes.BATCH and target is not None:
            targets = (target,) if isinstance(target, str) else target
            return int(np.prod([mesh.shape.get(a, 1) for a in targets]))
    return 1
