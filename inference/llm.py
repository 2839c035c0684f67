"""`LLM`: the notebook face of the inference engine (generate, score) in a few lines.

    llm = LLM("model.safetensors")            # or a TrainState with config=, or "tiny"
    print(llm.generate("def main(", max_tokens=32).text)

It builds a `SlotEngine` and a `Scheduler`; without a running scheduler thread `generate`
steps the scheduler itself, so nothing runs in the background unless `start()` is called
(the server does).
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any

import numpy as np

import jaxcore as jc
from inference.batching import Scheduler
from inference.config import ServingConfig
from inference.engine import SlotEngine
from inference.request import Request, RequestError, check_text
from inference.sampling import SamplingParams
from inference.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from inference.weights import REGISTRY, resolve_model
from jaxcore.models import TransformerConfig


class ClosedError(jc.JaxcoreError, RuntimeError):
    """The `LLM` was closed: it takes no more work."""


@dataclasses.dataclass(frozen=True)
class Completion:
    """A finished generation.

    Attributes:
        text: the generated text (stop strings removed).
        tokens: generated token ids.
        logprobs: log-probability of each generated token.
        finish_reason: ``stop``, ``length`` or ``cancelled``.
        prompt_tokens: the prompt's token ids.
        prompt_logprobs: log p of each prompt token after the first (if asked for).
        top_logprobs: per generated token, the ``logprobs`` most likely ``(id, log p)``
            (empty unless ``logprobs`` was asked for).
        prompt_top_logprobs: the same per prompt token after the first
            (``prompt_logprobs`` alternatives).
    """

    text: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_tokens: list[int]
    prompt_logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    prompt_top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)

    @classmethod
    def from_request(cls, r: Request) -> Completion:
        return cls(
            text=r.text,
            tokens=list(r.output),
            logprobs=list(r.logprobs),
            finish_reason=r.finish_reason or "cancelled",
            prompt_tokens=list(r.prompt),
            prompt_logprobs=list(r.prompt_logprobs),
            top_logprobs=list(r.top_logprobs),
            prompt_top_logprobs=list(r.prompt_top_logprobs),
        )


class LLM:
    """A served model: weights on devices, decode slots, a tokenizer and a scheduler.

    Args:
        model: a registry name (``tiny``...), ``registry:NAME@alias``, a ``.safetensors``
            path, a `TrainState` or a params dict (the last two with ``config=``).
        config: the `TransformerConfig` when ``model`` carries none.
        engine: slots, buckets, dtype, quantization and mesh (`ServingConfig`).
        tokenizer: a tokenizer object, a ``tokenizer.json`` path or folder, or a
            SentencePiece ``tokenizer.model`` (a ``str`` is always a path), or ``None``:
            the model source's tokenizer, else bytes.
        calibration: texts or token-id arrays for ``quantize='int8-smooth'``.
        queue_size: waiting requests before `QueueFullError`.
        seed: initialisation seed for registry names.
    """

    def __init__(
        self,
        model: Any,
        *,
        config: TransformerConfig | None = None,
        engine: ServingConfig | None = None,
        tokenizer: Tokenizer | str | None = None,
        calibration: list[Any] | None = None,
        queue_size: int = 256,
        seed: int = 0,
    ):
        resolved = resolve_model(model, config=config, seed=seed)
        cfg, params = resolved.config, resolved.params
        self.tokenizer = load_tokenizer(tokenizer or resolved.tokenizer_path)
        named = isinstance(model, str) and model in REGISTRY  # random demo weights
        if isinstance(self.tokenizer, ByteTokenizer) and cfg.vocab_size > 256 + 8 and not named:
            # A few ids past 256 are special tokens of a byte model; many are not bytes.
            warnings.warn(
                f"LLM: the model's vocabulary has {cfg.vocab_size} ids but no tokenizer was "
                "given or found next to it (tokenizer.json / tokenizer.model), so text is "
                "encoded as UTF-8 bytes (ids 0-255), which this model was not trained on. "
                "Pass tokenizer= (a tokenizer.json, tokenizer.model or their folder).",
                stacklevel=2,
            )
        batches = None
        if calibration:
            batches = [
                np.asarray([self.tokenizer.encode(c)[: cfg.max_seq_len]])
                if isinstance(c, str)
                else np.asarray(c)
                for c in calibration
            ]
        self.engine = SlotEngine(cfg, params, engine, calibration=batches)
        self.scheduler = Scheduler(
            self.engine, self.tokenizer, queue_size=queue_size, eos_ids=resolved.eos_token_ids
        )
        self.config = cfg
        self.closed = False
        self._stepping = threading.Lock()  # held by whoever steps the scheduler by hand

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> LLM:
        """Run the scheduler thread (needed for concurrent `submit` callers)."""
        self._check_open("start")
        with self._stepping:  # not while a caller is stepping it by hand
            self.scheduler.start()
        return self

    def close(self) -> None:
        """Stop the scheduler (waiting requests end ``cancelled``); later calls raise
        `ClosedError` instead of quietly stepping the scheduler. Closing twice is harmless."""
        self.closed = True
        self.scheduler.stop()

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise ClosedError(
                f"LLM.{what}: this LLM was closed (close() or the end of its with block); "
                "create a new LLM(...) to generate again."
            )

    def __enter__(self) -> LLM:
        self._check_open("__enter__")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------------- generation
    def _params(self, sampling: SamplingParams | None, fields: dict[str, Any]) -> SamplingParams:
        sampling = sampling or SamplingParams()
        return dataclasses.replace(sampling, **fields) if fields else sampling

    def generate(
        self, prompt: str | list[str], sampling: SamplingParams | None = None, **fields: Any
    ) -> Completion | list[Completion]:
        """Complete one prompt (returns a `Completion`) or several (a list, batched).

        Keyword fields override ``sampling`` (``max_tokens=32, temperature=0.8, ...``).
        Prompts are tokenized with the tokenizer's special tokens (a BOS), as transformers'
        ``tokenizer(text)`` and the server's ``/v1/completions`` do.
        """
        self._check_open("generate")
        params = self._params(sampling, fields)
        prompts = _texts(prompt)
        work = [(self._encode(p), params) for p in prompts]
        done = self._run(work)
        out = [Completion.from_request(r) for r in done]
        return out[0] if isinstance(prompt, str) else out

    def _encode(self, text: str) -> list[int]:
        # Special tokens (a Llama BOS) as transformers' tokenizer(text) and the server's
        # /v1/completions add them: without BOS such a model continues a different text.
        return self.tokenizer.encode(check_text(text), add_special_tokens=True)

    def _run(self, work: list[tuple[list[int], SamplingParams]]) -> list[Request]:
        """Submit ``work`` and wait; without the scheduler thread, step it here.

        Callers on several threads take turns stepping under ``_stepping`` (each step
        advances every caller's requests, so they still batch): two unguarded steps at
        once reused donated device buffers, failing requests and mixing up tokens.
        """
        handles = self.scheduler.submit_many(work)
        while not all(h.done for h in handles):
            with self._stepping:
                if self.scheduler.alive:  # start() ran meanwhile: its thread steps now
                    break
                if not all(h.done for h in handles):
                    self.scheduler.step()
        return [h.wait() for h in handles]

    def score(self, text: str) -> list[float]:
        """log p of each token of ``text`` given the ones before, tokenized as `generate`
        does (special tokens included; the first token has none)."""
        self._check_open("score")
        params = SamplingParams(max_tokens=0, prompt_logprobs=0)
        (r,) = self._run([(self._encode(text), params)])
        return list(r.prompt_logprobs)


def _texts(prompt: Any) -> list[str]:
    """``prompt`` as a list of texts; anything else (token ids, bytes, None) is refused
    here: the tokenizer's own error did not say what to pass."""
    if isinstance(prompt, str):
        return [prompt]
    try:
        prompts = None if isinstance(prompt, bytes) else list(prompt)
    except TypeError:
        prompts = None
    if prompts is not None and all(isinstance(p, str) for p in prompts):
        return prompts
    got = type(prompt).__name__
    if prompts is not None:
        kinds = sorted({type(p).__name__ for p in prompts if not isinstance(p, str)})
        got = f"a {got} holding {', '.join(kinds)}"
    raise RequestError(
        f"generate: the prompt must be a str or a list of str; got {got}. Pass text "
        "(token ids go through llm.scheduler.submit(ids, SamplingParams()))."
    )
