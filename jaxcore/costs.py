"""What a model and a layout cost, found without running them.

- `module_table`: parameters and forward FLOPs per parameter (or module), like DeepSpeed's
  flops profiler, but read from the traced program instead of hooks: every ``dot_general``
  in the jaxpr is charged to the parameter(s) its operands come from (following views,
  casts, ``scan`` over stacked layers and nested ``jit``), multiplied by the trip count of
  the enclosing scans. Matmuls between activations (attention scores and values) go to
  the row ``(activations)``. Only matmuls are counted: the same convention as the MFU
  numerator (PaLM appendix B), so ``3 * forward`` is the training FLOP count.
- `compile_estimate`: compile the train step ahead of time for a mesh (on the devices
  given, or a topology description from `topology_devices`) and read XLA's per-device
  memory and FLOP analysis before any array exists -- the idea of MaxText's
  ``train_compile.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend import core as jcore
from jax.sharding import NamedSharding

from jaxcore.errors import ConfigError
from jaxcore.sharding import path_str

NO_PARAM = "(activations)"
# Primitives whose output is the same parameter, reshaped or cast: provenance flows through.
_VIEW_OPS = frozenset(
    {
        "convert_element_type",
        "reshape",
        "transpose",
        "squeeze",
        "expand_dims",
        "broadcast_in_dim",
        "slice",
        "dynamic_slice",
        "copy",
        "copy_p",
        "sharding_constraint",
        "device_put",
        "reduce_precision",
        "optimization_barrier",
    }
)

Prov = frozenset[str]


@dataclasses.dataclass(frozen=True)
class CostRow:
    """One line of `module_table`: a parameter (or module) and what it costs."""

    name: str
    params: int
    forward_flops: float

    @property
    def train_flops(self) -> float:
        """Forward + backward: the backward pass does two matmuls per forward one."""
        return 3.0 * self.forward_flops


@dataclasses.dataclass(frozen=True)
class CostTable:
    """Per-parameter (or per-module) parameter counts and matmul FLOPs of one forward."""

    rows: tuple[CostRow, ...]

    @property
    def total_params(self) -> int:
        return sum(r.params for r in self.rows)

    @property
    def forward_flops(self) -> float:
        return sum(r.forward_flops for r in self.rows)

    @property
    def train_flops(self) -> float:
        return 3.0 * self.forward_flops

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {r.name: {"params": r.params, "forward_flops": r.forward_flops} for r in self.rows}

    def render(self) -> str:
        """The table as text (rich), largest FLOP share first."""
        from rich.console import Console
        from rich.table import Table

        table = Table(title="parameters and FLOPs per module (one forward)")
        for col in ("module", "params", "fwd GFLOPs", "train GFLOPs", "share"):
            table.add_column(col, justify="left" if col == "module" else "right")
        total = max(self.forward_flops, 1.0)
        for r in sorted(self.rows, key=lambda r: -r.forward_flops):
            table.add_row(
                r.name,
                f"{r.params:,}",
                f"{r.forward_flops / 1e9:.4g}",
                f"{r.train_flops / 1e9:.4g}",
                f"{100 * r.forward_flops / total:.1f}%",
            )
        table.add_row(
            "total",
            f"{self.total_params:,}",
            f"{self.forward_flops / 1e9:.4g}",
            f"{self.train_flops / 1e9:.4g}",
            "100%",
        )
        console = Console(width=110, record=True, file=_Null())
        console.print(table)
        return console.export_text()


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def _dot_flops(eqn: Any) -> float:
    lhs = eqn.invars[0].aval
    (contract_lhs, _), _ = eqn.params["dimension_numbers"]
    out = eqn.outvars[0].aval
    return 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in contract_lhs)


def _sub_jaxprs(eqn: Any) -> list[tuple[Any, float]]:
    """Sub-programs of ``eqn`` with how many times each runs per call."""
    p = eqn.params
    name = eqn.primitive.name
    if name == "scan":
        return [(p["jaxpr"], float(p["length"]))]
    if name == "cond":
        return [(b, 1.0) for b in p["branches"]]
    if name == "while":
        return [(p["body_jaxpr"], 1.0)]  # trip count unknown: counted once
    found = []
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in p and p[key] is not None:
            found.append((p[key], 1.0))
    return found


def _walk(jaxpr: Any, prov_in: Sequence[Prov], acc: dict[str, float], mult: float) -> list[Prov]:
    """Charge every dot to its parameters; return the provenance of ``jaxpr``'s outputs."""
    prov: dict[Any, Prov] = {}
    for v, p in zip(jaxpr.invars, prov_in, strict=False):
        prov[v] = p

    def get(v: Any) -> Prov:
        return frozenset() if isinstance(v, jcore.Literal) else prov.get(v, frozenset())

    for eqn in jaxpr.eqns:
        ins = [get(v) for v in eqn.invars]
        name = eqn.primitive.name
        outs: list[Prov] = [frozenset()] * len(eqn.outvars)
        if name == "dot_general":
            owners = frozenset().union(*ins[:2])
            label = " + ".join(sorted(owners)) if owners else NO_PARAM
            acc[label] += mult * _dot_flops(eqn)
        elif name in _VIEW_OPS:
            outs = [frozenset().union(*ins)] * len(eqn.outvars)
        else:
            subs = _sub_jaxprs(eqn)
            if name == "cond":
                # Charge the costliest branch only (one of them runs).
                best: dict[str, float] | None = None
                for sub, _ in subs:
                    trial: dict[str, float] = defaultdict(float)
                    _walk(_open(sub), ins[1:], trial, mult)
                    if best is None or sum(trial.values()) > sum(best.values()):
                        best = trial
                for k, v in (best or {}).items():
                    acc[k] += v
            elif name == "while":
                n_cond = eqn.params["cond_nconsts"]
                _walk(_open(eqn.params["body_jaxpr"]), ins[n_cond:], acc, mult)
            else:
                for sub, times in subs:
                    sub_outs = _walk(_open(sub), ins, acc, mult * times)
                    if name != "scan" and len(sub_outs) == len(eqn.outvars):
                        outs = sub_outs
        for v, p in zip(eqn.outvars, outs, strict=True):
            prov[v] = p
    return [get(v) for v in jaxpr.outvars]


