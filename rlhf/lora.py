"""LoRA adapters on the actor; the reference is the same base weights with adapters off.

Each targeted projection ``W`` (a block weight of `jaxcore.models.Transformer`, stacked
over layers, or the output head ``lm_head``) gets a low-rank pair: ``A`` with the input
dimensions of ``W`` and a rank axis, ``B`` with the rank axis and the output dimensions,
and the layer computes with ``W + (alpha / rank) * A @ B``. ``A`` starts uniform in
``+-1/sqrt(fan_in)`` (peft's ``kaiming_uniform_(a=sqrt(5))`` bound) and ``B`` at zero, so
step 0 is the base model exactly (peft ``LoraLayer.reset_lora_parameters``, Hu et al.
2021).

Only the adapters train: `trainable` freezes every base leaf, so the engine gives them no
gradient and no optimizer state (as Tunix's ``PeftTrainer`` builds its optimizer with
``wrt=nnx.LoRAParam``). With the base frozen, the reference policy needs no copy: the
same arrays scored with adapters off (`disabled`, `reference_scorer`) are the reference,
as TRL's trainers do with ``model.disable_adapter()`` when ``ref_model`` is None.

Merged, not side-by-side: the adapters are folded into ``W`` one layer at a time inside
the layer scan (`LoRATransformer.block`), and the sampler receives merged weights
(`decoding_weights`; TRL likewise ``merge_adapter()``s before loading weights into
vLLM). Merging keeps the decoder and the inference engine's compiled kernels unchanged
(a weight hand-off, no recompile, no extra matmuls per generated token) at the cost of
one transient merged copy of the targeted weights per forward. There is no LoRA dropout:
it acts on the separate ``x @ A`` path, which a merged layer does not have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxcore import ConfigError, Engine, TrainState
from jaxcore.models import Transformer, TransformerConfig
from jaxcore.models import decoding_weights as base_decoding_weights
from rlhf.models import token_logprobs

# The block projections by the decoder's names, and Hugging Face's names for them.
PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
HF_NAMES = {
    "q_proj": "wq",
    "k_proj": "wk",
    "v_proj": "wv",
    "o_proj": "wo",
    "gate_proj": "w_gate",
    "up_proj": "w_up",
    "down_proj": "w_down",
}
HEAD = "lm_head"  # targetable by name; "all-linear" leaves it out, as peft's does
TARGETS = (*PROJECTIONS, HEAD)
ALL_LINEAR = "all-linear"  # peft's shorthand for every block projection
# How many dimensions after ``layers`` a projection contracts (``wo`` takes heads x dim).
_IN_DIMS = {"wo": 2}
ADAPTERS = "lora"  # the parameter subtree holding the adapters


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """LoRA settings (peft ``LoraConfig`` names in brackets).

    Attributes:
        rank: the adapters' inner dimension (``r``).
        alpha: the update is scaled by ``alpha / rank`` (``lora_alpha``).
        targets: projections to adapt, by the decoder's names (``wq``, ``wk``, ``wv``,
            ``wo``, ``w_gate``, ``w_up``, ``w_down``, ``lm_head``), Hugging Face's
            (``q_proj``...) or ``all-linear`` (the block projections) (``target_modules``;
            default ``q_proj, v_proj`` as peft's for Llama).
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("wq", "wv")

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"LoRAConfig.rank={self.rank!r}: must be an integer >= 1 (e.g. 8).")
        if not self.alpha > 0:
            raise ConfigError(f"LoRAConfig.alpha={self.alpha!r}: must be > 0 (e.g. 2 * rank).")
        names = [self.targets] if isinstance(self.targets, str) else list(self.targets)
        resolved: list[str] = []
        for name in names:
            if name == ALL_LINEAR:
                resolved.extend(PROJECTIONS)
                continue
            canonical = HF_NAMES.get(name, name)
            if canonical not in TARGETS:
                raise ConfigError(
                    f"LoRAConfig.targets: unknown projection {name!r}; use {ALL_LINEAR!r} or "
                    f"names from {list(TARGETS)} (or {list(HF_NAMES)})."
                )
            resolved.append(canonical)
        if not resolved:
            raise ConfigError("LoRAConfig.targets is empty: name at least one projection.")
        ordered = tuple(p for p in TARGETS if p in resolved)
        object.__setattr__(self, "targets", ordered)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _split_axes(name: str, logical: tuple) -> tuple[tuple, tuple, tuple]:
    """``(layer axes, input axes, output axes)`` of a projection's logical axes."""
    lead = 0 if name == HEAD else 1
    k = _IN_DIMS.get(name, 1)
    return logical[:lead], logical[lead : lead + k], logical[lead + k :]


