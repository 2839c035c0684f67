"""A `torch.nn.Module` as the engine's model form, run on JAX through torchax.

`from_torch(module)` returns a `jaxcore.ModelAdapter`:

- params: the trainable parameters as a nested dict keyed by the torch names split on
  ``.`` (``layers.0.q_proj.weight`` -> ``params["layers"]["0"]["q_proj"]["weight"]``), so
  regex parameter rules see the path ``layers/0/q_proj/weight``. Tied parameters appear
  once, under their first name (as ``module.parameters()`` lists them).
- model_state: buffers (and frozen parameters), updated by the step: train-mode BatchNorm
  writes its running statistics back (torchax 0.0.13 computes them but drops them).
- bind: returns a `BoundModule`; calling it runs the torch ``forward`` on JAX values
  (tracers inside the jitted step) and returns JAX arrays.
- logical_axes: ``None`` (torch parameters carry no names): the engine's automatic rule
  shards them over ``fsdp``; `torchbridge.sharding` adds tensor-parallel regex rules.

Randomness: ``model(x, rng=key)`` makes torch's random ops (dropout) draw from ``key``,
the per-step key the engine passes to the loss function; ``rng=None`` runs the module in
eval mode (what ``engine.eval_step`` asks for). The idea of a functional call with
swapped-in parameters is torch.func's ``functional_call`` (used through torchax's
``JittableModule``); the key-per-call design follows Flax's explicit RNG streams.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxcore as jc
from torchbridge import _compat
from torchbridge.errors import UnsupportedError, UntraceableError

log = logging.getLogger(__name__)

EVAL_MODE_WARNING = (
    "torchbridge: the {name} module is in eval mode (what from_pretrained and .eval() "
    "leave), so training steps would run with dropout off and BatchNorm statistics frozen. "
    "Call module.train() first, or pass train=True to train it in train mode (train=False "
    "keeps eval mode and silences this warning)."
)

# JAX errors that mean "this value was needed on the host while tracing".
_DATA_DEPENDENT = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)


# ----------------------------------------------------------------------------- conversion
def to_numpy(t: Any) -> np.ndarray:
    """A torch tensor as a NumPy array JAX accepts (64-bit narrowed unless x64 is on)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    a = t.numpy()
    if not jax.config.jax_enable_x64:
        if a.dtype == np.int64:
            a = a.astype(np.int32)
        elif a.dtype == np.float64:
            a = a.astype(np.float32)
    return a


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": x}`` -> ``{"a": {"b": x}}``."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        node = out
        *parents, leaf = name.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """The inverse of `nest`."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


# ----------------------------------------------------------------------------- the spec
@dataclasses.dataclass(frozen=True)
class ModuleSpec:
    """What the bridge knows about a torch module's tensors (for state dicts, ties, dtypes).

    Attributes:
        params: trainable parameter names (ties removed), in ``named_parameters`` order.
        state: buffer and frozen-parameter names (the model_state leaves).
        aliases: tied name -> the name it shares storage with.
        dtypes: torch dtype per name (params, state and aliases).
        shapes: shape per name.
        state_dict_keys: the keys of ``module.state_dict()`` (persistent buffers only).
    """

    params: tuple[str, ...]
    state: tuple[str, ...]
    aliases: dict[str, str]
    dtypes: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    state_dict_keys: tuple[str, ...]

    @classmethod
    def of(cls, module: Any) -> ModuleSpec:
        first: dict[int, str] = {}
        params, state, aliases, dtypes, shapes = [], [], {}, {}, {}
        for name, p in module.named_parameters(remove_duplicate=False):
            dtypes[name], shapes[name] = p.dtype, tuple(p.shape)
            if id(p) in first:
                aliases[name] = first[id(p)]
                continue
            first[id(p)] = name
            (params if p.requires_grad else state).append(name)
        for name, b in module.named_buffers(remove_duplicate=False):
            dtypes[name], shapes[name] = b.dtype, tuple(b.shape)
            if id(b) in first:
                aliases[name] = first[id(b)]
                continue
            first[id(b)] = name
            state.append(name)
        return cls(
            params=tuple(params),
            state=tuple(state),
            aliases=aliases,
            dtypes=dtypes,
            shapes=shapes,
            state_dict_keys=_state_dict_keys(module),
        )


def _state_dict_keys(module: Any) -> tuple[str, ...]:
    """The keys of ``module.state_dict()``, read without `_warn_if_behind`'s warning."""
    with _quietly():
        return tuple(module.state_dict(keep_vars=True).keys())


# ----------------------------------------------------------------------------- stale weights
# A prepared torch module keeps the tensors it had at prepare: training updates the
# TrainState only. Modules a bridged step has trained since prepare, or since the last
# `load_state_dict` into them, are "behind"; their own ``state_dict()`` (what
# ``torch.save(model.state_dict())`` and ``save_pretrained`` read) warns instead of handing
# back the pre-training weights silently, and so does running it eagerly (``model(x)``,
# ``model.generate(...)``) outside a bridged call. The hooks are module-level functions,
# so a hooked module still pickles and deep-copies (a copy is not behind).
_BEHIND: weakref.WeakSet = weakref.WeakSet()
_quiet = threading.local()

