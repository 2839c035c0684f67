"""The Engine: a mesh and a run config, from which models are planned onto devices.

The engine composes the small modules around it (mesh, sharding rules, precision, remat)
and owns no parallelism logic itself: data, ZeRO 1-3, tensor and pipeline parallelism all
come from the mesh plus the rules table. ``engine.plan(model, optimizer)`` returns an
immutable `jaxcore.TrainPlan`; ``prepare`` is the short path (``plan`` + ``init``):

    engine = Engine(parallel=ParallelConfig(fsdp=-1, tensor=2), zero=3, precision="bf16")
    state = engine.prepare(lambda rngs: Transformer(cfg, rngs=rngs), optax.adamw(3e-4))
    step = engine.train_step(lm_loss)   # the step of engine.last_plan
    state, metrics = step(state, batch)
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
from collections.abc import Sequence
from typing import Any

import jax
import optax
from jax.sharding import NamedSharding

from jaxcore import nonfinite, remat
from jaxcore import sharding as shd
from jaxcore.adapters import ModelAdapter
from jaxcore.batch_checks import BatchChecker
from jaxcore.errors import BatchError, ConfigError, check_keywords
from jaxcore.mesh import ParallelConfig, build_mesh
from jaxcore.pipeline import SCHEDULES, PipelineConfig
from jaxcore.plan import Trainable, TrainPlan, batch_contract, make_plan
from jaxcore.plan import shard_batch as _shard_batch
from jaxcore.precision import LossScaleConfig, get_policy
from jaxcore.state import TrainState
from jaxcore.step import EvalStep, LossFn, TrainStep

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Everything that decides how a model trains on the devices.

    Attributes:
        parallel: mesh axis sizes (see `ParallelConfig`).
        zero: ZeRO stage 0-3: what is sharded over ``fsdp`` (see `jaxcore.sharding`).
        precision: ``fp32``, ``bf16`` (float32 master weights, bfloat16 compute) or ``fp16``
            (with dynamic loss scaling).
        grad_accum: microbatches per step, accumulated inside the one jitted step.
        remat: activation checkpointing policy per block (see `jaxcore.remat`).
        unroll_layers: run a model's stacked layers (`jaxcore.scan_layers`) as an unrolled
            loop rather than a ``lax.scan``. ``None`` (default): unrolled on CPU without a
            remat policy, where the 26M reference decoder's step ran 1.05-1.14x faster that
            way (no per-layer slicing of the stacked weights and saved activations,
            benchmarks/training_speed.md); a scan elsewhere: one compiled block whatever
            the depth (MaxText's ``scan_layers`` default). Compile time grows with the
            depth when unrolled (8 layers: 14.1 vs 13.8 s at 26M; 32 layers of a d=64
            model: 10.0 vs 3.8 s): set ``False`` for deep models on CPU. A remat
            policy keeps the scan, because XLA schedules an unrolled block's recomputation
            early and so saves no memory (24 layers, ``remat="full"``: 3.96 MB of
            temporaries unrolled against 1.05 MB in a scan).
        clip_grad_norm: clip gradients to this global norm (``None``: no clipping).
        rules: the logical-axis rules table (first match wins).
        param_rules: ``(regex on parameter path, logical names)`` pairs that name or rename
            parameters, e.g. ``(r".*q_proj/weight", ("heads", "embed"))``.
        loss_scale: dynamic loss-scale settings (fp16 only).
        seed: seed of the parameter init and of the step keys.
        microbatches: pipeline microbatches per step (``pipeline > 1`` only; default: the
            number of stages). With ``grad_accum = k`` the schedule runs ``k`` times as
            many microbatches instead of nesting a second loop.
        pipeline_schedule: ``gpipe`` or ``circular`` (interleaved layer chunks per stage).
        pipeline_repeats: layer chunks per stage for ``circular`` (default 2).
        nonfinite: what a step whose loss or gradient norm is not finite does: ``skip``
            (keep the old state, count ``metrics["skipped"]``), ``raise``, or ``ignore``
            (see `jaxcore.nonfinite`).
        max_consecutive_skips: under ``skip``, this many skipped steps in a row are
            tolerated; one more raises `jaxcore.TrainingDivergedError`.
        check_batches: check token arrays (integer dtype, 2-d, length within the model's
            ``max_seq_len``, ids in ``[0, vocab_size)``) before they reach the step.
        token_keys: the batch keys that hold token ids.
    """

    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    zero: int = 3
    precision: str = "fp32"
    grad_accum: int = 1
    remat: str = "none"
    unroll_layers: bool | None = None
    clip_grad_norm: float | None = None
    rules: shd.Rules = shd.DEFAULT_RULES
    param_rules: tuple[tuple[str, tuple], ...] = ()
    loss_scale: LossScaleConfig = dataclasses.field(default_factory=LossScaleConfig)
    seed: int = 0
    microbatches: int | None = None
    pipeline_schedule: str = "gpipe"
    pipeline_repeats: int | None = None
    nonfinite: str = "skip"
    max_consecutive_skips: int = 10
    check_batches: bool = True
    token_keys: tuple[str, ...] = ("tokens", "input_ids", "labels")

    def __new__(cls, *args: Any, **kwargs: Any) -> EngineConfig:
        # A mistyped keyword is a ConfigError naming the setting meant, not a TypeError.
        _check_fields(kwargs, "EngineConfig")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if not isinstance(self.parallel, ParallelConfig):
            raise ConfigError(
                f"parallel={self.parallel!r}: pass a jaxcore.ParallelConfig, "
                "e.g. ParallelConfig(fsdp=-1, tensor=2)."
            )
        _check_types(self)
        if self.zero not in shd.ZERO_STAGES:
            raise ConfigError(f"zero={self.zero!r}: the ZeRO stage must be one of 0, 1, 2, 3.")
        get_policy(self.precision)
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ConfigError(f"grad_accum={self.grad_accum!r}: must be an integer >= 1.")
        if self.remat not in remat.POLICY_NAMES:
            remat.validate_policy(self.remat)
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(
                f"clip_grad_norm={self.clip_grad_norm!r}: must be positive, or None to disable."
            )
        if self.pipeline_schedule not in SCHEDULES:
            raise ConfigError(
                f"pipeline_schedule={self.pipeline_schedule!r}: use one of {SCHEDULES}."
            )
        repeats = self.pipeline_repeats
        if self.pipeline_schedule == "gpipe" and repeats not in (None, 1):
            raise ConfigError(
                f"pipeline_repeats={repeats} needs pipeline_schedule='circular' (GPipe runs "
                "each stage's layers once)."
            )
        if self.pipeline_schedule == "circular" and repeats is not None and repeats < 2:
            raise ConfigError(
                f"pipeline_repeats={repeats}: the circular schedule needs at least 2 repeats."
            )
        if self.microbatches is not None and self.microbatches < 1:
            raise ConfigError(f"microbatches={self.microbatches}: must be >= 1.")
        nonfinite.validate(self.nonfinite, self.max_consecutive_skips)

    def pipeline_config(self, stages: int) -> PipelineConfig | None:
        """The schedule for ``stages`` pipeline stages (``None`` without a pipeline)."""
        if stages == 1:
            if self.microbatches not in (None, 1) or self.pipeline_schedule != "gpipe":
                log.warning("microbatches / pipeline_schedule are ignored: pipeline=1.")
            return None
        repeats = self.pipeline_repeats or (2 if self.pipeline_schedule == "circular" else 1)
        micro = (self.microbatches or stages) * self.grad_accum
        return PipelineConfig(
            stages=stages, microbatches=micro, repeats=repeats, reduce_grads_once=self.zero < 3
        )


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_types(c: EngineConfig) -> None:
    """Raise `ConfigError` for a field of the wrong type (a string from a config file, a
    float count), before it surfaces as a bare TypeError or, for ``token_keys="tokens"``,
    silently turns the token checks off."""
    keys = c.token_keys
    if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(
            f"token_keys={keys!r}: pass a tuple of batch keys, e.g. token_keys=('tokens',)."
        )
    for name in ("microbatches", "pipeline_repeats"):
        value = getattr(c, name)
        if value is not None and not _is_int(value):
            raise ConfigError(f"{name}={value!r}: must be an integer >= 1 (or None).")
    if not _is_int(c.seed):
        raise ConfigError(f"seed={c.seed!r}: must be an integer.")
    clip = c.clip_grad_norm
    if clip is not None and (not isinstance(clip, numbers.Real) or isinstance(clip, bool)):
        raise ConfigError(
            f"clip_grad_norm={clip!r}: must be a positive number, or None to disable."
        )
    if not isinstance(c.unroll_layers, bool | None):
        raise ConfigError(f"unroll_layers={c.unroll_layers!r}: use True, False or None.")
    if not isinstance(c.check_batches, bool):
        raise ConfigError(f"check_batches={c.check_batches!r}: use True or False.")


