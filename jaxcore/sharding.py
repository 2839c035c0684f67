"""Logical-axis rules: from the names on each array dimension to a `PartitionSpec`.

A rules table is an ordered sequence of ``(logical_name, mesh_axes)`` pairs. For each
dimension of an array, the first rule whose name matches and whose mesh axes are still
unused in that array and divide the dimension wins (MaxText's ``logical_axis_rules``).
A dimension no rule can shard is replicated; if a rule matched but the size did not
divide, a warning says so once.

The ZeRO stage decides where ``fsdp`` may appear (ZeRO paper, Rajbhandari et al. 2020):

=====  ==========  =========  ================
stage  parameters  gradients  optimizer state
=====  ==========  =========  ================
0      replicated  replicated replicated
1      replicated  replicated sharded
2      replicated  sharded    sharded
3      sharded     sharded    sharded
=====  ==========  =========  ================

Parameters that carry no names (PyTorch models, say) can be named by regex rules on
their path; failing that, the automatic rule shards their largest dimension that divides
over ``fsdp``.

This is the only module that decides which mesh axes an array uses. Batches, activations
and KV caches get theirs from the same table through `logical_sharding` (logical names
``batch``, ``length``, ``kv_heads``, ...); nothing else names a mesh axis for the batch.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jaxcore import axes, trace_context
from jaxcore.errors import ConfigError

log = logging.getLogger(__name__)

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]
LogicalAxes = tuple[str | None, ...]

DEFAULT_RULES: Rules = (
    (axes.BATCH, ("data", "fsdp")),
    (axes.LAYERS, "pipeline"),
    (axes.VOCAB, "tensor"),
    (axes.HEADS, "tensor"),
    (axes.KV_HEADS, "tensor"),
    (axes.MLP, "tensor"),
    (axes.EMBED, "fsdp"),
    (axes.LENGTH, None),
    (axes.HEAD_DIM, None),
    (axes.NORM, None),
)

ZERO_STAGES = (0, 1, 2, 3)
_warned: set[tuple] = set()


class SharedPattern(str):
    """A ``param_rules`` pattern written for many models (such as
    ``torchbridge.TENSOR_PARALLEL_RULES``): that it matches nothing in one model is expected,
    so `name_params` does not warn about it. A plain string is the user's own rule, and a
    rule of theirs that names no parameter is reported."""

    __slots__ = ()


def _warn_once(key: tuple, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def validate_rules(rules: Sequence[tuple[str, MeshAxes]], mesh_axes: Sequence[str]) -> Rules:
    """Check a rules table's shape and mesh-axis names; return it as a tuple."""
    if isinstance(rules, Mapping):
        raise ConfigError(
            f"rules={rules!r} is a dict: pass an ordered sequence of "
            "(logical_name, mesh_axes) pairs (the first match wins, and a name may have "
            "several rules), e.g. rules=[*my_rules.items(), *jc.DEFAULT_RULES]."
        )
    out = []
    for i, rule in enumerate(rules):
        if not (isinstance(rule, tuple | list) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ConfigError(
                f"rules[{i}]={rule!r}: each rule must be (logical_name, mesh_axis | "
                "tuple of mesh axes | None)."
            )
        name, target = rule
        targets = () if target is None else (target,) if isinstance(target, str) else target
        unknown = [t for t in targets if t not in mesh_axes]
        if unknown:
            raise ConfigError(
                f"rules[{i}] maps {name!r} to unknown mesh axes {unknown}; "
                f"the mesh axes are {tuple(mesh_axes)}."
            )
        out.append((name, target if target is None or isinstance(target, str) else tuple(target)))
    return tuple(out)


def validate_param_rules(param_rules: Sequence[tuple[str, LogicalAxes]], rules: Rules) -> None:
    """Check ``param_rules`` against the rules table: ``(regex, names)`` pairs whose names
    the table knows (a misspelt name would silently leave the parameter replicated)."""
    known = tuple(dict.fromkeys(name for name, _ in rules))
    for i, rule in enumerate(param_rules):
        if not (
            isinstance(rule, tuple | list)
            and len(rule) == 2
            and isinstance(rule[0], str)
            and isinstance(rule[1], tuple | list)
        ):
            raise ConfigError(
                f"param_rules[{i}]={rule!r}: each rule must be a (regex, logical names) pair, "
                'e.g. param_rules=[(r".*fc1/kernel", ("embed", "mlp"))] (note the outer list).'
            )
        pattern, names = rule
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"param_rules[{i}]: {pattern!r} is not a valid regex: {e}") from e
        unknown = [n for n in names if n is not None and n not in known]
        if unknown:
            raise ConfigError(
                f"param_rules[{i}] ({pattern!r}) names {unknown}, which the rules table does "
                f"not know; use one of {known}, None for a replicated dimension, or add a "
                "rule for the name to `rules`."
            )