BEHIND_WARNING = (
    "torchbridge: {name}.state_dict() after bridged training steps returns the weights "
    "from before them: the trained ones are in the TrainState, and the torch module keeps "
    "the tensors it had at prepare. Use torchbridge.state_dict(state) (or "
    "torchbridge.save_safetensors(state, path)), or first copy them into the module with "
    "model.load_state_dict(torchbridge.state_dict(state))."
)


CALLED_BEHIND_WARNING = (
    "torchbridge: {name} runs eagerly in torch after bridged training steps, on the weights "
    "from before them (the trained ones are in the TrainState). Copy them in first: "
    "model.load_state_dict(torchbridge.state_dict(state))."
)


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """Silence `_warn_if_behind` / `_warn_if_called_behind` (the bridge's own reads)."""
    old = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = old


def _warn_if_behind(module: Any, prefix: str, keep_vars: bool) -> None:
    """``state_dict`` pre-hook: warn when the module's own tensors are behind the state."""
    del prefix, keep_vars
    if module in _BEHIND and not getattr(_quiet, "on", False):
        warnings.warn(BEHIND_WARNING.format(name=type(module).__name__), stacklevel=3)


def _warn_if_called_behind(module: Any, args: Any) -> None:
    """Forward pre-hook: warn when an eager call would use weights behind the state."""
    del args
    if module in _BEHIND and not getattr(_quiet, "on", False):
        # Up the stack: torch's `inner`, `_call_impl`, `_wrapped_call_impl`, the caller.
        warnings.warn(CALLED_BEHIND_WARNING.format(name=type(module).__name__), stacklevel=5)


def _caught_up(module: Any, incompatible_keys: Any) -> None:
    """``load_state_dict`` post-hook: the module holds the weights just loaded."""
    del incompatible_keys
    _BEHIND.discard(module)


def _watch_staleness(module: Any) -> None:
    """Hook ``module``'s state_dict / load_state_dict once (see `_BEHIND`).

    A module prepared again after training without the trained weights loaded would
    restart from its old ones: that warns too.
    """
    if module in _BEHIND:
        warnings.warn(
            f"torchbridge: preparing {type(module).__name__} again after bridged training "
            "steps starts from its own tensors, the weights from before those steps. Load "
            "the trained ones first: model.load_state_dict(torchbridge.state_dict(state)).",
            stacklevel=5,
        )
    # A deep copy of a hooked module carries the hooks already.
    if _warn_if_behind in getattr(module, "_state_dict_pre_hooks", {}).values():
        return
    module.register_state_dict_pre_hook(_warn_if_behind)
    module.register_load_state_dict_post_hook(_caught_up)
    module.register_forward_pre_hook(_warn_if_called_behind)


# ----------------------------------------------------------------------------- environment
def _batch_norm_writing_back(env: Any) -> Callable:
    """``native_batch_norm`` that updates the running statistics in place (as torch does).

    torchax 0.0.13 computes new running stats but returns them nowhere, and uses the biased
    variance; torch updates ``running_var`` with the unbiased one (``n / (n - 1)``).
    """

    def batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
        xj = x.jax()
        dims = (0, *range(2, xj.ndim))
        shape = (1, -1) + (1,) * (xj.ndim - 2)
        x32 = xj.astype(jnp.float32)
        if training or running_mean is None:
            mean = jnp.mean(x32, axis=dims)
            var = jnp.var(x32, axis=dims)
            if training and running_mean is not None:
                n = xj.size // xj.shape[1]
                m = momentum
                new_mean = (1 - m) * running_mean.jax() + m * jax.lax.stop_gradient(mean)
                unbiased = jax.lax.stop_gradient(var) * (n / max(n - 1, 1))
                new_var = (1 - m) * running_var.jax() + m * unbiased
                running_mean._elem = new_mean.astype(running_mean.jax().dtype)
                running_var._elem = new_var.astype(running_var.jax().dtype)
        else:
            mean = running_mean.jax().astype(jnp.float32)
            var = running_var.jax().astype(jnp.float32)
        rstd = jax.lax.rsqrt(var + eps)
        y = (x32 - mean.reshape(shape)) * rstd.reshape(shape)
        if weight is not None:
            y = y * weight.jax().reshape(shape)
        if bias is not None:
            y = y + bias.jax().reshape(shape)
        saved = (mean, rstd) if training else (jnp.zeros((0,), xj.dtype),) * 2
        return env.j2t_iso((y.astype(xj.dtype), *saved))

    return batch_norm


