"""The device side of serving: weights on a mesh, a fixed set of decode slots, and three
jitted functions: prefill-and-insert (one compile per prompt bucket), decode (one compile)
and scoring.

This is JetStream's prefill / insert / generate split: a prompt is prefilled alone, padded
to the next bucket length, and its cache written into a free slot while the other slots
keep their state; each decode step advances every slot by one token with a fixed shape, so
requests coming and going never recompile. Shardings come from the same `ParallelConfig`
and logical-axis rules as training (weights: heads and MLP over ``tensor``; the cache:
slots over ``data``/``fsdp``, key/value heads over ``tensor``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

import jaxcore as jc
from inference import quantize as qz
from inference.sampling import MAX_TOP_LOGPROBS, sample_tokens, token_logprobs
from inference.weights import build_model
from jaxcore.models import (
    KVCache,
    TransformerConfig,
    TransformerDecoder,
    decoding_weights,
    plain_matmul,
)

log = logging.getLogger(__name__)

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
        dtype: compute dtype of weights and cache (``float32`` or ``bfloat16``).
        quantize: ``None``, ``int8`` (per-channel absmax) or ``int8-smooth`` (SmoothQuant
            scales calibrated on ``calibration`` batches first).
        smooth_alpha: SmoothQuant's migration strength.
        parallel: mesh layout; ``None`` serves on one device.
        seed: seed of the keys of requests that bring none.
    """

    slots: int = 8
    max_len: int | None = None
    prefill_buckets: tuple[int, ...] | None = None
    dtype: str = "float32"
    quantize: str | None = None
    smooth_alpha: float = 0.5
    parallel: jc.ParallelConfig | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.slots, int) or self.slots < 1:
            raise jc.ConfigError(f"ServingConfig.slots={self.slots!r}: must be an integer >= 1.")
        if self.max_len is not None and self.max_len < 2:
            raise jc.ConfigError(f"ServingConfig.max_len={self.max_len!r}: must be >= 2.")
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


class SlotState(struct.PyTreeNode):
    """Everything the decode step carries per slot (donated from step to step)."""

    cache: KVCache
    tokens: jax.Array  # (slots,) the last token of each slot: the next decode input
    keys: jax.Array  # (slots, 2) uint32 raw key data
    counters: jax.Array  # (slots,) tokens drawn so far (folded into the key)
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """Host copies of one decode step: per slot token, its log-prob and the top alternatives."""

    tokens: np.ndarray
    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray


@dataclasses.dataclass(frozen=True)
class PrefillOutput:
    """Host copies of a prefill: the first sampled token and the prompt's log-probs."""

    token: int
    logprob: float
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    prompt_logprobs: np.ndarray  # (length - 1,) log p(token[t + 1] | tokens[: t + 1])
    prompt_top_ids: np.ndarray
    prompt_top_logprobs: np.ndarray


def _buckets(max_len: int) -> tuple[int, ...]:
    out, b = [], 16
    while b < max_len:
        out.append(b)
        b *= 2
    return (*out, max_len)


def _reduced_spec(spec: PartitionSpec, shape: tuple[int, ...]) -> PartitionSpec:
    return PartitionSpec(*[None if shape[i] == 1 else s for i, s in enumerate(spec)])