def _check_fields(fields: dict[str, Any], what: str = "Engine") -> None:
    """Raise `ConfigError` for a keyword that is no `EngineConfig` field, naming the one
    meant (a close spelling, or a mesh axis that belongs in `ParallelConfig`)."""
    hints = {
        axis: (
            f"mesh axes go in parallel=jc.ParallelConfig({axis}={fields[axis]!r}), "
            "e.g. jc.Engine(parallel=jc.ParallelConfig(fsdp=-1, tensor=2))."
        )
        for axis in ("data", "fsdp", "tensor", "pipeline")
        if axis in fields
    }
    check_keywords(what, [f.name for f in dataclasses.fields(EngineConfig)], fields, hints)


def _not_an_engine_config(config: object) -> str:
    """What to write instead of ``Engine(x)`` when ``x`` is not an `EngineConfig`."""
    if isinstance(config, ParallelConfig):
        return (
            f"Engine({config!r}): the first argument is an EngineConfig; a ParallelConfig "
            "goes in parallel=, e.g. jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))."
        )
    return (
        f"Engine(config={config!r}): expected a jaxcore.EngineConfig (or keywords, e.g. "
        f"jc.Engine(zero=3)), got {type(config).__name__}."
    )


class Engine:
    """A mesh plus a run config: plans models onto the devices.

    The engine holds no per-model state of its own except ``last_plan``, the plan made by
    the latest `plan` or `prepare` call. The short-path helpers (``train_step``,
    ``eval_step``, ``bind``, ``state_shardings``, ``model``) read that plan when they are
    called; a step already built keeps the plan it was built from, so making another plan
    never changes what an existing step runs. With several models, hold their plans.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        devices: Sequence[jax.Device] | None = None,
        **fields: Any,
    ):
        _check_fields(fields)
        if config is not None and not isinstance(config, EngineConfig):
            raise ConfigError(_not_an_engine_config(config))
        if config is None:
            config = EngineConfig(**fields)
        elif fields:
            config = dataclasses.replace(config, **fields)
        self.config = config
        self.mesh = build_mesh(config.parallel, devices)
        self.policy = get_policy(config.precision)
        remat.validate_policy(config.remat, self.mesh.devices.flat[0])
        self.rules = shd.validate_rules(config.rules, self.mesh.axis_names)
        shd.validate_param_rules(config.param_rules, self.rules)
        self.pipeline = config.pipeline_config(self.mesh.shape["pipeline"])
        # The batch's layout is the rules table's `batch` rule: no model needed.
        self.batch_sharding = NamedSharding(self.mesh, shd.batch_spec(self.mesh, self.rules))
        self.last_plan: TrainPlan | None = None
        self._checker = BatchChecker(batch_contract(config, self.mesh, self.rules, self.pipeline))

    # ----------------------------------------------------------------- planning
    def plan(
        self,
        model: Any,
        optimizer: optax.GradientTransformation,
        *,
        trainable: Trainable | None = None,
    ) -> TrainPlan:
        """Plan ``model`` and ``optimizer`` on this engine's mesh; nothing is allocated.

        ``model`` is preferably a factory ``rngs -> nnx.Module`` (then `TrainPlan.init`
        creates parameters straight into their shards); a built ``nnx.Module`` or a
        `ModelAdapter` work too. ``optimizer`` is any optax transformation, parameter
        groups (``optax.multi_transform``, ``optax.masked``) included. ``trainable``
        (``path -> bool``) freezes the parameters it rejects: they get no gradient, no
        optimizer state and stay bit-identical. The plan becomes ``last_plan``.
        """
        plan = make_plan(
            config=self.config,
            mesh=self.mesh,
            rules=self.rules,
            policy=self.policy,
            pipeline=self.pipeline,
            model=model,
            optimizer=optimizer,
            trainable=trainable,
        )
        self.last_plan = plan
        return plan

    def prepare(
        self,
        model: Any,
        optimizer: optax.GradientTransformation,
        *,
        seed: int | None = None,
        trainable: Trainable | None = None,
    ) -> TrainState:
        """``plan(model, optimizer).init(seed)``: the initial, sharded `TrainState`."""
        return self.plan(model, optimizer, trainable=trainable).init(seed)

    def _current(self, what: str) -> TrainPlan:
        if self.last_plan is None:
            raise ConfigError(
                f"Engine.{what}: call engine.prepare(model, optimizer) (or engine.plan) first."
            )
        return self.last_plan

    @property
    def model(self) -> ModelAdapter | None:
        """The adapter of ``last_plan`` (``None`` before any plan)."""
        return None if self.last_plan is None else self.last_plan.adapter

    @property
    def optimizer(self) -> optax.GradientTransformation | None:
        """The optimizer of ``last_plan`` (``None`` before any plan)."""
        return None if self.last_plan is None else self.last_plan.optimizer

    @property
    def state_shardings(self) -> TrainState | None:
        """The state layout of ``last_plan`` (``None`` before any plan)."""
        return None if self.last_plan is None else self.last_plan.state_shardings

    # ----------------------------------------------------------------- short path
    def train_step(self, loss_fn: LossFn) -> TrainStep:
        """``last_plan.train_step(loss_fn)`` (see `TrainPlan.train_step`)."""
        return self._current("train_step").train_step(loss_fn)

    def eval_step(self, loss_fn: LossFn) -> EvalStep:
        """``last_plan.eval_step(loss_fn)`` (see `TrainPlan.eval_step`)."""
        return self._current("eval_step").eval_step(loss_fn)

    def bind(self, state: TrainState, *, evaluation: bool = False) -> Any:
        """``last_plan.bind(state)``: the model with ``state``'s parameters (compute dtype);
        ``evaluation=True`` gives it in eval mode (see `TrainPlan.bind`)."""
        return self._current("bind").bind(state, evaluation=evaluation)

    def _batch_checker(self) -> BatchChecker:
        return self._checker if self.last_plan is None else self.last_plan.checker

    def shard_batch(self, batch: Any) -> Any:
        """Turn this process's part of a batch (NumPy arrays) into global sharded arrays.

        In one process that is the whole batch; with several, each passes rows
        ``lo:hi`` of the global batch, ``lo, hi = engine.local_rows(global_batch_size)``.
        That is a ``1 / process_count`` slice when the batch is cut over the processes,
        and the whole batch when it is not (a pipeline spanning hosts: every stage sees
        every microbatch). The checks include the model's token limits once a plan exists,
        and, on the first batch, that processes holding the same rows passed the same data.
        Once a plan exists its own ``shard_batch`` runs (a bridged torch plan's takes torch
        tensors too).
        """
        if self.last_plan is not None:
            return self.last_plan.shard_batch(batch)
        return _shard_batch(batch, self.batch_sharding, self._checker)

    @property
    def process_batch_block(self) -> tuple[int, int]:
        """``(index, count)``: which block of every batch's rows this process holds, of how
        many (`jaxcore.sharding.process_batch_block`; processes with the same index pass
        the same rows)."""
        c = self._checker.contract
        return c.process_block, c.process_blocks

    def local_rows(self, global_batch_size: int) -> tuple[int, int]:
        """``(lo, hi)``: the rows of a global batch this process passes to `shard_batch`."""
        ways = self._checker.contract.ways
        if global_batch_size < 1 or global_batch_size % ways:
            raise BatchError(
                f"local_rows({global_batch_size}): a global batch must be a positive "
                f"multiple of the {ways} shards the 'batch' rule cuts it into."
            )
        return shd.local_rows(self.batch_sharding, global_batch_size)

    def check_batch(self, batch: Any, *, local: bool = False) -> None:
        """Raise `BatchError` unless ``batch`` can run (leading sizes, token arrays)."""
        self._batch_checker().check(batch, local=local)
