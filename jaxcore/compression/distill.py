"""Knowledge distillation: train a student on a teacher's logits through the engine.

The engine plans one model, a `DistillPair` holding the student and the teacher, so both
are sharded by the same rules table (ZeRO-3 shards the teacher too). The plan's
``trainable=student_only`` freezes the teacher: no optimizer state (the engine gives frozen
parameters ``optax.set_to_zero``), no gradient, bit-identical weights; `distill_loss` also
runs the teacher's forward under ``stop_gradient``, so XLA drops its backward pass.

    plan = engine.plan(cz.distill_pair(student, teacher), optax.adamw(3e-4),
                       trainable=cz.student_only)
    state = cz.load_teacher(plan, plan.init(0), teacher_params)
    step = plan.train_step(cz.distill_loss(temperature=2.0, alpha=0.5))

The loss (Hinton et al. 2015): ``alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) +
(1 - alpha) * CE(s, labels)``; the ``T^2`` keeps the soft term's gradients at the scale of
the hard term's when the temperature changes. Averaged over real (unmasked) tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxcore.errors import BatchError, ConfigError

# The reference Transformer's per-layer (stacked) parameters (bq/bk/bv with qkv_bias).
_STACKED = (
    "attn_norm",
    "wq",
    "wk",
    "wv",
    "wo",
    "mlp_norm",
    "w_gate",
    "w_up",
    "w_down",
    "bq",
    "bk",
    "bv",
)


@dataclasses.dataclass(frozen=True)
class TokenLimits:
    """What a batch may hold for both models of a pair (``None``: neither model says)."""

    vocab_size: int | None
    max_seq_len: int | None


def _limit(models: Sequence[nnx.Module], name: str) -> int | None:
    values = []
    for model in models:
        cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            values.append(value)
    return min(values) if values else None


class DistillPair(nnx.Module):
    """A student and a teacher in one module (params ``{"student": ..., "teacher": ...}``)."""

    def __init__(self, student: nnx.Module, teacher: nnx.Module):
        self.student = student
        self.teacher = teacher

    @property
    def cfg(self) -> TokenLimits:
        """The token limits of both models, which the engine checks batches against as it
        does a single model's: the shorter ``max_seq_len`` (a teacher's context is not
        stretched past what it was built for) and the smaller ``vocab_size``."""
        models = (self.student, self.teacher)
        return TokenLimits(_limit(models, "vocab_size"), _limit(models, "max_seq_len"))


def distill_pair(
    student: Callable[[nnx.Rngs], nnx.Module], teacher: Callable[[nnx.Rngs], nnx.Module]
) -> Callable[[nnx.Rngs], DistillPair]:
    """A model factory for ``engine.prepare`` (load trained teacher weights with
    `load_teacher` afterwards)."""
    return lambda rngs: DistillPair(student(rngs), teacher(rngs))


def student_only(path: str) -> bool:
    """The ``trainable`` predicate of a `DistillPair` plan: the student trains, the teacher
    is frozen (no gradient, no optimizer state, bit-identical weights)."""
    return path.split("/", 1)[0] == "student"


def load_teacher(plan: Any, state: Any, teacher_params: Any) -> Any:
    """``state`` with the teacher's parameters replaced by ``teacher_params``, placed on the
    plan's shardings for them (e.g. from ``jc.read_params`` or another run's state).
    ``plan`` is the pair's `jaxcore.TrainPlan` (or the engine that made it last)."""
    shardings = plan.state_shardings.params["teacher"]
    want = jax.tree.structure(state.params["teacher"])
    if jax.tree.structure(teacher_params) != want:
        raise ConfigError(
            "load_teacher: teacher_params do not match the teacher model's parameters; "
            f"expected the tree {want}."
        )
    old_leaves = jax.tree.leaves(state.params["teacher"])
    for new, old in zip(jax.tree.leaves(teacher_params), old_leaves, strict=True):
        if new.shape != old.shape:
            raise ConfigError(
                f"load_teacher: a teacher parameter has shape {new.shape}, the teacher model "
                f"has {old.shape}: build the pair's teacher with the config it was trained with."
            )
    placed = jax.tree.map(
        lambda x, s, old: jax.device_put(jnp.asarray(x, old.dtype), s),
        teacher_params,
        shardings,
        state.params["teacher"],
    )
    return state.replace(params={**state.params, "teacher": placed})