def _as_tuple(target: MeshAxes) -> tuple[str, ...]:
    return () if target is None else (target,) if isinstance(target, str) else tuple(target)


def logical_to_spec(
    logical: LogicalAxes,
    shape: Sequence[int],
    mesh: Mesh,
    rules: Rules,
    *,
    exclude: Sequence[str] = (),
    where: str = "",
) -> PartitionSpec:
    """The `PartitionSpec` for an array of ``shape`` whose dimensions are named ``logical``.

    ``exclude`` lists mesh axes this array may not use (``fsdp`` for parameters below
    ZeRO 3). Mesh axes of size 1 are left out of the spec.
    """
    if len(logical) != len(shape):
        raise ConfigError(
            f"{where or 'array'}: {len(logical)} logical axis names {logical} for a "
            f"{len(shape)}-d array of shape {tuple(shape)}; give one name (or None) per dimension."
        )
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(logical):
        chosen: tuple[str, ...] = ()
        for rule_name, target in rules:
            if name is None or rule_name != name:
                continue
            wanted = tuple(
                a for a in _as_tuple(target) if a not in exclude and mesh.shape.get(a, 1) > 1
            )
            if not wanted or used.intersection(wanted):
                continue
            ways = 1
            for a in wanted:
                ways *= mesh.shape[a]
            if shape[dim] % ways:
                _warn_once(
                    (where, dim, shape[dim], str(wanted)),
                    "%s: dimension %d (%s, size %d) does not divide over mesh axes %s "
                    "(%d ways); replicating it instead.",
                    where or "array",
                    dim,
                    name,
                    shape[dim],
                    wanted,
                    ways,
                )
                continue
            chosen = wanted
            break
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
    return PartitionSpec(*spec)


def auto_spec(shape: Sequence[int], mesh: Mesh, *, exclude: Sequence[str] = ()) -> PartitionSpec:
    """The automatic rule for unnamed arrays: largest dimension divisible by ``fsdp``."""
    ways = mesh.shape.get("fsdp", 1)
    spec: list[str | None] = [None] * len(shape)
    if ways > 1 and "fsdp" not in exclude:
        candidates = [d for d in range(len(shape)) if shape[d] % ways == 0]
        if candidates:
            spec[max(candidates, key=lambda d: (shape[d], -d))] = "fsdp"
    return PartitionSpec(*spec)


