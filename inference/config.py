"""`ServingConfig`: how a model is laid out for serving (slots, lengths, dtype, mesh)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

import jaxcore as jc
from jaxcore.errors import check_keywords
from jaxcore.sharding import DEFAULT_RULES, Rules

QUANT_MODES = (None, "int8", "int8-smooth")
KV_CACHES = ("contiguous", "paged")
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
        kv_cache: ``contiguous`` (``max_len`` positions per slot) or ``paged`` (a pool of
            fixed-size pages; requests are admitted while pages are free).
        page_size: positions per page (paged cache).
        pages: pages in the pool (paged cache); default: enough for every slot to reach
            ``max_len``, plus the null page.
        prefix_caching: share the pages of identical prompt prefixes (paged cache).
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
    kv_cache: str = "contiguous"
    page_size: int = 16
    pages: int | None = None
    prefix_caching: bool = True
    seed: int = 0

    def __new__(cls, *args: object, **kwargs: object) -> ServingConfig:
        # A mistyped setting (or vLLM's name for one) is a ConfigError naming the one
        # meant, not a TypeError, as jc.ParallelConfig and SamplingParams answer.
        tensor, data = kwargs.get("tensor_parallel_size"), kwargs.get("data_parallel_size")
        hints = {
            "max_model_len": "use max_len (positions per slot, prompt + completion).",
            "max_num_seqs": "use slots (sequences decoded together).",
            "enable_prefix_caching": "use prefix_caching (with kv_cache='paged').",
            "block_size": "use page_size (with kv_cache='paged').",
            "quantization": "use quantize ('int8' or 'int8-smooth').",
            "tensor_parallel_size": f"use parallel=jc.ParallelConfig(tensor={tensor}, fsdp=1).",
            "data_parallel_size": f"use parallel=jc.ParallelConfig(data={data}, fsdp=1).",
        }
        known = [f.name for f in dataclasses.fields(cls)]
        check_keywords("ServingConfig", known, kwargs, hints, owner="inference.ServingConfig")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if not isinstance(self.slots, int) or self.slots < 1:
            raise jc.ConfigError(f"ServingConfig.slots={self.slots!r}: must be an integer >= 1.")
        if self.max_len is not None and self.max_len < 2:
            raise jc.ConfigError(f"ServingConfig.max_len={self.max_len!r}: must be >= 2.")
        if not isinstance(self.decode_steps, int) or self.decode_steps < 1:
            raise jc.ConfigError(
                f"ServingConfig.decode_steps={self.decode_steps!r}: must be an integer >= 1."
            )
        if self.kv_cache not in KV_CACHES:
            raise jc.ConfigError(
                f"ServingConfig.kv_cache={self.kv_cache!r}: use one of {list(KV_CACHES)}."
            )
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise jc.ConfigError(f"ServingConfig.page_size={self.page_size!r}: must be >= 1.")
        if self.pages is not None and self.pages < 2:
            raise jc.ConfigError(
                f"ServingConfig.pages={self.pages!r}: must be >= 2 (page 0 is the null page)."
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
