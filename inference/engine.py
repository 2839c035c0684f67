"""The device side of serving: weights on a mesh, a fixed set of decode slots, and two
jitted functions: prefill-and-insert (one compile per prompt bucket) and a multi-step
decode (one compile).

This is JetStream's prefill / insert / generate split: a prompt is prefilled alone, padded
to the next bucket length, and its cache written into a free slot while the other slots
keep their state. A decode dispatch advances every live slot by up to
``ServingConfig.decode_steps`` tokens in one ``lax.scan``, with the stop checks (EOS and
stop tokens, ``max_tokens``, the context length) on device, so the host pays one round
trip per K tokens instead of one per token (as MaxText's and JetStream's generate loops
keep the loop on device). Penalties, ``min_tokens`` and per-slot sampling settings are
arrays in the slot state, so one compiled step serves any mix of requests.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import NamedSharding

import jaxcore as jc
from inference import quantize as qz
from inference.config import DTYPES, ServingConfig
from inference.layer_cache import LayerKVCache, init_layer_cache, layer_decode_step, layer_insert
from inference.placement import place
from inference.sampling import MAX_TOP_LOGPROBS, penalize, sample_tokens, token_logprobs
from inference.weights import build_model
from jaxcore.models import (
    PagedKVCache,
    Transformer,
    TransformerConfig,
    TransformerDecoder,
    decoding_weights,
    init_paged_cache,
    paged_decode_step,
    paged_extend,
    plain_matmul,
)
from jaxcore.models.decoding import unstack_layers
from jaxcore.xla_flags import compiler_options

log = logging.getLogger(__name__)


class SlotState(struct.PyTreeNode):
    """Everything the decode step carries per slot (donated from step to step)."""

    cache: LayerKVCache | PagedKVCache
    tokens: jax.Array  # (slots,) the last token of each slot: the next decode input
    alive: jax.Array  # (slots,) bool: still generating (cleared on device at a stop)
    keys: jax.Array  # (slots, 2) uint32 raw key data
    counters: jax.Array  # (slots,) tokens drawn so far (folded into the key)
    max_tokens: jax.Array
    min_tokens: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    repetition: jax.Array
    presence: jax.Array
    frequency: jax.Array
    stop_mask: jax.Array  # (slots, vocab) bool: EOS and stop_token_ids
    seen: jax.Array  # (slots, vocab) bool: in the prompt or the output
    counts: jax.Array  # (slots, vocab) int32: generated occurrences
    bias: jax.Array  # (slots, vocab) float32: the request's logit_bias (0 elsewhere)


@dataclasses.dataclass(frozen=True)
class SlotSettings:
    """One request's per-slot sampling settings, as the prefill takes them."""

    key: np.ndarray
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0
    stop_ids: tuple[int, ...] = ()
    bias: tuple[tuple[int, float], ...] = ()  # (token id, logit bias) pairs


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """Host copies of one decode dispatch: ``(steps, slots)`` tokens and log-probs, and
    ``emitted[s, i]``: whether slot ``i`` really produced a token at step ``s``."""

    tokens: np.ndarray
    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    emitted: np.ndarray


@dataclasses.dataclass(frozen=True)
class PrefillOutput:
    """Host copies of a prefill: the first sampled token and the prompt's log-probs."""

    token: int
    logprob: float
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    prompt_logprobs: np.ndarray  # (length - 1,) log p(token[t + 1] | tokens[: t + 1])
    prompt_ranks: np.ndarray
    prompt_top_ids: np.ndarray
    prompt_top_logprobs: np.ndarray


def _buckets(max_len: int) -> tuple[int, ...]:
    out, b = [], 16
    while b < max_len:
        out.append(b)
        b *= 2
    return (*out, max_len)