class SlotEngine:
    """A model placed on a mesh with ``slots`` decode slots and its compiled functions."""

    def __init__(
        self,
        cfg: TransformerConfig,
        params: dict[str, Any],
        config: ServingConfig | None = None,
        *,
        calibration: list[np.ndarray] | None = None,
    ):
        self.config = config = config or ServingConfig()
        self.model_config = cfg
        if config.max_len is not None and config.max_len > cfg.max_seq_len:
            raise jc.ConfigError(
                f"ServingConfig.max_len={config.max_len} is above the model's max_seq_len="
                f"{cfg.max_seq_len}; lower it (or leave it None to use max_seq_len)."
            )
        self.max_len = config.max_len or cfg.max_seq_len
        self.buckets = tuple(
            sorted(
                {min(b, self.max_len) for b in (config.prefill_buckets or _buckets(self.max_len))}
            )
        )
        self.decoder = TransformerDecoder(cfg)
        self.dtype = DTYPES[config.dtype]
        self._place(params)
        self.float_bytes = qz.weight_bytes(self.weights)
        self.matmul = plain_matmul
        if config.quantize is not None:
            self._quantize(calibration)
        self.weight_bytes = qz.weight_bytes(self.weights)
        self._compile()
        self.state = self.empty_state()

    # ------------------------------------------------------------------ placement
    def _place(self, params: dict[str, Any]) -> None:
        parallel = self.config.parallel
        devices = jax.devices()[:1] if parallel is None else None
        engine = jc.Engine(
            parallel=parallel or jc.ParallelConfig(fsdp=1), precision="fp32", devices=devices
        )
        state = engine.prepare(build_model(self.model_config, params), optax.identity())
        self.mesh = engine.mesh
        weights = decoding_weights(engine.bind(state))
        if self.dtype != jnp.float32:
            weights = jax.tree.map(lambda x: x.astype(self.dtype) if x.ndim >= 2 else x, weights)
        self.weights = weights
        batch_spec = engine.batch_sharding.spec
        batch_axes = batch_spec[0] if len(batch_spec) else None
        ways = int(np.prod([self.mesh.shape[a] for a in jax.tree.leaves(batch_axes)] or [1]))
        if self.config.slots % ways:
            raise jc.ConfigError(
                f"ServingConfig.slots={self.config.slots} does not split over the {ways} "
                f"data-parallel ways of {parallel}; use a multiple of {ways}."
            )
        wk_spec = tuple(weights["blocks"]["wk"].sharding.spec) + (None,) * 4
        # Cache (layers, slots, kv_heads, time, head_dim): layers as wk's layers, slots as
        # the batch, kv heads as wk's kv heads.
        self.cache_sharding = NamedSharding(
            self.mesh, PartitionSpec(wk_spec[0], batch_axes, wk_spec[2], None, None)
        )
        self.slot_sharding = NamedSharding(self.mesh, PartitionSpec(batch_axes))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())

    def _quantize(self, calibration: list[np.ndarray] | None) -> None:
        weights = self.weights
        if self.config.quantize == "int8-smooth":
            if not calibration:
                raise jc.ConfigError(
                    "ServingConfig.quantize='int8-smooth' needs calibration batches: pass "
                    "calibration=[token id arrays of shape (batch, length)]."
                )
            stats = qz.calibrate(self.model_config, weights, calibration)
            weights = qz.smooth_weights(
                weights,
                stats,
                alpha=self.config.smooth_alpha,
                n_kv_heads=self.model_config.n_kv_heads,
            )
        shardings = jax.tree.map(lambda x: x.sharding, self.weights)

        def out_sharding(path, s):
            name = str(getattr(path[-1], "key", ""))
            if name not in qz.CONTRACTED_AXES:
                return s
            shape = tuple(
                1 if d in qz.CONTRACTED_AXES[name] else n
                for d, n in enumerate(self._leaf(path).shape)
            )
            return qz.QuantizedWeight(
                q=s, scale=NamedSharding(self.mesh, _reduced_spec(s.spec, shape))
            )

        out = jax.tree_util.tree_map_with_path(out_sharding, shardings)
        self.weights = jax.jit(qz.quantize_weights, out_shardings=out)(weights)
        self.matmul = qz.quantized_matmul

    def _leaf(self, path):
        node = self.weights
        for k in path:
            node = node[k.key]
        return node

    def empty_state(self) -> SlotState:
        """All slots empty (lengths 0, greedy)."""
        n = self.config.slots
        cache = self.decoder.init_cache(n, self.max_len, self.dtype)
        state = SlotState(
            cache=cache,
            tokens=jnp.zeros((n,), jnp.int32),
            keys=jnp.zeros((n, 2), jnp.uint32),
            counters=jnp.zeros((n,), jnp.int32),
            temperature=jnp.zeros((n,), jnp.float32),
            top_k=jnp.zeros((n,), jnp.int32),
            top_p=jnp.ones((n,), jnp.float32),
        )
        return jax.device_put(state, self.state_shardings)

    # ------------------------------------------------------------------ compiled functions
    def _compile(self) -> None:
        cache_sh = KVCache(k=self.cache_sharding, v=self.cache_sharding, lengths=self.slot_sharding)
        s = self.slot_sharding
        self.state_shardings = SlotState(
            cache=cache_sh, tokens=s, keys=s, counters=s, temperature=s, top_k=s, top_p=s
        )
        decoder, matmul, rep = self.decoder, self.matmul, self.replicated

        def draw(logits, keys, counters, temperature, top_k, top_p):
            typed = jax.vmap(lambda k, c: jax.random.fold_in(jax.random.wrap_key_data(k), c))(
                keys, counters
            )
            return sample_tokens(logits, typed, temperature, top_k, top_p)

        def prefill_insert(weights, state, tokens, length, slot, key, temperature, top_k, top_p):
            logits, prefix = decoder.prefill(weights, tokens[None, :], matmul=matmul)
            logits = logits[0]
            prompt_lp, prompt_top_ids, prompt_top_lp = token_logprobs(
                logits[:-1], tokens[1:], MAX_TOP_LOGPROBS
            )
            last = jax.lax.dynamic_index_in_dim(logits, length - 1, keepdims=True)
            token = draw(
                last,
                key[None],
                jnp.zeros((1,), jnp.int32),
                temperature[None],
                top_k[None],
                top_p[None],
            )
            lp, top_ids, top_lp = token_logprobs(last, token, MAX_TOP_LOGPROBS)
            new = SlotState(
                cache=decoder.insert(state.cache, prefix, slot, length),
                tokens=state.tokens.at[slot].set(token[0]),
                keys=state.keys.at[slot].set(key),
                counters=state.counters.at[slot].set(1),
                temperature=state.temperature.at[slot].set(temperature),
                top_k=state.top_k.at[slot].set(top_k),
                top_p=state.top_p.at[slot].set(top_p),
            )
            first = (token[0], lp[0], top_ids[0], top_lp[0])
            return new, first, (prompt_lp, prompt_top_ids, prompt_top_lp)

        def decode(weights, state, active):
            logits, cache = decoder.decode_step(
                weights, state.tokens, state.cache, active=active, matmul=matmul
            )
            token = draw(
                logits, state.keys, state.counters, state.temperature, state.top_k, state.top_p
            )
            token = jnp.where(active, token, state.tokens)
            lp, top_ids, top_lp = token_logprobs(logits, token, MAX_TOP_LOGPROBS)
            new = state.replace(
                cache=cache, tokens=token, counters=state.counters + active.astype(jnp.int32)
            )
            return new, (token, lp, top_ids, top_lp)

        self._prefill_insert = jax.jit(
            prefill_insert,
            out_shardings=(self.state_shardings, rep, rep),
            donate_argnums=(1,),
        )
        self._decode = jax.jit(
            decode, out_shardings=(self.state_shardings, rep), donate_argnums=(1,)
        )

    def compile_count(self) -> int:
        """Compiled variants of the serving functions so far (one per bucket + one decode)."""
        return self._prefill_insert._cache_size() + self._decode._cache_size()

    def warmup(self) -> None:
        """Compile every bucket and the decode step now (then nothing compiles at runtime)."""
        for bucket in self.buckets:
            self.prefill(0, [0] * bucket, key=np.zeros(2, np.uint32))
        self.decode(np.zeros(self.config.slots, bool))
        self.state = self.empty_state()

    # ------------------------------------------------------------------ host API
    def bucket_for(self, length: int) -> int:
        for b in self.buckets:
            if b >= length:
                return b
        raise jc.ConfigError(
            f"prompt of {length} tokens is longer than the largest prefill bucket "
            f"{self.buckets[-1]} (max_len={self.max_len})."
        )

    def prefill(
        self,
        slot: int,
        prompt: list[int],
        *,
        key: np.ndarray,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> PrefillOutput:
        """Prefill ``prompt`` into ``slot`` and draw its first token."""
        length = len(prompt)
        bucket = self.bucket_for(length)
        tokens = np.zeros(bucket, np.int32)
        tokens[:length] = prompt
        self.state, first, prompt_out = self._prefill_insert(
            self.weights,
            self.state,
            tokens,
            np.int32(length),
            np.int32(slot),
            np.asarray(key, np.uint32),
            np.float32(temperature),
            np.int32(top_k),
            np.float32(top_p),
        )
        token, lp, top_ids, top_lp = jax.device_get(first)
        plp, ptop_ids, ptop_lp = jax.device_get(prompt_out)
        n = length - 1
        return PrefillOutput(
            token=int(token),
            logprob=float(lp),
            top_ids=top_ids,
            top_logprobs=top_lp,
            prompt_logprobs=plp[:n],
            prompt_top_ids=ptop_ids[:n],
            prompt_top_logprobs=ptop_lp[:n],
        )

    def decode_async(self, active: np.ndarray) -> Any:
        """Dispatch one decode step and return its device outputs without waiting.

        The host can then work on the previous step's tokens while this one runs.
        """
        self.state, out = self._decode(self.weights, self.state, np.asarray(active, bool))
        return out

    def decode(self, active: np.ndarray) -> StepOutput:
        """One token for every slot (rows where ``active`` is false are ignored)."""
        return fetch(self.decode_async(active))


def fetch(out: Any) -> StepOutput:
    """Host copies of a `SlotEngine.decode_async` result."""
    return StepOutput(*jax.device_get(out))