def _embedding(env: Any) -> Callable:
    """``aten::embedding`` with torch's gradient: ``padding_idx``'s row gets none and
    ``scale_grad_by_freq`` divides each row's gradient by the number of times its id occurs
    in the batch (torch's ``embedding_dense_backward``; torchax ignores the flag).

    Written as a JVP linear in the weight's tangent, whose transpose is that gradient (as
    torchax does for ``padding_idx``)."""

    @functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
    def take(weight, ids, padding_idx, by_freq):
        return jnp.take(weight, ids, axis=0)

    @take.defjvp
    def take_jvp(padding_idx, by_freq, primals, tangents):
        weight, ids = primals
        w_dot = tangents[0]
        if padding_idx is not None and padding_idx >= 0:
            w_dot = w_dot.at[padding_idx].set(0)
        y_dot = jnp.take(w_dot, ids, axis=0)
        if by_freq:
            # float32 counts: bf16 holds integers exactly only up to 256
            counts = jnp.zeros(weight.shape[0], jnp.float32).at[ids.reshape(-1)].add(1)
            scale = 1 / jnp.take(counts, ids, axis=0)[..., None]
            y_dot = (y_dot * scale).astype(w_dot.dtype)
        return jnp.take(weight, ids, axis=0), y_dot

    def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        w, ids = weight.jax(), indices.jax()
        if padding_idx < 0 and not scale_grad_by_freq:
            return env.j2t_iso(jnp.take(w, ids, axis=0))
        pad = padding_idx if padding_idx >= 0 else None
        return env.j2t_iso(take(w, ids, pad, bool(scale_grad_by_freq)))

    return embedding


