"""Sampling settings and the jitted sampler that applies them per decode slot.

Every slot carries its own temperature, top-k, top-p and key as arrays, so one compiled
decode step serves any mix of requests (greedy rows and sampled rows side by side). Keys
are explicit: a request's seed plus the token index decides its draw, so a seeded request
gives the same text whether it runs alone or batched with others.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

import jaxcore as jc
from jaxcore.errors import check_keywords

# Alternatives per position the engine computes for ``logprobs`` / ``top_logprobs``
# (OpenAI's chat API and vLLM allow up to 20).
MAX_TOP_LOGPROBS = 20
_FLOATS = (
    "temperature",
    "top_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to pick tokens for one request.

    Attributes:
        max_tokens: most tokens to generate (0: score the prompt only).
        temperature: 0 picks the most likely token (greedy); otherwise logits are divided
            by it before sampling.
        top_k: sample among the k most likely tokens (0: no limit).
        top_p: sample among the smallest set of tokens whose probability reaches top_p.
        min_tokens: tokens generated before EOS or a stop token may end generation (they
            are masked out until then, as in vLLM).
        stop: strings that end generation (not included in the text unless
            ``include_stop_str_in_output``).
        stop_token_ids: token ids that end generation (not included).
        include_stop_str_in_output: keep the matched stop string at the end of the text.
        ignore_eos: keep going past the tokenizer's end-of-sequence token.
        repetition_penalty: divides positive (multiplies negative) logits of every token
            already in the prompt or the output (CTRL / vLLM; 1 = off).
        presence_penalty: subtracted once from the logit of each token already generated.
        frequency_penalty: subtracted per occurrence from generated tokens' logits.
        seed: seed of this request's key, any integer (taken modulo 2**64; ``None``:
            drawn from the engine's seed).
        logprobs: number of top alternatives to report per token (``None``: none;
            0: only the chosen token's log-probability).
        prompt_logprobs: score the prompt tokens too, with this many alternatives each
            (``None``: no; ``True`` means 0 alternatives).
        logit_bias: ``{token_id: bias}`` added to the logits before sampling, each bias in
            [-100, 100] (OpenAI's ``logit_bias``: -100 bans a token, +100 forces it);
            stored as sorted ``(id, bias)`` pairs.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: Mapping[int, float] | tuple[tuple[int, float], ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> SamplingParams:
        # SamplingParams(n=2) copied from vLLM: a ConfigError with the way out, not a TypeError.
        check_sampling_keywords("SamplingParams", kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for name in _FLOATS:  # inf passed the range checks and gave degenerate output
            if not math.isfinite(getattr(self, name)):
                raise jc.ConfigError(
                    f"SamplingParams.{name}={getattr(self, name)!r}: must be a finite number."
                )
        if not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise jc.ConfigError(f"SamplingParams.max_tokens={self.max_tokens!r}: must be >= 0.")
        if not self.temperature >= 0:
            raise jc.ConfigError(
                f"SamplingParams.temperature={self.temperature!r}: must be >= 0 (0 = greedy)."
            )
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise jc.ConfigError(f"SamplingParams.top_k={self.top_k!r}: must be >= 0 (0 = off).")
        if not 0 < self.top_p <= 1:
            raise jc.ConfigError(f"SamplingParams.top_p={self.top_p!r}: must be in (0, 1].")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise jc.ConfigError(
                f"SamplingParams.logprobs={self.logprobs!r}: must be between 0 and "
                f"{MAX_TOP_LOGPROBS}, or None."
            )
        if isinstance(self.prompt_logprobs, bool):
            object.__setattr__(self, "prompt_logprobs", 0 if self.prompt_logprobs else None)
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise jc.ConfigError(
                f"SamplingParams.prompt_logprobs={self.prompt_logprobs!r}: must be between 0 "
                f"and {MAX_TOP_LOGPROBS}, or None."
            )
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise jc.ConfigError(f"SamplingParams.min_tokens={self.min_tokens!r}: must be >= 0.")
        if not self.repetition_penalty > 0:
            raise jc.ConfigError(
                f"SamplingParams.repetition_penalty={self.repetition_penalty!r}: must be > 0 "
                "(1 = off)."
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise jc.ConfigError(
                    f"SamplingParams.{name}={getattr(self, name)!r}: must be in [-2, 2]."
                )
        if self.seed is not None:  # a float failed inside the scheduler's step (TypeError)
            if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
                raise jc.ConfigError(
                    f"SamplingParams.seed={self.seed!r}: must be an integer, or None for a "
                    "seed drawn from the engine's."
                )
            object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise jc.ConfigError("SamplingParams.stop: stop strings must be non-empty.")


def check_sampling_keywords(where: str, given: dict[str, Any]) -> None:
    """Refuse a keyword of ``given`` that is no `SamplingParams` field with a `ConfigError`
    naming the field meant (it was Python's TypeError). vLLM's ``n`` and ``best_of`` get the
    way to draw several samples here."""
    hints = {
        name: (
            f"{value!r} samples: pass the prompt {value!r} times with temperature > 0 and "
            "seed=None, or with a list of SamplingParams, one per prompt, seeded seed, "
            "seed + 1, ... (one seed draws the same tokens every time); one Completion per "
            "prompt here. The server's /v1/completions takes n and best_of."
        )
        for name, value in given.items()
        if name in ("n", "best_of")  # vLLM's SamplingParams has them
    }
    known = sorted(f.name for f in dataclasses.fields(SamplingParams))
    check_keywords(where, known, given, hints, owner="SamplingParams")


# OpenAI's range for a ``logit_bias`` value.
MAX_LOGIT_BIAS = 100.0


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted ``(token_id, bias)`` pairs, checked."""
    items = bias.items() if isinstance(bias, Mapping) else bias
    pairs: dict[int, float] = {}
    for token, value in items:
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise jc.ConfigError(
                f"SamplingParams.logit_bias: key {token!r} is not a token id (an integer >= 0)."
            )
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise jc.ConfigError(
                f"SamplingParams.logit_bias[{token}]={value!r}: must be a number in "
                f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]."
            )
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:  # also refuses NaN
            raise jc.ConfigError(
                f"SamplingParams.logit_bias[{token}]={value!r}: must be in "
                f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]."
            )
        pairs[int(token)] = float(value)
    return tuple(sorted(pairs.items()))