def path_str(path: tuple) -> str:
    """``a/b/0/c`` for a pytree key path (the form regex parameter rules match)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def name_params(
    abstract_params: Any,
    model_axes: Any | None,
    param_rules: Sequence[tuple[str, LogicalAxes]] = (),
) -> Any:
    """Logical axes per parameter: regex rules on the path first, then the model's names.

    Returns a tree with the structure of ``abstract_params`` whose leaves are tuples of
    logical names, or ``None`` for parameters that have none (the automatic rule applies).
    """
    compiled = []
    for i, (pattern, names) in enumerate(param_rules):
        try:
            compiled.append((re.compile(pattern), tuple(names)))
        except re.error as e:
            raise ConfigError(f"param_rules[{i}]: {pattern!r} is not a valid regex: {e}") from e
    model_leaves = (
        None
        if model_axes is None
        else jax.tree.leaves(model_axes, is_leaf=lambda x: x is None or isinstance(x, tuple))
    )
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_params)
    out = []
    paths = [path_str(path) for path, _ in flat]
    matched = [False] * len(compiled)  # the pattern fullmatches some path
    first = [False] * len(compiled)  # and is the first rule to match one
    for i, p in enumerate(paths):
        names = None
        for j, (rx, n) in enumerate(compiled):
            if rx.fullmatch(p):
                matched[j] = True
                if names is None:
                    first[j], names = True, n
                    shape = tuple(getattr(flat[i][1], "shape", ()))
                    if len(n) != len(shape):
                        raise ConfigError(
                            f"param_rules[{j}] ({param_rules[j][0]!r}) gives {len(n)} names "
                            f"{n} to {p!r} of shape {shape}; give one logical name (or None) "
                            "per dimension, or narrow the regex."
                        )
        if names is None and model_leaves is not None:
            names = model_leaves[i]
        out.append(names)
    _report_idle_rules(param_rules, matched, first, paths)
    return jax.tree.unflatten(treedef, out)


def _report_idle_rules(
    param_rules: Sequence[tuple[str, LogicalAxes]],
    matched: list[bool],
    first: list[bool],
    paths: list[str],
) -> None:
    """Warn about the user's ``param_rules`` that name no parameter: a regex written for
    another path layout, or one every path of which an earlier rule already took. A
    warning, not an error: a misnamed parameter costs memory or speed, not correctness
    (as with an indivisible dimension), and one rules list may serve several models;
    `SharedPattern` rules (tables meant for many architectures) are left out."""
    for j, (pattern, _) in enumerate(param_rules):
        if first[j] or isinstance(pattern, SharedPattern):
            continue
        if not matched[j]:
            # The paths most like the pattern show how they are spelt.
            near = difflib.get_close_matches(pattern, paths, n=3, cutoff=0)
            sample = ", ".join(repr(p) for p in near) + f" (of {len(paths)})"
            _warn_once(
                ("param_rules", pattern, tuple(paths)),
                "param_rules[%d] %r matches no parameter, so it does nothing. Patterns are "
                "fullmatched (re.fullmatch) against paths such as %s: fix the regex (e.g. "
                "a leading '.*') or drop the rule.",
                j,
                pattern,
                sample,
            )
        else:
            _warn_once(
                ("param_rules", pattern, tuple(paths)),
                "param_rules[%d] %r only matches parameters an earlier rule already named "
                "(the first matching rule wins), so it does nothing: move it before the "
                "broader rule or drop it.",
                j,
                pattern,
            )


def _report_unruled_names(names: Any, abstract_params: Any, rules: Rules) -> None:
    """Warn about logical names parameters carry that no rule of ``rules`` mentions: those
    dimensions are replicated whatever the mesh, typically because a rule's name is
    misspelt (``("mpl", "tensor")``) or a custom table left the name out."""
    known = list(dict.fromkeys(name for name, _ in rules))
    users: dict[str, list[str]] = {}
    flat = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    leaves = jax.tree.leaves(names, is_leaf=lambda x: x is None or isinstance(x, tuple))
    for (path, _), logical in zip(flat, leaves, strict=True):
        for name in logical or ():
            if name is not None and name not in known:
                users.setdefault(name, []).append(path_str(path))
    used = {n for logical in leaves for n in (logical or ()) if n is not None}
    for name, where in users.items():
        idle = [k for k in known if k not in used]
        close = difflib.get_close_matches(name, idle, n=1)
        hint = f" The table's rule {close[0]!r} names no parameter: a misspelling?" if close else ""
        _warn_once(
            ("unruled", name, tuple(known)),
            "the rules table has no rule for the logical name %r (on %s), so those "
            "dimensions are replicated on every mesh.%s Add a rule (%r, mesh axes) to "
            "`rules`, or (name, None) to replicate it on purpose.",
            name,
            ", ".join(where[:6]) + (", ..." if len(where) > 6 else ""),
            hint,
            name,
        )


def logical_sharding(
    mesh: Mesh, rules: Rules, names: LogicalAxes, shape: Sequence[int] | None = None
) -> NamedSharding:
    """The sharding the rules table gives an array whose dimensions are named ``names``.

    With ``shape``, a rule whose mesh axes do not divide a dimension is passed over (as for
    parameters); without it, only the names decide (use it for arrays whose size is not
    known yet, such as a batch or a KV cache). E.g. a KV cache of shape ``(layers, batch,
    kv_heads, length, head_dim)``:
    ``logical_sharding(mesh, rules, ("layers", "batch", "kv_heads", "length", None))``.
    """
    known = list(dict.fromkeys(name for name, _ in rules))
    for name in names:
        if name is not None and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            _warn_once(
                ("logical_sharding", name, tuple(known)),
                "logical_sharding: the rules table has no rule for %r, so that dimension "
                "is replicated.%s Known names: %s.",
                name,
                f" Did you mean {close[0]!r}?" if close else "",
                ", ".join(map(repr, known)),
            )
    if shape is None:
        # Sizes every mesh split divides, so that only the names decide.
        shape = [max(mesh.devices.size, 1)] * len(names)
    return NamedSharding(mesh, logical_to_spec(tuple(names), shape, mesh, rules))


@dataclasses.dataclass(frozen=True)
class _AxisSizes:
    """Stands in for a mesh where only axis sizes are known (a torch_xla mesh, say)."""

    shape: Mapping[str, int]


def batch_spec(mesh: Mesh | Mapping[str, int], rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """The one-entry spec of a batch's leading axis: the ``batch`` rule on ``mesh``.

    ``mesh`` may also be a mapping of mesh-axis sizes, for meshes that are not JAX's.
    """
    if isinstance(mesh, Mapping):
        ways = math.prod(mesh.values())
        return logical_to_spec((axes.BATCH,), (ways,), _AxisSizes(dict(mesh)), rules)
    return logical_sharding(mesh, rules, (axes.BATCH,)).spec


def batch_ways(mesh: Mesh, rules: Rules) -> int:
    """How many shards a batch's leading axis is cut into on ``mesh``."""
    entry = batch_spec(mesh, rules)[0]
    ways = 1
    for a in _as_tuple(entry):
        ways *= mesh.shape[a]
    return ways


