"""The same `jaxcore.ParallelConfig` driving torch_xla SPMD for a plain PyTorch loop.

For users who keep their PyTorch training loop on torch_xla: `xla_mesh` builds a
``torch_xla.distributed.spmd.Mesh`` with jaxcore's four axes and sizes, and
`shard_module` marks every parameter with the sharding jaxcore's engine would give it
(regex rules such as `torchbridge.TENSOR_PARALLEL_RULES` first, then the logical-axis
rules table, then the automatic FSDP rule), so both stacks lay a model out the same way.
`shard_batch` splits a batch's leading dimension over ``data`` and ``fsdp``.

torch_xla is built against one torch release (2.9 for torch_xla 2.9), so this module runs
in the separate environment ``scripts/test-xla.sh`` builds, not next to torch 2.13.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

import jaxcore as jc


def xla_mesh(parallel: jc.ParallelConfig) -> Any:
    """A torch_xla SPMD mesh with jaxcore's axes (data, pipeline, fsdp, tensor)."""
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    n = xr.global_runtime_device_count()
    sizes = parallel.resolve(n).sizes()
    shape = tuple(sizes[a] for a in jc.MESH_AXES)
    return xs.Mesh(np.arange(n), shape, jc.MESH_AXES)


def _axes(target: Any) -> tuple[str, ...]:
    return () if target is None else (target,) if isinstance(target, str) else tuple(target)


def partition_spec(
    name: str,
    shape: Sequence[int],
    sizes: dict[str, int],
    *,
    param_rules: Sequence[tuple[str, tuple]] = (),
    rules: Sequence[tuple[str, Any]] = jc.DEFAULT_RULES,
    zero: int = 3,
) -> tuple:
    """The mesh axes per dimension for torch parameter ``name`` (``a.b.weight``).

    Mirrors the engine: a regex rule on the path ``a/b/weight`` names the dimensions, the
    first rule for each name whose axes are free, larger than 1 and divide the dimension
    wins; unnamed parameters get ``fsdp`` on their largest divisible dimension. Below ZeRO
    3, parameters are not sharded over ``fsdp``.
    """
    path = name.replace(".", "/")
    exclude = () if zero >= 3 else ("fsdp",)
    logical = next((tuple(n) for rx, n in param_rules if re.fullmatch(rx, path)), None)
    spec: list[Any] = [None] * len(shape)
    if logical is None:
        ways = sizes.get("fsdp", 1)
        if ways > 1 and "fsdp" not in exclude:
            dims = [d for d in range(len(shape)) if shape[d] % ways == 0]
            if dims:
                spec[max(dims, key=lambda d: (shape[d], -d))] = "fsdp"
        return tuple(spec)
    used: set[str] = set()
    for dim, lname in enumerate(logical):
        for rule_name, target in rules:
            if lname is None or rule_name != lname:
                continue
            wanted = tuple(a for a in _axes(target) if a not in exclude and sizes.get(a, 1) > 1)
            if not wanted or used.intersection(wanted):
                continue
            if shape[dim] % math.prod(sizes[a] for a in wanted):
                continue
            used.update(wanted)
            spec[dim] = wanted[0] if len(wanted) == 1 else wanted
            break
    return tuple(spec)


def shard_module(
    module: Any,
    mesh: Any,
    *,
    param_rules: Sequence[tuple[str, tuple]] = (),
    zero: int = 3,
) -> dict[str, tuple]:
    """Mark every parameter of ``module`` (already on the XLA device); return the specs."""
    import torch_xla.distributed.spmd as xs

    sizes = dict(zip(mesh.axis_names, mesh.mesh_shape, strict=True))
    specs = {}
    for name, p in module.named_parameters():
        spec = partition_spec(name, tuple(p.shape), sizes, param_rules=param_rules, zero=zero)
        xs.mark_sharding(p, mesh, spec)
        specs[name] = spec
    return specs


def shard_batch(batch: Any, mesh: Any) -> Any:
    """Split the leading dimension of a batch tensor by the rules table's ``batch`` rule."""
    import torch_xla.distributed.spmd as xs

    sizes = dict(zip(mesh.axis_names, mesh.mesh_shape, strict=True))
    lead = jc.batch_spec(sizes)[0]
    xs.mark_sharding(batch, mesh, (lead, *([None] * (batch.ndim - 1))))
    return batch