def _open(j: Any) -> Any:
    return j.jaxpr if hasattr(j, "jaxpr") else j


def _group(name: str, depth: int | None) -> str:
    if depth is None:
        return name
    return "/".join(name.split("/")[:depth]) or name


def function_table(
    apply: Callable[..., Any], params: Any, *inputs: Any, depth: int | None = None
) -> CostTable:
    """`CostTable` of ``apply(params, *inputs)``; arrays or ``ShapeDtypeStruct`` work.

    ``depth`` groups parameter paths (``a/b/c``) by their first ``depth`` components
    (``None``: one row per parameter).
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    names = [path_str(p) or "param" for p, _ in flat]
    closed = jax.make_jaxpr(apply)(params, *inputs)
    n_inputs = len(jax.tree.leaves(inputs))
    prov_in = [frozenset({n}) for n in names] + [frozenset()] * n_inputs
    acc: dict[str, float] = defaultdict(float)
    _walk(closed.jaxpr, prov_in, acc, 1.0)
    counts: dict[str, int] = defaultdict(int)
    flops: dict[str, float] = defaultdict(float)
    for n, (_, leaf) in zip(names, flat, strict=True):
        counts[_group(n, depth)] += math.prod(leaf.shape)
    for label, f in acc.items():
        # A matmul touching several parameters is split evenly between their groups.
        parts = label.split(" + ") if label != NO_PARAM else [NO_PARAM]
        for part in parts:
            flops[part if part == NO_PARAM else _group(part, depth)] += f / len(parts)
    keys = list(dict.fromkeys([*counts, *flops]))
    return CostTable(tuple(CostRow(k, counts.get(k, 0), flops.get(k, 0.0)) for k in keys))


def module_table(model: Any, *inputs: Any, depth: int | None = None) -> CostTable:
    """`CostTable` of an ``nnx.Module`` called on ``inputs`` (traced, never run).

    The model may be abstract (``nnx.eval_shape(lambda: Model(...))``) and the inputs
    ``jax.ShapeDtypeStruct``, so even a model too large for this host can be profiled.
    """
    from flax import nnx

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    pure = nnx.to_pure_dict(params)

    def apply(pure_params, *args):
        state = jax.tree.map(lambda x: x, params)
        nnx.replace_by_pure_dict(state, pure_params)
        return nnx.merge(graphdef, state, rest)(*args)

    return function_table(apply, pure, *inputs, depth=depth)


# ------------------------------------------------------------------- ahead-of-time compile
@dataclasses.dataclass(frozen=True)
class CompileEstimate:
    """XLA's per-device numbers for a compiled step (bytes; FLOPs per device program).

    ``per_device_bytes`` is what one device needs at the peak of the step: arguments
    (state shard and batch shard) + outputs + temporaries - buffers donated in place.
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    flops: float | None

    @property
    def per_device_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes


