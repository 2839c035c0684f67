"""`ServingConfig`: how a model is laid out for serving (slots, lengths, dtype, mesh)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

import jaxcore as jc
from jaxcore.sharding import DEFAULT_RULES, Rules

QUANT_MODES = (None, "int8", "int8-smooth")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingConfig:
    """How a model is laid out for serving.

    Attributes:
        slots: sequences decoded together (the continuous-batching width).
        max_len: positions per slot (prompt + completion); defaults to the model's
            ``max_seq_len``.
        prefill_buckets: prompt lengths prompts are padded up to (one compile each);
            defaults to powers of two from 16 up to ``max_len``.
        decode_steps: tokens each slot decodes per device dispatch (a ``lax.scan`` with
            the stop checks on device); more steps, fewer host round trips, but a new
            request waits up to this many steps for a slot.
        dtype: compute dtype of weights and cache (``float32`` or ``bfloat16``).
        quantize: ``None``, ``int8`` (per-channel absmax) or ``int8-smooth`` (SmoothQuant
            scales calibrated on ``calibration`` batches first).
        smooth_alpha: SmoothQuant's migration strength.
        parallel: mesh layout; ``None`` serves on one device.
        rules: the logical-axis rules table (the training one by default): weights and
            the KV cache (``batch``, ``kv_heads``, ``length``, ``head_dim``) follow it.
        seed: seed of the keys of requests that bring none.
    """

    slots: int = 8
    max_len: int | None = None
    prefill_buckets: tuple[int, ...] | None = None
    decode_steps: int = 8
    dtype: str = "float32"
    quantize: str | None = None
    smooth_alpha: float = 0.5
    parallel: jc.ParallelConfig | None = None
    rules: Rules = DEFAULT_RULES
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.slots, int) or self.slots < 1:
            raise jc.ConfigError(f"ServingConfig.slots={self.slots!r}: must be an integer >= 1.")
        if self.max_len is not None and self.max_len < 2:
            raise jc.ConfigError(f"ServingConfig.max_len={self.max_len!r}: must be >= 2.")
        if not isinstance(self.decode_steps, int) or self.decode_steps < 1:
            raise jc.ConfigError(
                f"ServingConfig.decode_steps={self.decode_steps!r}: must be an integer >= 1."
            )
        if self.dtype not in DTYPES:
            raise jc.ConfigError(f"ServingConfig.dtype={self.dtype!r}: use one of {list(DTYPES)}.")
        if self.quantize not in QUANT_MODES:
            raise jc.ConfigError(
                f"ServingConfig.quantize={self.quantize!r}: use one of {list(QUANT_MODES)}."
            )
        if not 0 <= self.smooth_alpha <= 1:
            raise jc.ConfigError(
                f"ServingConfig.smooth_alpha={self.smooth_alpha!r}: must be in [0, 1]."
            )
        if self.prefill_buckets is not None and (
            not self.prefill_buckets or any(b < 1 for b in self.prefill_buckets)
        ):
            raise jc.ConfigError(
                f"ServingConfig.prefill_buckets={self.prefill_buckets!r}: give positive lengths."
            )