def local_rows(sharding: Sharding | None, global_batch: int, width: int = 1) -> tuple[int, int]:
    """The contiguous block ``[lo, hi)`` of a global batch's rows this process's devices hold.

    It is the part `jax.make_array_from_process_local_data` (and so
    `jaxcore.Engine.shard_batch`) expects from this process. It is not always
    ``1 / process_count`` of the batch: when the cross-process split of the mesh is on an
    axis the batch is not cut over (a ``pipeline`` axis spanning hosts), every process
    holds every row and must pass the whole batch. ``width`` is the length of a row,
    for shardings that name a second axis.
    """
    if sharding is None:
        return 0, global_batch
    try:
        index_map = sharding.addressable_devices_indices_map((global_batch, width))
    except ValueError as e:  # JAX's IndivisibleError (e.g. jc.Loader's global_batch_size)
        spec = getattr(sharding, "spec", None)
        if spec is None or not len(spec):
            raise ConfigError(f"a global batch of {global_batch} rows: {e}") from None
        ways = 1
        for a in _as_tuple(spec[0]):
            ways *= sharding.mesh.shape[a]
        raise ConfigError(
            f"a global batch of {global_batch} rows does not divide over the {ways} shards "
            f"the batch sharding cuts it into (mesh axes {spec[0]}); use a multiple of {ways}."
        ) from None
    spans = sorted(
        {
            (s[0].start or 0, global_batch if s[0].stop is None else s[0].stop)
            for s in index_map.values()
        }
    )
    lo, hi = spans[0][0], spans[0][1]
    for start, stop in spans[1:]:
        if start > hi:
            raise ConfigError(
                f"the batch sharding gives this process rows {spans}, which are not one "
                "contiguous block; put the cross-process split on the data or fsdp axis."
            )
        hi = max(hi, stop)
    return lo, hi


def process_batch_block(mesh: Mesh, rules: Rules) -> tuple[int, int]:
    """``(index, count)``: which block of a batch's rows this process holds, of how many.

    ``count`` runs from 1 (every process holds every row) to the process count.
    Processes with the same ``index`` hold the same rows, so they must pass the same data
    to `jaxcore.Engine.shard_batch`.
    """
    ways = batch_ways(mesh, rules)
    lo, hi = local_rows(NamedSharding(mesh, batch_spec(mesh, rules)), ways)
    return lo // (hi - lo), ways // (hi - lo)


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """Where every array of a run lives, all derived from one rules table.

    Attributes:
        params, grads, opt: trees of `NamedSharding` with the parameters' structure, for
            the parameters, gradients and parameter-shaped optimizer slots (ZeRO stage).
        batch: the sharding of every batch leaf (leading axis by the ``batch`` rule).
        mesh, rules: the mesh and rules table, for activation and cache shardings
            (`activation`).
    """

    params: Any
    grads: Any
    opt: Any
    batch: NamedSharding | None = None
    mesh: Mesh | None = None
    rules: Rules = ()

    def activation(self, names: LogicalAxes, shape: Sequence[int] | None = None) -> NamedSharding:
        """The sharding of an activation (or KV cache) whose dimensions are ``names``."""
        if self.mesh is None:
            raise ConfigError("ShardingPlan.activation: this plan was built without a mesh.")
        return logical_sharding(self.mesh, self.rules, names, shape)


