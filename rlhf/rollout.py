"""Rollouts through the inference engine, and the trainer-to-sampler weight hand-off.

`Sampler` wraps an `inference.LLM` (continuous batching, per-token log-probs). `load`
hands it the trainer's current weights in memory: the trainer's sharded arrays are
resharded onto the sampler's mesh by `rlhf.split.reshard` (device to device: XLA
collectives on a shared device set, regrouped shard copies across device sets; no file,
no host round trip, no full copy on one device unless the sampler has one device), and
the compiled prefill/decode functions are reused (same shapes and shardings, no
recompile).

Generation runs to ``max_tokens`` and EOS is applied afterwards with
`rlhf.losses.completion_mask`, as TRL truncates after the stop token: the sampler then
reports the EOS token's own log-prob, which the policy loss needs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from inference import LLM, SamplingParams, ServingConfig
from jaxcore import ConfigError
from jaxcore.models import TransformerConfig
from rlhf import lora
from rlhf.losses import completion_mask
from rlhf.split import reshard


class IdTokenizer:
    """Token ids as text (``"3 7 9"``): RLHF prompts and rewards work on ids, not text."""

    chat_template = None
    eos_id = None  # EOS is applied after generation (see the module docstring)

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)

    def token_bytes(self, token_id: int) -> bytes:
        return f"{token_id} ".encode()

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = True) -> str:
        raise ConfigError("IdTokenizer has no chat template; pass token-id prompts.")


@dataclasses.dataclass(frozen=True)
class Rollout:
    """A batch of prompt + completion sequences, aligned for training.

    ``tokens`` is ``(batch, length)`` right-padded; the per-token arrays are ``(batch,
    length - 1)``, aligned with `rlhf.models.token_logprobs` (index ``t`` scores token
    ``t + 1``): ``mask`` marks completion tokens up to and including the first EOS,
    ``sampler_logp`` their log-probs as the sampler computed them.
    """

    tokens: np.ndarray
    mask: np.ndarray
    sampler_logp: np.ndarray
    prompt_lengths: np.ndarray
    completions: list[list[int]]  # each truncated after its first EOS
    has_eos: np.ndarray
    generate_seconds: float

    @property
    def completion_tokens(self) -> int:
        return int(self.mask.sum())


class Sampler:
    """An `inference.LLM` serving the actor's current weights for rollouts.

    A LoRA actor's ``params`` start the sampler on their base weights (the adapters are
    left out); `load` then hands it the merged weights (`rlhf.lora.decoding_weights`),
    which the trainers do on construction.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        params: Any,
        serving: ServingConfig | None = None,
        *,
        eos_id: int | None = None,
    ):
        self.cfg, self.eos_id = cfg, eos_id
        if lora.has_adapters(params):
            params = lora.base_params(params)
        self.llm = LLM(params, config=cfg, engine=serving, tokenizer=IdTokenizer(cfg.vocab_size))

    def load(self, model: Any) -> None:
        """Serve ``model``'s weights (e.g. ``engine.bind(state)``; a LoRA model's merged),
        resharded in memory."""
        engine = self.llm.engine
        engine.load_weights(reshard(lora.decoding_weights(model), engine.placement.weights))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> Rollout:
        """Sample one completion per prompt (repeat prompts for several), batched."""
        if not prompts:
            raise ConfigError("Sampler.generate: no prompts; pass at least one list of ids.")
        scheduler = self.llm.scheduler
        work = [
            (
                list(map(int, p)),
                SamplingParams(
                    max_tokens=max_tokens,
                    temperature=temperature,
                    logprobs=0,
                    seed=seed * 100_003 + i,
                ),
            )
            for i, p in enumerate(prompts)
        ]
        start = time.perf_counter()
        handles = scheduler.submit_many(work)
        while not all(h.done for h in handles):
            scheduler.step()
        done = [h.wait() for h in handles]
        seconds = time.perf_counter() - start
        length = max(len(r.prompt) + max_tokens for r in done)
        n = len(done)
        tokens = np.zeros((n, length), np.int32)
        logp = np.zeros((n, length - 1), np.float32)
        plen = np.array([len(r.prompt) for r in done], np.int32)
        gen = np.zeros((n, max_tokens), np.int32)
        glen = np.array([len(r.output) for r in done], np.int32)
        for i, r in enumerate(done):
            p, out = len(r.prompt), list(r.output)
            tokens[i, :p] = r.prompt
            tokens[i, p : p + len(out)] = out
            logp[i, p - 1 : p - 1 + len(out)] = r.logprobs
            gen[i, : len(out)] = out
        gen_mask = np.asarray(completion_mask(jnp.asarray(gen), self.eos_id, jnp.asarray(glen)))
        mask = np.zeros((n, length - 1), np.float32)
        completions = []
        for i in range(n):
            k = int(gen_mask[i].sum())
            mask[i, plen[i] - 1 : plen[i] - 1 + k] = 1.0
            completions.append(gen[i, :k].tolist())
        has_eos = np.array(
            [self.eos_id is not None and bool(c) and c[-1] == self.eos_id for c in completions]
        )
        return Rollout(tokens, mask, logp * mask, plen, completions, has_eos, seconds)