class LoRAAdapters(nnx.Module):
    """The ``A`` (``<name>_a``) and ``B`` (``<name>_b``) arrays of each target, stacked
    over layers like the weights they adapt, with the weights' logical axes (the rank
    axis is unnamed: replicated)."""

    def __init__(self, base: Transformer, config: LoRAConfig, *, rngs: nnx.Rngs):
        for name in config.targets:
            w = getattr(base, name)
            lead, in_axes, out_axes = _split_axes(name, w.get_metadata()["logical_axes"])
            shape = w[...].shape
            n, k = len(lead), len(in_axes)
            layers, in_shape, out_shape = shape[:n], shape[n : n + k], shape[n + k :]
            bound = 1.0 / math.sqrt(math.prod(in_shape))
            a = jax.random.uniform(
                rngs.params(), (*layers, *in_shape, config.rank), jnp.float32, -bound, bound
            )
            b = jnp.zeros((*layers, config.rank, *out_shape), jnp.float32)
            setattr(self, f"{name}_a", nnx.Param(a, logical_axes=(*lead, *in_axes, None)))
            setattr(self, f"{name}_b", nnx.Param(b, logical_axes=(*lead, None, *out_axes)))


def low_rank_update(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """``scale * A @ B`` for one layer: ``A (in..., r)`` and ``B (r, out...)`` give
    ``(in..., out...)``, the shape of the weight they adapt."""
    r = a.shape[-1]
    delta = a.reshape(-1, r) @ b.reshape(r, -1)
    return (scale * delta).reshape(a.shape[:-1] + b.shape[1:])


class LoRATransformer(Transformer):
    """The decoder with LoRA adapters on ``config.targets`` (parameters under ``lora/``).

    ``adapters_enabled`` is a trace-time switch (`disabled` flips it): off, the forward
    is exactly the base `Transformer`'s on the same arrays.
    """

    def __init__(self, cfg: TransformerConfig, lora: LoRAConfig, *, rngs: nnx.Rngs):
        if HEAD in lora.targets and cfg.tie_embeddings:
            raise ConfigError(
                "LoRAConfig.targets: lm_head is the embedding when tie_embeddings=True; "
                "drop lm_head from the targets."
            )
        super().__init__(cfg, rngs=rngs)
        self.lora_config = lora
        self.lora = LoRAAdapters(self, lora, rngs=rngs)
        self.adapters_enabled = True

    def block_params(self) -> dict[str, jax.Array]:
        p = super().block_params()
        if self.adapters_enabled:
            for name in self._block_targets():
                p[f"{name}_a"] = getattr(self.lora, f"{name}_a")[...]
                p[f"{name}_b"] = getattr(self.lora, f"{name}_b")[...]
        return p

    def block(
        self,
        x: jax.Array,
        p: dict[str, jax.Array],
        cos: jax.Array,
        sin: jax.Array,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        """Fold this layer's adapters into its weights, then run the base block (with
        ``segments``, packed examples' ids, as `Transformer.block` takes them)."""
        p = dict(p)
        for name in self._block_targets():
            if f"{name}_a" in p:
                a, b = p.pop(f"{name}_a"), p.pop(f"{name}_b")
                p[name] = p[name] + low_rank_update(a, b, self.lora_config.scale).astype(
                    p[name].dtype
                )
        return super().block(x, p, cos, sin, segments)

    def _block_targets(self) -> tuple[str, ...]:
        return tuple(n for n in self.lora_config.targets if n != HEAD)

    def head(self) -> jax.Array:
        """The output projection, with its adapter merged when targeted and enabled."""
        head = self.lm_head[...]
        if self.adapters_enabled and HEAD in self.lora_config.targets:
            a, b = self.lora.lm_head_a[...], self.lora.lm_head_b[...]
            head = head + low_rank_update(a, b, self.lora_config.scale).astype(head.dtype)
        return head

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        if HEAD not in self.lora_config.targets or not self.adapters_enabled:
            return super().__call__(tokens, positions, segments)
        x = self.hidden_states(tokens, positions, segments)
        b, t, d = x.shape
        return (x.reshape(b * t, d) @ self.head()).reshape(b, t, -1).astype(jnp.float32)


def lora_factory(cfg: TransformerConfig, lora: LoRAConfig) -> Callable[[nnx.Rngs], Any]:
    """``rngs -> LoRATransformer`` for ``jaxcore.Engine.prepare`` (with `trainable`)."""
    return lambda rngs: LoRATransformer(cfg, lora, rngs=rngs)


def trainable(path: str) -> bool:
    """The ``trainable`` predicate for ``Engine.prepare``: only adapter leaves train."""
    return path.split("/", 1)[0] == ADAPTERS


def has_adapters(params: Any) -> bool:
    """Whether a parameter tree holds LoRA adapters (a `LoRATransformer`'s)."""
    return isinstance(params, dict) and ADAPTERS in params


def base_params(params: dict[str, Any]) -> dict[str, Any]:
    """The base weights of a LoRA parameter tree (the same arrays, adapters left out)."""
    return {k: v for k, v in params.items() if k != ADAPTERS}


def merged_params(params: dict[str, Any], lora: LoRAConfig) -> dict[str, Any]:
    """A LoRA parameter tree as the plain `Transformer`'s: each targeted weight with its
    adapter folded in (``W + scale * A @ B`` per layer, peft's ``merge_and_unload``) and
    the adapters dropped: what `jaxcore.hf.save`, `jaxcore.save_params` and
    `inference.LLM` take. ``lora`` must be the config the adapters were trained with
    (``alpha`` is not in the arrays). A tree without adapters is returned as it is."""
    if not has_adapters(params):
        return params
    adapters = params[ADAPTERS]
    have = sorted(k[:-2] for k in adapters if k.endswith("_a"))
    if have != sorted(lora.targets):
        raise ConfigError(
            f"merged_params: the adapters are on {have} but LoRAConfig.targets is "
            f"{list(lora.targets)}; pass the LoRAConfig the run was trained with."
        )
    merged = base_params(params)
    for name in lora.targets:
        a, b = adapters[f"{name}_a"], adapters[f"{name}_b"]
        if a.shape[-1] != lora.rank:
            raise ConfigError(
                f"merged_params: the {name} adapter has rank {a.shape[-1]}, LoRAConfig.rank "
                f"is {lora.rank}; pass the LoRAConfig the run was trained with."
            )
        update = functools.partial(low_rank_update, scale=lora.scale)
        delta = update(a, b) if name == HEAD else jax.vmap(update)(a, b)  # over the layers
        merged[name] = merged[name] + delta.astype(merged[name].dtype)
    return merged


@contextlib.contextmanager
def disabled(model: Any) -> Iterator[Any]:
    """Run ``model`` as its base inside the block (peft's ``disable_adapter()``); a
    plain `Transformer` passes through unchanged."""
    if not isinstance(model, LoRATransformer):
        yield model
        return
    model.adapters_enabled = False
    try:
        yield model
    finally:
        model.adapters_enabled = True


def reference_scorer(engine: Engine) -> Callable[[TrainState, np.ndarray], np.ndarray]:
    """``(actor state, tokens) -> log-probs`` of the reference: the actor's own base
    weights with adapters off (no second copy of the base)."""

    def loss_fn(model, batch, rng):
        del rng
        with disabled(model):
            return jnp.zeros(()), {"logp": token_logprobs(model, batch["tokens"])}

    step = engine.eval_step(loss_fn)
    return lambda state, tokens: np.asarray(step(state, {"tokens": tokens})["logp"])


@functools.partial(jax.jit, static_argnames=("targets", "scale"))
def _merge_blocks(blocks: dict, adapters: dict, targets: tuple, scale: float) -> dict:
    merged = dict(blocks)
    update = jax.vmap(lambda a, b: low_rank_update(a, b, scale))  # over the layers axis
    for name in targets:
        delta = update(adapters[f"{name}_a"], adapters[f"{name}_b"])
        merged[name] = blocks[name] + delta.astype(blocks[name].dtype)
    return merged


def decoding_weights(model: Any) -> dict[str, Any]:
    """The weights the sampler decodes with: the base's, with adapters merged in
    (``W + scale * A @ B`` per layer, on the trainer's shardings)."""
    if not isinstance(model, LoRATransformer):
        return base_decoding_weights(model)
    with disabled(model):
        weights = base_decoding_weights(model)
    c, targets = model.lora_config, model._block_targets()
    adapters = {
        f"{n}_{s}": getattr(model.lora, f"{n}_{s}")[...] for n in targets for s in ("a", "b")
    }
    if targets:
        weights["blocks"] = _merge_blocks(weights["blocks"], adapters, targets, c.scale)
    if HEAD in c.targets:
        weights["head"] = model.head()
    return weights