def kd_loss(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    *,
    temperature: float,
    alpha: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``alpha T^2 KL(teacher_T || student_T) + (1 - alpha) CE``, mean over ``mask``."""
    s = student_logits.astype(jnp.float32)
    t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32))
    log_p_t = jax.nn.log_softmax(t / temperature, axis=-1)
    log_p_s = jax.nn.log_softmax(s / temperature, axis=-1)
    p_t = jnp.exp(log_p_t)
    # 0 log 0 = 0: a token the teacher rules out (logit -inf) adds nothing, not NaN.
    kl = jnp.sum(jnp.where(p_t > 0, p_t * (log_p_t - log_p_s), 0.0), axis=-1)
    ce = optax.softmax_cross_entropy_with_integer_labels(s, targets)
    weight = jnp.sum(mask)
    denom = jnp.maximum(weight, 1.0)
    kl_mean = jnp.sum(kl * mask) / denom
    ce_mean = jnp.sum(ce * mask) / denom
    loss = alpha * temperature**2 * kl_mean + (1.0 - alpha) * ce_mean
    return loss, {"weight": weight, "kl": kl_mean, "ce": ce_mean}


def _check_vocab(student_logits: jax.Array, teacher_logits: jax.Array) -> None:
    """The KL term compares distributions over one vocabulary: refuse different sizes."""
    s, t = student_logits.shape[-1], teacher_logits.shape[-1]
    if s != t:
        raise ConfigError(
            f"distill_loss: the student predicts {s} tokens and the teacher {t}; distillation "
            "needs one vocabulary (and tokenizer): build the student with the teacher's "
            f"vocab_size={t}."
        )


def distill_loss(
    *, temperature: float = 2.0, alpha: float = 0.5
) -> Callable[[Any, Any, jax.Array | None], tuple[jax.Array, dict[str, Any]]]:
    """An ``engine.train_step`` loss for a `DistillPair` on ``{"tokens", "mask"?}`` batches
    (packed ones with ``"segments"`` and ``"positions"`` too, read as `lm_loss` reads them).

    Reports ``ce`` (the student's hard-label cross-entropy, comparable with `lm_loss`)
    and ``kl`` next to the combined loss.
    """
    if not temperature > 0:
        raise ConfigError(f"distill_loss(temperature={temperature!r}): must be positive.")
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"distill_loss(alpha={alpha!r}): must be in [0, 1].")

    def loss_fn(pair: DistillPair, batch: dict[str, jax.Array], rng: jax.Array | None):
        del rng
        if "tokens" not in batch:
            raise BatchError(
                f"distill_loss: the batch has keys {sorted(batch)} but needs 'tokens' "
                "(int array of shape (batch, length + 1)) and optionally 'mask'."
            )
        tokens = batch["tokens"]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        mask = batch.get("mask")
        mask = (
            jnp.ones(targets.shape, jnp.float32)
            if mask is None
            else mask[:, 1:].astype(jnp.float32)
        )
        # A packed batch as `lm_loss` reads it: both models attend within each example
        # at its own positions, and no example predicts the next one's first token.
        segments, positions = batch.get("segments"), batch.get("positions")
        extra: tuple[jax.Array, ...] = ()
        if segments is not None or positions is not None:
            if segments is None or positions is None:
                raise BatchError(
                    "distill_loss: a packed batch needs both 'segments' (an id per example, "
                    "0 for padding) and 'positions' (each example's own, from 0), each "
                    "shaped like 'tokens'; this one has only "
                    f"{'segments' if positions is None else 'positions'}."
                )
            same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
            mask = mask * same.astype(jnp.float32)
            extra = (positions[:, :-1], segments[:, :-1])
        teacher_logits = jax.lax.stop_gradient(pair.teacher(inputs, *extra))
        student_logits = pair.student(inputs, *extra)
        _check_vocab(student_logits, teacher_logits)
        return kd_loss(
            student_logits,
            teacher_logits,
            targets,
            mask,
            temperature=temperature,
            alpha=alpha,
        )

    return loss_fn


def student_from_teacher(teacher_params: dict[str, Any], layers: Sequence[int]) -> dict[str, Any]:
    """Initial student weights: the teacher's embedding, norms and head, and the stacked
    block weights of the teacher layers ``layers`` (DistilBERT, Sanh et al. 2019, takes
    every other layer). The student config is the teacher's with ``n_layers=len(layers)``.
    """
    index = np.asarray(layers, np.int32)
    depth = np.shape(teacher_params["wq"])[0]
    if index.size == 0 or index.min() < 0 or index.max() >= depth:
        raise ConfigError(
            f"student_from_teacher(layers={list(layers)}): pick layers in 0..{depth - 1} "
            "of the teacher (e.g. range(0, depth, 2))."
        )
    return {
        name: (jnp.take(w, index, axis=0) if name in _STACKED else w)
        for name, w in teacher_params.items()
    }