def penalize(
    logits: jax.Array,
    seen: jax.Array,
    counts: jax.Array,
    repetition: jax.Array,
    presence: jax.Array,
    frequency: jax.Array,
) -> jax.Array:
    """vLLM's penalties on ``logits: (rows, vocab)``; with their neutral values (1, 0, 0)
    every logit is returned bit for bit, so greedy outputs do not move.

    ``seen``: tokens in the prompt or output (repetition); ``counts``: generated
    occurrences (presence, frequency).
    """
    r = repetition[:, None]
    logits = jnp.where(seen, jnp.where(logits > 0, logits / r, logits * r), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0)


def _filtered_sample(logits, keys, temperature, top_k, top_p):
    vocab = logits.shape[-1]
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    sorted_desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    ranks = jnp.arange(vocab)[None, :]
    kept = jnp.where(ranks < k[:, None], sorted_desc, -jnp.inf)
    # Top-p on what top-k left (vLLM's order): keep rank i while the mass before it < p.
    probs = jax.nn.softmax(kept, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs
    count = jnp.maximum(jnp.sum(before < top_p[:, None], axis=-1), 1)
    count = jnp.minimum(count, k)
    threshold = jnp.take_along_axis(sorted_desc, (count - 1)[:, None], axis=-1)
    masked = jnp.where(scaled >= threshold, scaled, -jnp.inf)
    return jax.vmap(jax.random.categorical)(keys, masked)


def sample_tokens(
    logits: jax.Array,
    keys: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
    """One token per row of ``logits: (rows, vocab)``; greedy where temperature is 0.

    ``keys`` are typed keys, one per row. The sort that top-k/top-p need is skipped when
    every row is greedy.
    """
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    sampled = jax.lax.cond(
        jnp.any(temperature > 0),
        lambda: _filtered_sample(logits, keys, temperature, top_k, top_p).astype(jnp.int32),
        lambda: greedy,
    )
    return jnp.where(temperature > 0, sampled, greedy)


def token_logprobs(
    logits: jax.Array, tokens: jax.Array, top_n: int = MAX_TOP_LOGPROBS
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Log-probabilities of ``tokens`` under ``logits``, their rank and the ``top_n``
    alternatives.

    Reported from the model's own distribution (before penalties, temperature, top-k,
    top-p), as OpenAI and vLLM do. Returns ``(chosen (...,), rank (...,), top_ids (..., n),
    top_logprobs (..., n))``; rank 1 is the most likely token.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    rank = 1 + jnp.sum(logp > chosen[..., None], axis=-1, dtype=jnp.int32)
    top_lp, top_ids = jax.lax.top_k(logp, min(top_n, logits.shape[-1]))
    return chosen, rank, top_ids.astype(jnp.int32), top_lp