def _causal_attention(env: Any, reference: Callable) -> Callable:
    """``F.scaled_dot_product_attention`` through jaxcore's causal kernel where it applies.

    torchax's own lowering adds a float ``(L, S)`` bias built with ``masked_fill`` and
    multiplies the full square, masked half included. For the common training call
    (causal, no explicit mask, no dropout, default scale, ``L == S``) this runs
    `jaxcore.models.transformer.causal_heads_first` instead: the same arithmetic on
    ``(batch, heads, length, dim)`` arrays as they come, skipping the blocks above the
    diagonal. Any other call goes to torchax's reference lowering unchanged, and so do
    sequences too short to split into query blocks (`query_blocks` = 1), where the kernel
    saves nothing: under tensor parallelism its grouped-heads einsums cost GPT-2 2 more
    all-gathers and 8 more collective-permutes per step than torchax's lowering.
    """
    from jaxcore.models.transformer import causal_heads_first, query_blocks

    def sdpa(
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        q, k, v = query.jax(), key.jax(), value.jax()
        fits = (
            is_causal
            and attn_mask is None
            and dropout_p == 0.0
            and (scale is None or scale == 1 / np.sqrt(q.shape[-1]))
            and q.ndim == 4
            and q.shape[-2] == k.shape[-2]
            and q.shape[1] % k.shape[1] == 0
            and (enable_gqa or q.shape[1] == k.shape[1])
            and query_blocks(q.shape[-2]) > 1
        )
        if not fits:
            return reference(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        b, h, t, d = q.shape
        kv = k.shape[1]
        out = causal_heads_first(q.reshape(b, kv, h // kv, t, d), k, v)
        return env.j2t_iso(out.reshape(b, h, t, d))

    return sdpa


class _OpFailure:
    """Records which op raised first (innermost), for the untraceable-model error."""

    def __init__(self):
        self.local = threading.local()

    @property
    def op(self) -> str | None:
        return getattr(self.local, "op", None)

    @op.setter
    def op(self, value: str | None) -> None:
        self.local.op = value


_failure = _OpFailure()


class _Usage:
    """Which trainable parameters the running call's ops read (per thread)."""

    def __init__(self):
        self.local = threading.local()

    def start(self, names: dict[int, str], seen: set[str]) -> tuple:
        old = (getattr(self.local, "names", None), getattr(self.local, "seen", None))
        self.local.names, self.local.seen = names, seen
        return old

    def stop(self, old: tuple) -> None:
        self.local.names, self.local.seen = old

    def record(self, args: Any, kwargs: Any) -> None:
        names = getattr(self.local, "names", None)
        if not names:
            return
        from torch.utils import _pytree

        for leaf in _pytree.tree_leaves((args, kwargs)):
            name = names.get(id(leaf))
            if name is not None:
                self.local.seen.add(name)


_usage = _Usage()
# Per torch module, the trainable parameters that get no gradient in the step being traced
# (the loss never read them, or they were frozen with ``requires_grad_(False)`` after
# prepare): torch's ``.grad`` is None for them, so `torchbridge.to_optax`'s update skips
# them. Written while the loss traces, read when the optimizer update traces right after.
NO_GRAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_env_lock = threading.Lock()
_env: Any = None


def _op_name(func: Any) -> str:
    name = getattr(func, "name", None)
    if callable(name):
        return name()
    return getattr(func, "__name__", str(func))


def environment() -> Any:
    """The bridge's own torchax `Environment` (the global default one is left alone)."""
    global _env
    with _env_lock:
        if _env is not None:
            return _env
        torchax = _compat.load_torchax()
        import torch
        from torchax import tensor

        class Environment(tensor.Environment):
            # Inside a bridged call every tensor lives on JAX: constructors such as
            # `torch.arange(t)` (default device cpu) and `.to("cpu")` must not leave it.
            def _should_use_torchax_tensor(self, device):
                return True

            def _is_same_device(self, the_tensor, new_device):
                return True

            def dispatch(self, func, types, args, kwargs):
                _usage.record(args, kwargs)
                try:
                    return super().dispatch(func, types, args, kwargs)
                except _DATA_DEPENDENT:
                    if _failure.op is None:
                        _failure.op = _op_name(func)
                    raise

        env = Environment()
        bn = _batch_norm_writing_back(env)
        for op in (torch.ops.aten.native_batch_norm.default,):
            env.override_op_definition(op, bn)
        legit = torch.ops.aten._native_batch_norm_legit.default
        env.override_op_definition(legit, bn)
        from torchax.ops import jtorch

        env.override_op_definition(torch.ops.aten.embedding.default, _embedding(env))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        env.override_op_definition(sdpa, _causal_attention(env, jtorch._sdpa_reference))
        log.debug("torchax %s environment ready", torchax.__version__)
        _env = env
        return env


# ----------------------------------------------------------------------------- calling
def _refuse_autocast(name: str) -> None:
    """Refuse a module run inside ``torch.autocast``, which would silently stay float32.

    torch's autocast casts CPU and CUDA tensors only; the bridged module's tensors live on
    JAX, so its matmuls would run in float32 while the script expects bf16 / fp16.
    """
    import torch

    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            raise UnsupportedError(
                f"torchbridge: module '{name}' ran inside torch.autocast({device!r}, "
                f"dtype={torch.get_autocast_dtype(device)}), which has no effect on the "
                "bridged module (its tensors live on JAX): it would silently compute in "
                "float32. Remove the autocast region and build the engine with "
                "jc.Engine(precision='bf16') (or 'fp16', with loss scaling): the module's "
                "weights and float32 inputs are cast for its compute."
            )


def _refuse_foreign(mod: Any, root: str) -> None:
    """Refuse a torch module with its own parameters called inside a bridged call.

    Only the prepared module's parameters are JAX arrays there; another module's (the
    discriminator called in a GAN generator's loss) are torch CPU tensors, which torchax
    cannot mix with them ("mixed math between XLATensor and torch.Tensor").
    """
    from torchax import tensor

    plain = [n for n, p in mod.named_parameters() if not isinstance(p, tensor.Tensor)]
    if not plain:
        return
    raise UnsupportedError(
        f"torchbridge: module '{type(mod).__name__}' (parameter {plain[0]!r}) ran inside a "
        f"bridged call of '{root}' but is not the one prepared for this step nor part of "
        "it: its parameters are torch's own tensors, not the step's. Put the models used "
        "together in one nn.Module (e.g. a container holding the generator and the "
        "discriminator) and prepare that, once per optimizer if each optimizer trains its "
        "own part; before each step, copy the other part's trained parameters into that "
        "state (state.replace(params={**state.params, 'D': jax.tree.map(jnp.copy, "
        "other.params['D'])}))."
    )


def _grad_scaler_refused(_scaler: Any, _outputs: Any) -> Any:
    raise UnsupportedError(
        "torchbridge: GradScaler.scale(loss) inside a bridged call would return the loss "
        "times the scale (2**16 by default), and the step would differentiate that: "
        "gradients that many times too large, never unscaled (no torch backward runs, and "
        "scaler.step / update never see it). Return the plain loss and drop the "
        "GradScaler; for float16 loss scaling use jc.Engine(precision='fp16')."
    )


@contextlib.contextmanager
def _without_grad_scaler() -> Iterator[None]:
    """Make ``GradScaler.scale`` raise while a bridged call runs (`_grad_scaler_refused`)."""
    from torch.amp import GradScaler

    original = GradScaler.scale
    GradScaler.scale = _grad_scaler_refused
    try:
        yield
    finally:
        GradScaler.scale = original


def guard_grad_scaler() -> None:
    """Make ``GradScaler.scale`` raise on a bridged step's loss (a JAX array), in the
    loop after the step (`_without_grad_scaler` covers a call inside the bridged step).

    ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`` copied into the
    loop meets the step's ``metrics["loss"]``, after the step already applied its
    gradients: torch failed on it with "iteration over a 0-d array". Torch tensors go to
    torch's own ``scale``.
    """
    from torch.amp import GradScaler

    original = GradScaler.scale
    if getattr(original, "_torchbridge_guard", False):
        return

    @functools.wraps(original)
    def scale(self: Any, outputs: Any) -> Any:
        if any(isinstance(x, jax.Array) for x in jax.tree.leaves(outputs)):
            raise UnsupportedError(
                "torchbridge: GradScaler.scale on a bridged step's loss (a JAX array): the "
                "step already computed and applied the gradients in one jitted call, so "
                "there is nothing left to scale, backward or unscale. Drop the GradScaler "
                "(and torch.autocast) from the loop and build the engine with "
                "jc.Engine(precision='fp16') (dynamic loss scaling inside the step) or "
                "precision='bf16' (no scaling needed)."
            )
        return original(self, outputs)

    scale._torchbridge_guard = True  # type: ignore[attr-defined]
    GradScaler.scale = scale


# torch.utils.checkpoint.checkpoint's own options (the rest go to the function).
_CHECKPOINT_OPTIONS = (
    "use_reentrant",
    "context_fn",
    "determinism_check",
    "debug",
    "early_stop",
    "preserve_rng_state",
)


def _jax_checkpoint(env: Any, root: Any) -> Callable[..., Any]:
    """``torch.utils.checkpoint.checkpoint`` for a bridged call: ``jax.checkpoint``.

    torch's checkpoint keeps a block's inputs and recomputes its activations in the
    backward pass; run on JAX it would only call the function (torch's autograd does not
    run; JAX differentiates the traced program), keeping every activation. This traces the
    function under ``jax.checkpoint`` with nothing saved (torch's), or the engine's remat
    policy when one is set. The random key torchax splits for dropout goes in and out as
    a value, so the recomputation draws the same masks; so do the buffers the block
    updates (train-mode BatchNorm statistics), once per step as without checkpointing
    (torch's recomputation in the backward pass updates them a second time).
    """
    import torch
    from torch.utils import _pytree

    from jaxcore import remat, trace_context

    def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        for option in _CHECKPOINT_OPTIONS:
            kwargs.pop(option, None)
        leaves, spec = _pytree.tree_flatten((args, kwargs))
        where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        prop = env.param
        keyed = isinstance(prop.prng, jax.Array)
        out_spec: list[Any] = []
        buffers = dict(root.named_buffers())
        before = {n: b._elem for n, b in buffers.items() if hasattr(b, "_elem")}

        def pure(key: Any, *arrays: Any) -> Any:
            if keyed:
                prop.prng = key
            now = list(leaves)
            for i, a in zip(where, env.j2t_iso(arrays), strict=True):
                now[i] = a
            a, kw = _pytree.tree_unflatten(now, spec)
            out, out_def = _pytree.tree_flatten(function(*a, **kw))
            tensors = [isinstance(x, torch.Tensor) for x in out]
            out_spec[:] = [
                out_def,
                tensors,
                [None if t else x for x, t in zip(out, tensors, strict=True)],
            ]
            arrays_out = [env.t2j_iso(x) for x, t in zip(out, tensors, strict=True) if t]
            changed = [n for n, e in before.items() if buffers[n]._elem is not e]
            out_spec.append(changed)
            return (prop.prng if keyed else key), arrays_out, [buffers[n]._elem for n in changed]

        name = trace_context.current().remat
        policy = jax.checkpoint_policies.nothing_saveable
        if name != "none":
            policy = remat._policy(name)
        count = remat._WRAPPED.get()  # a block wrapped: the engine's remat took effect
        if count is not None:
            count[0] += 1
        key = prop.prng if keyed else jnp.zeros((), jnp.uint32)
        arrays = [env.t2j_iso(leaves[i]) for i in where]
        new_key, outs, updated = jax.checkpoint(pure, policy=policy, prevent_cse=True)(key, *arrays)
        if keyed:
            prop.prng = new_key
        out_def, tensors, rest, changed = out_spec
        for n, value in zip(changed, updated, strict=True):
            buffers[n]._elem = value
        it = iter(env.j2t_iso(outs))
        return _pytree.tree_unflatten(
            [next(it) if t else r for t, r in zip(tensors, rest, strict=True)], out_def
        )

    return checkpoint


@contextlib.contextmanager
def _checkpointing(root: Any, env: Any) -> Iterator[None]:
    """Make torch's activation checkpointing remat on JAX while a bridged call runs.

    Covers ``torch.utils.checkpoint.checkpoint(...)`` looked up at call time and the
    function Hugging Face models hold per layer after ``gradient_checkpointing_enable()``
    (``_gradient_checkpointing_func``, as transformers' ``GradientCheckpointingLayer``
    calls it).
    """
    import torch.utils.checkpoint

    fn = _jax_checkpoint(env, root)
    saved = [
        (m, m.__dict__.get("_gradient_checkpointing_func"))
        for m in root.modules()
        if getattr(m, "gradient_checkpointing", False) is True
        and hasattr(m, "_gradient_checkpointing_func")
    ]
    original = torch.utils.checkpoint.checkpoint
    torch.utils.checkpoint.checkpoint = fn
    for m, _ in saved:
        m._gradient_checkpointing_func = fn
    try:
        yield
    finally:
        torch.utils.checkpoint.checkpoint = original
        for m, old in saved:
            if old is None:
                m.__dict__.pop("_gradient_checkpointing_func", None)
            else:
                m._gradient_checkpointing_func = old


@contextlib.contextmanager
def _module_stack(root: Any) -> Iterator[list[str]]:
    """Track which submodule is running (for error messages), with global forward hooks."""
    from torch.nn.modules import module as torch_module

    names = {id(m): n for n, m in root.named_modules()}
    stack: list[str] = []

    def pre(mod, _inputs):
        if id(mod) in names:
            _refuse_autocast(names[id(mod)] or type(mod).__name__)
            stack.append(names[id(mod)])
        else:
            _refuse_foreign(mod, type(root).__name__)

    def post(mod, _inputs, _outputs):
        if id(mod) in names and stack:
            stack.pop()

    handles = (
        torch_module.register_module_forward_pre_hook(pre),
        torch_module.register_module_forward_hook(post),
    )
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _mode(root: Any, train: bool, force: bool = False) -> Iterator[None]:
    flags = [(m, m.training) for m in root.modules()]
    if not train:
        root.eval()
    elif force:  # train=True given to from_torch: every submodule in train mode
        root.train()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextlib.contextmanager
def _keyed(env: Any, rng: jax.Array | None) -> Iterator[None]:
    """Make torchax's random ops split ``rng`` (a per-step key), not its global key."""
    from torchax import tensor

    old = env._property.content
    key = rng if rng is not None else _NO_KEY
    env._property.content = tensor.RuntimeProperty(
        mesh=old.mesh, prng=key, autocast_dtype=old.autocast_dtype
    )
    try:
        yield
    finally:
        env._property.content = old


class _NoKey:
    """In eval mode (``rng=None``) no random op should run; if one does, say why."""

    def __getattr__(self, name):
        raise UnsupportedError(
            "torchbridge: a random torch op ran while the model was called without a key. "
            "Pass the loss function's key: `model(inputs, rng=rng)`."
        )


_NO_KEY = _NoKey()


_OP_HINTS = {
    "_local_scalar_dense": " (a tensor read as a Python number: `.item()`, `float(t)` or `if t:`)",
    "__getitem__": " (indexing with a boolean mask or data-dependent indices)",
    "nonzero": " (its output size depends on the data)",
    "embedding_renorm_": (
        " (nn.Embedding(max_norm=...) renormalising the looked-up rows of its weight in"
        " place; build the Embedding without max_norm)"
    ),
}


def _untraceable(stack: list[str], root: Any, op: str | None, err: Exception) -> UntraceableError:
    where = stack[-1] if stack else ""
    sub = root.get_submodule(where) if where else root
    label = f"'{where}'" if where else "(the root module)"
    op = op or "a tensor-to-Python conversion"
    hint = next((h for key, h in _OP_HINTS.items() if key in op), "")
    return UntraceableError(
        f"torchbridge: module {label} ({type(sub).__name__}) calls {op}{hint}, whose result "
        "depends on tensor values (a data-dependent shape, `.item()`, or a Python `if` "
        "on a tensor). XLA compiles one static program per shape, so this cannot be "
        "traced. Rewrite it with static shapes: `torch.where(mask, x, 0)` instead of "
        "`x[mask]` or `nonzero()`, and tensor ops instead of `.item()`/`if tensor:`. "
        f"(JAX said: {type(err).__name__})",
        module=where,
        op=op,
    )


class BoundModule:
    """A torch module bound to JAX parameters: what the engine's loss function receives.

    ``bound(*inputs, rng=key, **kw)`` runs ``forward`` and returns JAX arrays;
    ``bound.call(fn, *inputs, rng=key)`` runs ``fn(module, *inputs)`` (e.g. forward plus a
    torch loss) the same way. The updated buffers are read by the engine afterwards.
    """

    def __init__(self, bridge: TorchModel, params: Any, model_state: Any):
        self._bridge = bridge
        self._params = params
        self._state = model_state
        self._used: set[str] | None = None  # parameter names read by the calls so far

    @property
    def module(self) -> Any:
        """The torch module (its own tensors are not used while bound)."""
        return self._bridge.module

    @property
    def model_state(self) -> Any:
        """Buffers after the latest call (the ones bound if it was never called)."""
        return self._state

    def __call__(self, *args: Any, rng: jax.Array | None = None, **kwargs: Any) -> Any:
        return self.call(None, *args, rng=rng, **kwargs)

    def call(
        self, fn: Callable | None, *args: Any, rng: jax.Array | None = None, **kwargs: Any
    ) -> Any:
        """Run ``fn(module, *args, **kwargs)`` (``forward`` when ``fn`` is None) on JAX."""
        import torch
        from torch.nn.utils import stateless

        bridge = self._bridge
        spec, env, root = bridge.spec, bridge.env, bridge.module
        flat_p, flat_s = flatten(self._params), flatten(self._state)
        frozen = bridge.frozen_now()
        # A parameter frozen after prepare gets no gradient, as in torch.
        flat_p = {n: jax.lax.stop_gradient(v) if n in frozen else v for n, v in flat_p.items()}
        tensors = env.j2t_iso({**flat_p, **flat_s})
        for alias, name in spec.aliases.items():
            tensors[alias] = tensors[name]
        args, kwargs = jax.tree.map(
            lambda a: jnp.asarray(a) if isinstance(a, np.ndarray | np.generic) else a,
            (args, kwargs),
        )
        low = self._compute_dtype(flat_p)
        if low is not None:  # the engine's bf16/fp16 policy cast the float32 weights
            args, kwargs = _cast_floats((args, kwargs), jnp.float32, low)
        targs, tkwargs = env.j2t_iso((args, kwargs))
        train = (root.training if bridge.train is None else bridge.train) and rng is not None
        fastpath = torch.backends.mha.get_fastpath_enabled()
        _failure.op = None
        if self._used is None:
            self._used = set()
        trained = {id(tensors[n]): n for n in spec.params if n not in frozen}
        usage = _usage.start(trained, self._used)
        with (
            bridge.lock,
            _quietly(),
            _mode(root, train, force=bridge.train is True),
            _keyed(env, rng),
            _without_grad_scaler(),
            _checkpointing(root, env),
            _module_stack(root) as stack,
        ):
            torch.backends.mha.set_fastpath_enabled(False)
            try:
                with env, stateless._reparametrize_module(root, tensors):
                    out = root(*targs, **tkwargs) if fn is None else fn(root, *targs, **tkwargs)
                    out = env.t2j_iso(out)
            except _DATA_DEPENDENT as e:
                raise _untraceable(stack, root, _failure.op, e) from e
            except Exception as e:
                if stack:
                    e.add_note(f"torchbridge: raised inside module '{stack[-1]}'")
                raise
            finally:
                torch.backends.mha.set_fastpath_enabled(fastpath)
                _usage.stop(usage)
        if low is not None:  # the loss is computed in float32, as torch's autocast does
            out = _cast_floats(out, low, jnp.float32)
        # Keep each buffer's shape and dtype (torchax may return `x.add_(1)` on a 0-d
        # buffer as shape (1,)); the engine's step needs a fixed model_state structure.
        self._state = nest(
            {
                n: jnp.reshape(tensors[n].jax(), flat_s[n].shape).astype(flat_s[n].dtype)
                for n in spec.state
            }
        )
        return out

    def _compute_dtype(self, flat_p: dict[str, Any]) -> Any:
        """The 16-bit dtype a precision policy cast this module's float32 weights to, or
        None (fp32, or weights that were 16-bit in torch already)."""
        import torch

        own = dict(self._bridge.module.named_parameters())
        for name, value in flat_p.items():
            low = value.dtype in (jnp.bfloat16, jnp.float16)
            if low and name in own and own[name].dtype == torch.float32:
                return value.dtype
        return None


def _cast_floats(tree: Any, src: Any, dst: Any) -> Any:
    """``tree`` with its ``src``-dtype JAX arrays as ``dst``: a bf16 policy's inputs in,
    outputs out. Inputs are cast as torch needs them (``model.to(bf16)`` takes bf16
    inputs; a float32 one would promote every matmul back to float32, silently)."""
    return jax.tree.map(
        lambda a: a.astype(dst) if isinstance(a, jax.Array) and a.dtype == src else a, tree
    )


# ----------------------------------------------------------------------------- the adapter
class TorchModel:
    """A torch module prepared for the engine: its spec, torchax environment and arrays."""

    def __init__(self, module: Any, train: bool | None = None):
        import torch

        if not isinstance(module, torch.nn.Module):
            raise jc.ConfigError(
                f"from_torch(module): got {type(module).__name__}; pass a torch.nn.Module."
            )
        if train is None and not module.training:
            warnings.warn(EVAL_MODE_WARNING.format(name=type(module).__name__), stacklevel=4)
        self.module = module
        self.train = train
        self.env = environment()
        self.spec = ModuleSpec.of(module)
        self.lock = threading.RLock()
        # torch's `.grad` bookkeeping, for `state_of`'s skip set (see `TorchTrainStep`):
        # the parameters the traced loss does not read, those holding a `.grad` after the
        # last step, and those whose `.grad` the coming step starts with.
        self.unused: frozenset[str] | None = None
        self.had_grad: frozenset[str] = frozenset()
        self.carry: frozenset[str] = frozenset()
        _watch_staleness(module)
        tensors = dict(module.named_parameters())
        tensors.update(module.named_buffers())
        self._check_supported(module)
        _refuse_meta(tensors)
        self.initial = (
            nest({n: to_numpy(tensors[n]) for n in self.spec.params}),
            nest({n: to_numpy(tensors[n]) for n in self.spec.state}),
        )

    @staticmethod
    def _check_supported(module: Any) -> None:
        import torch

        for name, m in module.named_modules():
            if (
                isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                and m.training
                and m.track_running_stats
                and m.momentum is None
            ):
                raise UnsupportedError(
                    f"torchbridge: BatchNorm '{name}' has momentum=None (a cumulative average "
                    "that reads num_batches_tracked on the host each step). Give it a float "
                    "momentum, e.g. 0.1."
                )

    def frozen_now(self) -> frozenset[str]:
        """Trainable parameters (at prepare) that ``requires_grad_(False)`` froze since.

        A parameter frozen at prepare time lives in model_state and cannot start training
        later, so unfreezing one raises.
        """
        params = dict(self.module.named_parameters())
        thawed = [n for n in self.spec.state if n in params and params[n].requires_grad]
        if thawed:
            raise UnsupportedError(
                f"torchbridge: parameters {thawed[:5]} had requires_grad=False when the "
                "module was prepared (so they are held as constants) and were unfrozen "
                "since. Unfreeze them before torchbridge.prepare (with a freshly built "
                "optimizer) to train them."
            )
        return frozenset(n for n in self.spec.params if not params[n].requires_grad)

    def state_of(self, bound: BoundModule) -> Any:
        """The buffers after the loss function ran; records the parameters without gradient.

        torch's optimizer skips a parameter whose ``.grad`` is None: the loss never read
        it, or it is frozen, unless it kept a zeroed ``.grad`` from an earlier step
        (``zero_grad(set_to_none=False)``: ``carry``). `torchbridge.to_optax`'s update
        skips the ones recorded here.
        """
        if bound._used is not None:
            self.unused = frozenset(n for n in self.spec.params if n not in bound._used)
            NO_GRAD[self.module] = self.skipped()
        return bound.model_state

    def skipped(self) -> frozenset[str] | None:
        """The parameters the traced step skips (``None`` before the first trace)."""
        return None if self.unused is None else self.unused - self.carry

    def stepped(self) -> None:
        """After a train step: which parameters hold a ``.grad``; the module is behind."""
        self.had_grad = self.carry | (frozenset(self.spec.params) - (self.unused or frozenset()))
        _BEHIND.add(self.module)

    def adapter(self) -> jc.ModelAdapter:
        """The `jaxcore.ModelAdapter` the engine's ``prepare`` accepts."""
        shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), self.initial)
        initial = self.initial

        def init(key: jax.Array) -> tuple[Any, Any]:
            del key  # the torch module was initialised by torch
            return initial

        return jc.ModelAdapter(
            init=init,
            bind=lambda params, state: BoundModule(self, params, state),
            state_of=self.state_of,
            abstract=shapes,
            logical_axes=None,
            initial=initial,
        )


def _refuse_meta(tensors: dict[str, Any]) -> None:
    """A tensor on the ``meta`` device has no values to train from: name it and the fix
    (torch's own ``.numpy()`` would fail deep inside with "Cannot copy out of meta tensor")."""
    meta = [n for n, t in tensors.items() if t.is_meta]
    if meta:
        raise jc.ConfigError(
            f"torchbridge: {meta[:3]}{' ...' if len(meta) > 3 else ''} on the meta device "
            "have no values to train from; materialise the module first, e.g. "
            "model.to_empty(device='cpu') then model.load_state_dict(...) or its own "
            "initialisation (reset_parameters)."
        )


_REGISTRY: dict[Any, ModuleSpec] = {}


def from_torch(module: Any, *, train: bool | None = None) -> jc.ModelAdapter:
    """Turn a ``torch.nn.Module`` into a `jaxcore.ModelAdapter` (see the module docstring).

    The module's parameter values become the initial parameters (torch initialised
    them); the engine places them in their shards. ``train``: ``None`` follows the
    module's own mode (and warns when it is in eval mode, as after ``from_pretrained``);
    ``True`` runs training steps in train mode (dropout on, BatchNorm updating) whatever
    the module's flags; ``False`` keeps eval mode on purpose, silently.
    """
    return bridge(module, train=train).adapter()


def bridge(module: Any, *, train: bool | None = None) -> TorchModel:
    """The `TorchModel` behind `from_torch` (registered for `spec_for`)."""
    model = TorchModel(module, train=train)
    _REGISTRY[jax.tree.structure(model.initial[0])] = model.spec
    return model


def spec_for(params: Any) -> ModuleSpec | None:
    """The spec of the bridged module whose parameter tree has this structure, if any."""
    return _REGISTRY.get(jax.tree.structure(params))