def _reduced_spec(spec, shape: tuple[int, ...]):
    return type(spec)(*[None if shape[i] == 1 else s for i, s in enumerate(spec)])


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
        self.paged = config.kv_cache == "paged"
        self.pages_per_slot = -(-self.max_len // config.page_size)
        self.num_pages = config.pages or config.slots * self.pages_per_slot + 1
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
        self._unstack_fn: Any = None
        self._unstack()
        self._compile()
        self.state = self.empty_state()

    # ------------------------------------------------------------------ placement
    def _place(self, params: dict[str, Any]) -> None:
        cfg = self.model_config
        abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
        host = decoding_weights(build_model(cfg, params))
        self.placement = place(
            cfg,
            abstract,
            host,
            slots=self.config.slots,
            parallel=self.config.parallel,
            rules=self.config.rules,
        )
        self.mesh = self.placement.mesh
        weights = jax.device_put(host, self.placement.weights)
        if self.dtype != jnp.float32:
            weights = jax.tree.map(lambda x: x.astype(self.dtype) if x.ndim >= 2 else x, weights)
        self.weights = weights
        self.cache_sharding = self.placement.cache
        self.slot_sharding = self.placement.slots
        self.replicated = self.placement.replicated

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

    def _unstack(self) -> None:
        """Per-layer weights (`unstack_layers`): the layers run unrolled, with no per-step
        slice copies of stacked weights. Each layer keeps its stacked sharding, less the
        ``layers`` axis; the stacked arrays are dropped (no second copy stays)."""

        def per_layer(s):
            return NamedSharding(s.mesh, type(s.spec)(*s.spec[1:]))

        if self._unstack_fn is None:
            stacked = jax.tree.map(lambda x: x.sharding, self.weights)
            n = self.model_config.n_layers
            out = {
                **stacked,
                "blocks": tuple(jax.tree.map(per_layer, stacked["blocks"]) for _ in range(n)),
            }
            self._unstack_fn = jax.jit(unstack_layers, out_shardings=out)
        self.weights = self._unstack_fn(self.weights)

    def load_weights(self, weights: dict[str, Any]) -> None:
        """Serve new float weights in the stacked decoding layout, placed as
        ``placement.weights`` (e.g. a trainer's, resharded): cast to the serving dtype and
        split per layer like the start-up weights, so the compiled programs are reused."""
        if self.dtype != jnp.float32:
            weights = jax.tree.map(lambda x: x.astype(self.dtype) if x.ndim >= 2 else x, weights)
        self.weights = weights
        self._unstack()

    def _leaf(self, path):
        node = self.weights
        for k in path:
            node = node[k.key]
        return node

    def empty_state(self) -> SlotState:
        """All slots empty (lengths 0, greedy, not alive)."""
        n, vocab = self.config.slots, self.model_config.vocab_size

        def zeros_f():  # one buffer per field: donated buffers must not be shared
            return jnp.zeros((n,), jnp.float32)

        def zeros_i():
            return jnp.zeros((n,), jnp.int32)

        if self.paged:
            cache = init_paged_cache(
                self.model_config,
                n,
                self.max_len,
                self.num_pages,
                self.config.page_size,
                self.dtype,
            )
        else:
            cache = init_layer_cache(self.model_config, n, self.max_len, self.dtype)
        state = SlotState(
            cache=cache,
            tokens=zeros_i(),
            alive=jnp.zeros((n,), bool),
            keys=jnp.zeros((n, 2), jnp.uint32),
            counters=zeros_i(),
            max_tokens=zeros_i(),
            min_tokens=zeros_i(),
            temperature=zeros_f(),
            top_k=zeros_i(),
            top_p=jnp.ones((n,), jnp.float32),
            repetition=jnp.ones((n,), jnp.float32),
            presence=zeros_f(),
            frequency=zeros_f(),
            stop_mask=jnp.zeros((n, vocab), bool),
            seen=jnp.zeros((n, vocab), bool),
            counts=jnp.zeros((n, vocab), jnp.int32),
            bias=jnp.zeros((n, vocab), jnp.float32),
        )
        return jax.device_put(state, self.state_shardings)

    # ------------------------------------------------------------------ compiled functions
    def _compile(self) -> None:
        s = self.slot_sharding
        if self.paged:
            pages = self.placement.pages
            cache_sh = PagedKVCache(k=pages, v=pages, tables=s, lengths=s)
        else:  # the stacked cache's sharding, less its layers axis, for every layer
            layer = NamedSharding(
                self.mesh, type(self.cache_sharding.spec)(*self.cache_sharding.spec[1:])
            )
            per_layer = (layer,) * self.model_config.n_layers
            cache_sh = LayerKVCache(k=per_layer, v=per_layer, lengths=s)
        fields = {f.name: s for f in dataclasses.fields(SlotState) if f.name != "cache"}
        self.state_shardings = SlotState(cache=cache_sh, **fields)
        decoder, matmul, rep = self.decoder, self.matmul, self.replicated
        max_len, steps = self.max_len, self.config.decode_steps
        cfg, paged = self.model_config, self.paged

        def decode_step(weights, tokens, cache, active):
            if paged:
                return paged_decode_step(cfg, weights, tokens, cache, active=active, matmul=matmul)
            return layer_decode_step(cfg, weights, tokens, cache, active=active, matmul=matmul)

        def fill(weights, cache, tokens, start, length, slot, table_row, copy):
            """Prefill into the slot: logits of every prompt position, and the cache."""
            if paged:
                # Copy-on-write: page copy[0] -> copy[1] first (the null page onto itself
                # when there is nothing to copy), so the suffix writes a private page.
                src, dst = copy[0], copy[1]
                cache = cache.replace(
                    k=cache.k.at[:, dst].set(cache.k[:, src]),
                    v=cache.v.at[:, dst].set(cache.v[:, src]),
                    tables=cache.tables.at[slot].set(table_row),
                )
                return paged_extend(cfg, weights, tokens, start, length, cache, slot, matmul=matmul)
            logits, prefix = decoder.prefill(weights, tokens[None, :], matmul=matmul)
            return logits[0], layer_insert(cache, prefix, slot, length)

        def draw(logits, st: SlotState):
            """Penalties, logit bias, min_tokens and the per-slot sampler on ``logits:
            (slots, vocab)``."""
            logits = penalize(logits, st.seen, st.counts, st.repetition, st.presence, st.frequency)
            logits = logits + st.bias  # OpenAI's logit_bias: added before sampling
            banned = st.stop_mask & (st.counters < st.min_tokens)[:, None]
            logits = jnp.where(banned, -jnp.inf, logits)
            typed = jax.vmap(lambda k, c: jax.random.fold_in(jax.random.wrap_key_data(k), c))(
                st.keys, st.counters
            )
            return sample_tokens(logits, typed, st.temperature, st.top_k, st.top_p)

        def still_alive(st: SlotState, token, lengths):
            """A slot stops at a stop token, at max_tokens, or when the context is full."""
            rows = jnp.arange(token.shape[0])
            stopped = st.stop_mask[rows, token]
            return ~stopped & (st.counters < st.max_tokens) & (lengths + 1 < max_len)

        def prefill_insert(
            weights, state: SlotState, tokens, start, length, slot, table_row, copy, settings, masks
        ):
            stop_mask, seen, bias = masks
            logits, cache = fill(weights, state.cache, tokens, start, length, slot, table_row, copy)
            prompt_out = token_logprobs(logits[:-1], tokens[1:], MAX_TOP_LOGPROBS)
            last = jax.lax.dynamic_index_in_dim(logits, length - 1, keepdims=True)
            vocab = logits.shape[-1]
            one = SlotState(
                cache=None,
                tokens=tokens[:1],
                alive=jnp.ones((1,), bool),
                keys=settings["key"][None],
                counters=jnp.zeros((1,), jnp.int32),
                seen=seen[None],
                counts=jnp.zeros((1, vocab), jnp.int32),
                stop_mask=stop_mask[None],
                bias=bias[None],
                **{k: settings[k][None] for k in _SETTING_FIELDS},
            )
            token = draw(last, one)
            lp, _, top_ids, top_lp = token_logprobs(last, token, MAX_TOP_LOGPROBS)
            one = one.replace(counters=one.counters + 1)
            alive = still_alive(one, token, (start + length)[None])[0]

            def put(field, value):
                return getattr(state, field).at[slot].set(value)

            new = SlotState(
                cache=cache,
                tokens=put("tokens", token[0]),
                alive=put("alive", alive),
                keys=put("keys", settings["key"]),
                counters=put("counters", 1),
                stop_mask=put("stop_mask", stop_mask),
                seen=put("seen", seen.at[token[0]].set(True)),
                counts=put("counts", jnp.zeros((vocab,), jnp.int32).at[token[0]].set(1)),
                bias=put("bias", bias),
                **{k: put(k, settings[k]) for k in _SETTING_FIELDS},
            )
            first = (token[0], lp[0], top_ids[0], top_lp[0])
            return new, first, prompt_out

        def decode(weights, state: SlotState, active, *, greedy: bool):
            """``steps`` decode steps. ``greedy``: the fast path for slots that are all
            greedy, unpenalized and report no alternatives: argmax and the chosen token's
            log-prob only (no penalties, keys, sampler, top-k or rank per step; the same
            tokens, since neutral penalties return the logits bit for bit). It leaves
            ``seen`` / ``counts`` alone: only penalized requests read them, and those
            always take the full path."""

            def one_step(st: SlotState, _):
                live = active & st.alive
                logits, cache = decode_step(weights, st.tokens, st.cache, live)
                if greedy:
                    banned = st.stop_mask & (st.counters < st.min_tokens)[:, None]
                    picked = jnp.argmax(jnp.where(banned, -jnp.inf, logits), axis=-1)
                    token = jnp.where(live, picked.astype(jnp.int32), st.tokens)
                    logp = jax.nn.log_softmax(logits, axis=-1)
                    lp = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
                    top_ids = jnp.zeros((token.shape[0], 0), jnp.int32)
                    top_lp = jnp.zeros((token.shape[0], 0), jnp.float32)
                    st = st.replace(
                        cache=cache, tokens=token, counters=st.counters + live.astype(jnp.int32)
                    )
                else:
                    token = jnp.where(live, draw(logits, st), st.tokens)
                    lp, _, top_ids, top_lp = token_logprobs(logits, token, MAX_TOP_LOGPROBS)
                    rows = jnp.arange(token.shape[0])
                    grown = live.astype(jnp.int32)
                    st = st.replace(
                        cache=cache,
                        tokens=token,
                        counters=st.counters + grown,
                        seen=st.seen.at[rows, token].max(live),
                        counts=st.counts.at[rows, token].add(grown),
                    )
                st = st.replace(
                    alive=jnp.where(live, still_alive(st, token, cache.lengths), st.alive)
                )
                return st, (token, lp, top_ids, top_lp, live)

            return jax.lax.scan(one_step, state, None, length=steps)

        # The train steps' CPU options (Eigen dots, not YNNPACK's): the batch-16 decode
        # step ran 1.35x faster with them (benchmarks/inference.md); None off CPU.
        options = compiler_options(self.mesh.devices.flat[0].platform)
        self._prefill_insert = jax.jit(
            prefill_insert,
            out_shardings=(self.state_shardings, rep, rep),
            donate_argnums=(1,),
            compiler_options=options,
        )
        self._decode, self._decode_greedy = (
            jax.jit(
                functools.partial(decode, greedy=greedy),
                out_shardings=(self.state_shardings, rep),
                donate_argnums=(1,),
                compiler_options=options,
            )
            for greedy in (False, True)
        )

    def compile_count(self) -> int:
        """Compiled variants of the serving functions so far (one per bucket + the two
        decodes: full and greedy)."""
        decodes = self._decode._cache_size() + self._decode_greedy._cache_size()
        return self._prefill_insert._cache_size() + decodes

    def warmup(self) -> None:
        """Compile every bucket and the decode step now (then nothing compiles at runtime)."""
        pages = np.zeros(self.pages_per_slot, np.int32) if self.paged else None
        for bucket in self.buckets:
            key = np.zeros(2, np.uint32)
            fetch_prefill(self.prefill_async(0, [0] * bucket, SlotSettings(key=key), pages=pages))
        for greedy in (False, True):
            self.decode(np.zeros(self.config.slots, bool), greedy=greedy)
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

    def prefill_async(
        self,
        slot: int,
        prompt: list[int],
        settings: SlotSettings,
        *,
        start: int = 0,
        pages: np.ndarray | None = None,
        copy: tuple[int, int] | None = None,
    ) -> Any:
        """Dispatch the prefill of ``prompt`` into ``slot`` and its first draw; returns the
        device outputs (`fetch_prefill` turns them into a `PrefillOutput`).

        Paged cache: ``pages`` is the slot's page table row and the first ``start``
        positions are already in those pages (a cached prefix): only the rest is run.
        ``copy = (source, destination)`` copies one page first (copy-on-write of the block
        where the prompt diverges from a cached one).
        """
        if self.paged and pages is None:
            raise jc.ConfigError("a paged engine's prefill needs the slot's pages=.")
        if not self.paged and start:
            raise jc.ConfigError("only the paged cache can start a prefill past position 0.")
        suffix = prompt[start:]
        length = len(suffix)
        bucket = self.bucket_for(length)
        tokens = np.zeros(bucket, np.int32)
        tokens[:length] = suffix
        vocab = self.model_config.vocab_size
        stop_mask = np.zeros(vocab, bool)
        stop_mask[list(settings.stop_ids)] = True
        seen = np.zeros(vocab, bool)
        seen[prompt] = True
        bias = np.zeros(vocab, np.float32)
        for token, value in settings.bias:
            bias[token] = value
        table_row = np.zeros(self.pages_per_slot, np.int32) if pages is None else pages
        # A top_k past the vocabulary keeps all of it and a min_tokens past max_tokens
        # never ends early: clamped, they mean the same and fit int32 (1e12 overflowed).
        packed = {
            "key": np.asarray(settings.key, np.uint32),
            "max_tokens": np.int32(settings.max_tokens),
            "min_tokens": np.int32(min(settings.min_tokens, settings.max_tokens)),
            "temperature": np.float32(settings.temperature),
            "top_k": np.int32(min(settings.top_k, vocab)),
            "top_p": np.float32(settings.top_p),
            "repetition": np.float32(settings.repetition),
            "presence": np.float32(settings.presence),
            "frequency": np.float32(settings.frequency),
        }
        self.state, first, prompt_out = self._prefill_insert(
            self.weights,
            self.state,
            tokens,
            np.int32(start),
            np.int32(length),
            np.int32(slot),
            np.asarray(table_row, np.int32),
            np.asarray(copy or (0, 0), np.int32),
            packed,
            (stop_mask, seen, bias),
        )
        return first, prompt_out, length

    def prefill(self, slot: int, prompt: list[int], settings: SlotSettings) -> PrefillOutput:
        """Prefill ``prompt`` into ``slot`` and draw its first token (waits for it; a paged
        engine writes it to the slot's first pages, for scoring)."""
        pages = None
        if self.paged:
            pages = np.arange(1, 1 + self.pages_per_slot, dtype=np.int32) % self.num_pages
        return fetch_prefill(self.prefill_async(slot, prompt, settings, pages=pages))

    def decode_async(self, active: np.ndarray, *, greedy: bool = False) -> Any:
        """Dispatch ``decode_steps`` decode steps and return their device outputs without
        waiting: the host works on the previous dispatch's tokens while these run.

        ``greedy=True`` takes the fast path: only for when every active slot's request is
        greedy (temperature 0), has neutral penalties and reports no top alternatives;
        its outputs carry no alternatives (``top_ids`` has width 0).
        """
        fn = self._decode_greedy if greedy else self._decode
        self.state, out = fn(self.weights, self.state, np.asarray(active, bool))
        return out

    def decode(self, active: np.ndarray, *, greedy: bool = False) -> StepOutput:
        """``decode_steps`` tokens for every live slot (rows where ``active`` is false, or
        that stopped on device, are not advanced)."""
        return fetch(self.decode_async(active, greedy=greedy))


_SETTING_FIELDS = (
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition",
    "presence",
    "frequency",
)


def fetch(out: Any) -> StepOutput:
    """Host copies of a `SlotEngine.decode_async` result."""
    return StepOutput(*jax.device_get(out))


def fetch_prefill(out: Any) -> PrefillOutput:
    """Host copies of a `SlotEngine.prefill_async` result."""
    first, prompt_out, length = out
    token, lp, top_ids, top_lp = jax.device_get(first)
    plp, prank, ptop_ids, ptop_lp = jax.device_get(prompt_out)
    n = length - 1
    return PrefillOutput(
        token=int(token),
        logprob=float(lp),
        top_ids=top_ids,
        top_logprobs=top_lp,
        prompt_logprobs=plp[:n],
        prompt_ranks=prank[:n],
        prompt_top_ids=ptop_ids[:n],
        prompt_top_logprobs=ptop_lp[:n],
    )
