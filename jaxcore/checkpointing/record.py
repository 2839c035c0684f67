"""The JSON record (``meta`` item) of a step: what was saved, by what, on which mesh.

A restore checks the record's leaf table against the new run's abstract state before it
reads a tensor, so a different model or optimizer is a `ConfigError`, never "damage".
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import platform
from typing import Any

import jax

from jaxcore import sharding as shd

FORMAT = 2  # 2: manifest inside the step, loader positions through get_state/set_state
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy")


def versions() -> dict[str, str]:
    """Python's and the checkpoint-relevant packages' versions."""
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def jsonable(value: Any) -> Any:
    """Dataclasses, dicts and sequences as JSON data; anything else by its ``repr``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def leaf_table(tree: Any) -> dict[str, list]:
    """``path -> [shape, dtype]`` for every leaf (what `meta` records and restores check)."""
    return {
        shd.path_str(p): [list(x.shape), str(x.dtype)]
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def logical_axes(plan: Any) -> dict[str, list | None]:
    """``path -> logical axis names`` of every parameter, as the plan names them."""
    names = plan.logical_axes
    return {
        shd.path_str(p): None if n is None else list(n)
        for p, n in jax.tree_util.tree_flatten_with_path(
            names, is_leaf=lambda x: x is None or isinstance(x, tuple)
        )[0]
    }


def _state_mesh(tree: Any) -> dict[str, int] | None:
    """The mesh the state's arrays are laid out on (what a plan-less save can still say)."""
    for leaf in jax.tree.leaves(tree):
        mesh = getattr(getattr(leaf, "sharding", None), "mesh", None)
        if mesh is not None and hasattr(mesh, "shape"):
            return dict(mesh.shape)
    return None


def build(
    step: int,
    saveable: Any,
    *,
    plan: Any,
    rng_impl: Any,
    input_info: dict[str, Any] | None,
    run_config: Any,
) -> dict[str, Any]:
    """The record of ``step``: the plan (when known) gives mesh, engine config and axes."""
    record: dict[str, Any] = {
        "format": FORMAT,
        "step": step,
        "time": datetime.datetime.now(datetime.UTC).isoformat(),
        "versions": versions(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "rng_impl": None if rng_impl is None else str(rng_impl),
        "leaves": leaf_table(saveable),
        "input": input_info,
        "run": jsonable(run_config),
    }
    if plan is not None:
        record["mesh"] = dict(plan.mesh.shape)
        record["engine"] = jsonable(plan.config)
        record["logical_axes"] = logical_axes(plan)
    else:
        record["mesh"] = _state_mesh(saveable)
    return record