def plan(abstract_params: Any, logical: Any, mesh: Mesh, rules: Rules, zero: int) -> ShardingPlan:
    """Shardings of parameters, gradients and optimizer state for ZeRO stage ``zero``."""
    if zero not in ZERO_STAGES:
        raise ConfigError(f"zero={zero!r}: the ZeRO stage must be one of {ZERO_STAGES}.")

    def shardings(exclude: tuple[str, ...]) -> Any:
        def one(path, leaf, names):
            where = path_str(path)
            if names is None:
                spec = auto_spec(leaf.shape, mesh, exclude=exclude)
            else:
                spec = logical_to_spec(names, leaf.shape, mesh, rules, exclude=exclude, where=where)
            return NamedSharding(mesh, spec)

        return _map_with_names(one, abstract_params, logical)

    _report_unruled_names(logical, abstract_params, rules)
    no_fsdp = ("fsdp",)
    return ShardingPlan(
        params=shardings(() if zero >= 3 else no_fsdp),
        grads=shardings(() if zero >= 2 else no_fsdp),
        opt=shardings(() if zero >= 1 else no_fsdp),
        batch=NamedSharding(mesh, batch_spec(mesh, rules)),
        mesh=mesh,
        rules=rules,
    )


def opt_state_shardings(
    abstract_opt: Any, abstract_params: Any, slot_shardings: Any, default: NamedSharding
) -> Any:
    """Shardings of an optimizer state: parameter-shaped slots follow their parameter.

    A leaf of the state is a slot of parameter ``p`` when its key path ends with ``p``'s
    path and it has ``p``'s shape (Adam's ``mu``/``nu``, momentum, EMA copies, whatever
    wrappers hold them: ``multi_transform``, ``masked``, ``chain``). Every other leaf (step
    counts, scalars, factored statistics) gets ``default``. Matching by path rather than
    through ``optax.tree_map_params`` is what lets parameter groups work: that function
    re-runs ``init`` on a placeholder, which ``multi_transform``'s labels cannot handle.
    """
    table: dict[tuple, tuple[tuple[int, ...], NamedSharding]] = {}
    flat_p = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    for (path, leaf), sharding in zip(flat_p, jax.tree.leaves(slot_shardings), strict=True):
        table[tuple(path)] = (tuple(leaf.shape), sharding)

    def one(path, leaf):
        path = tuple(path)
        for start in range(len(path)):  # longest suffix first
            hit = table.get(path[start:])
            if hit is not None and hit[0] == tuple(getattr(leaf, "shape", ())):
                return hit[1]
        return default

    return jax.tree_util.tree_map_with_path(one, abstract_opt)


def _map_with_names(fn, tree: Any, names: Any) -> Any:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    name_leaves = jax.tree.leaves(names, is_leaf=lambda x: x is None or isinstance(x, tuple))
    return jax.tree.unflatten(
        treedef, [fn(p, leaf, n) for (p, leaf), n in zip(flat, name_leaves, strict=True)]
    )


def constrain(x: jax.Array, logical: LogicalAxes) -> jax.Array:
    """Constrain an activation's sharding by logical names (no-op outside an engine trace)."""
    ctx = trace_context.current()
    if ctx.mesh is None:
        return x
    spec = logical_to_spec(logical, x.shape, ctx.mesh, ctx.rules, where="activation")
    # Inside a shard_map (a pipeline stage) the constraint must name the abstract mesh
    # that marks its manual axes; the rules there no longer map anything to them.
    current = jax.sharding.get_abstract_mesh()
    mesh = current if not current.empty and current.manual_axes else ctx.mesh
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def per_device_bytes(tree: Any) -> dict[jax.Device, int]:
    """Bytes each device holds for the arrays in ``tree``, from their shardings."""
    totals: dict[jax.Device, int] = {}
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        for shard in leaf.addressable_shards:
            totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
    return totals