def estimate_from_compiled(compiled: Any) -> CompileEstimate:
    """Read a ``jax.stages.Compiled``'s memory and cost analysis."""
    mem = compiled.memory_analysis()
    if mem is None:
        raise ConfigError("compile_estimate: this backend reports no memory analysis.")
    return CompileEstimate(
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        generated_code_bytes=int(mem.generated_code_size_in_bytes),
        flops=compiled_flops(compiled),
    )


def compiled_flops(compiled: Any) -> float | None:
    """XLA's FLOP count of a compiled program (per device for SPMD programs)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


def abstract_state(engine: Any, model: Any, optimizer: Any) -> Any:
    """The `TrainState` ``engine.prepare`` would build, as sharded ``ShapeDtypeStruct``s.

    ``engine.plan(...).abstract()``: the shardings are planned but no parameter is
    initialised, so this works for models larger than the host.
    """
    return engine.plan(model, optimizer).abstract()


def abstract_batch(engine: Any, batch: Any) -> Any:
    """``ShapeDtypeStruct``s with the engine's batch sharding for a batch's global shapes.

    ``batch`` holds arrays or ``(shape, dtype)`` pairs.
    """

    def one(x):
        shape, dtype = (x.shape, x.dtype) if hasattr(x, "shape") else x
        return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=engine.batch_sharding)

    return jax.tree.map(one, batch, is_leaf=lambda x: isinstance(x, tuple))


def compile_estimate(
    engine: Any, model: Any, optimizer: Any, loss_fn: Any, batch: Any
) -> CompileEstimate:
    """Compile ``engine``'s train step ahead of time and report per-device memory and FLOPs.

    ``batch`` gives the global batch's shapes (arrays or ``(shape, dtype)`` pairs). Nothing
    is allocated on the devices, so the engine may be built on a topology description
    (`topology_devices`) of hardware this host does not have.
    """
    plan = engine.plan(model, optimizer)
    step = plan.train_step(loss_fn)
    compiled = step.jitted.lower(plan.abstract(), abstract_batch(engine, batch)).compile()
    return estimate_from_compiled(compiled)


def topology_devices(platform: str, topology_name: str, **kwargs: Any) -> list[Any]:
    """Devices of a topology this host does not have (e.g. ``("tpu", "v5e:4x4")``).

    Wraps ``jax.experimental.topologies.get_topology_desc``; compiling for TPU topologies
    needs ``libtpu`` installed (MaxText's ``train_compile.py`` does the same).
    """
    from jax.experimental import topologies

    try:
        desc = topologies.get_topology_desc(
            platform=platform, topology_name=topology_name, **kwargs
        )
    except Exception as e:
        raise ConfigError(
            f"topology_devices({platform!r}, {topology_name!r}): JAX could not describe this "
            f"topology ({e}). For TPU topologies install libtpu (pip install jax[tpu])."
        ) from e
    return list(desc.devices)


def sharded_bytes(abstract: Any) -> int:
    """Bytes one device holds of a tree of sharded ``ShapeDtypeStruct``s (the largest shard)."""
    total = 0
    for leaf in jax.tree.leaves(abstract):
        sharding = getattr(leaf, "sharding", None)
        shape = (
            sharding.shard_shape(leaf.shape) if isinstance(sharding, NamedSharding) else leaf.shape
        )
        total += math.prod(shape) * leaf.dtype.itemsize
    return total
