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
from inference.sampling import SamplingParams, check_sampling_keywords
from inference.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from inference.weights import REGISTRY, resolve_model
from jaxcore.models import TransformerConfig

# One prompt: a text, token ids, or vLLM's {"prompt_token_ids": ids} / {"prompt": text}.
Prompt = str | list[int] | dict[str, Any]


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
        quantize = (engine or ServingConfig()).quantize
        if calibration and quantize != "int8-smooth":  # it was dropped without a word
            raise jc.ConfigError(
                f"LLM: calibration= sets SmoothQuant scales, which only "
                f"ServingConfig(quantize='int8-smooth') uses; with quantize={quantize!r} it "
                "would be ignored. Drop it, or ask for quantize='int8-smooth'."
            )
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
        if not isinstance(sampling, SamplingParams):
            raise jc.ConfigError(
                f"LLM.generate: sampling must be a SamplingParams (or a list of them, one per "
                f"prompt); got {type(sampling).__name__}."
            )
        check_sampling_keywords("LLM.generate", fields)
        return dataclasses.replace(sampling, **fields) if fields else sampling

    def _params_each(
        self, sampling: SamplingParams | list[SamplingParams] | None, fields: dict[str, Any], n: int
    ) -> list[SamplingParams]:
        """One `SamplingParams` per prompt: ``sampling`` for all, or a list of ``n`` (as
        vLLM's ``LLM.generate`` takes), each with ``fields`` applied."""
        if not isinstance(sampling, list | tuple):
            return [self._params(sampling, fields)] * n
        if len(sampling) != n:
            raise jc.ConfigError(
                f"LLM.generate: {len(sampling)} SamplingParams for {n} prompts; pass one "
                "SamplingParams, or a list with one per prompt."
            )
        return [self._params(s, fields) for s in sampling]

    def generate(
        self,
        prompt: Prompt | list[Prompt],
        sampling: SamplingParams | list[SamplingParams] | None = None,
        **fields: Any,
    ) -> Completion | list[Completion]:
        """Complete one prompt (returns a `Completion`) or several (a list, batched).

        A prompt is a text, a list of token ids, or vLLM's ``{"prompt_token_ids": ids}`` /
        ``{"prompt": text}``; a list of those is a batch (text and ids may be mixed, as in
        vLLM's ``LLM.generate``). ``sampling`` is one `SamplingParams` for all prompts or a
        list with one per prompt (vLLM's rule); keyword fields override it (``max_tokens=32,
        temperature=0.8, ...``). Texts are tokenized with the tokenizer's special tokens
        (a BOS), as transformers' ``tokenizer(text)`` and the server's ``/v1/completions``
        do; token ids are used as given.
        """
        self._check_open("generate")
        prompts, single = _prompts(prompt, "generate")
        params = self._params_each(sampling, fields, len(prompts))
        work = [(self._tokens(p), s) for p, s in zip(prompts, params, strict=True)]
        done = self._run(work)
        out = [Completion.from_request(r) for r in done]
        return out[0] if single else out

    def _tokens(self, prompt: str | list[int]) -> list[int]:
        # Special tokens (a Llama BOS) as transformers' tokenizer(text) and the server's
        # /v1/completions add them: without BOS such a model continues a different text.
        # Token ids are the user's own tokenization: used as given (vLLM's TokensPrompt).
        if isinstance(prompt, str):
            return self.tokenizer.encode(check_text(prompt), add_special_tokens=True)
        return prompt

    def _run(self, work: list[tuple[list[int], SamplingParams]]) -> list[Request]:
        """Submit ``work`` and wait; without the scheduler thread, step it here.

        Callers on several threads take turns stepping under ``_stepping`` (each step
        advances every caller's requests, so they still batch): two unguarded steps at
        once reused donated device buffers, failing requests and mixing up tokens.
        `close()` meanwhile cancels what is left (it ran every request to its end).
        """
        handles = self.scheduler.submit_many(work)
        while not all(h.done for h in handles):
            with self._stepping:
                if self.scheduler.alive:  # start() ran meanwhile: its thread steps now
                    break
                if self.closed:  # close() on another thread: the rest end cancelled, as
                    for h in handles:  # the scheduler thread's stop() ends them
                        h.cancel()
                if not all(h.done for h in handles):
                    self.scheduler.step()
        return [h.wait() for h in handles]

    def score(self, text: Prompt | list[Prompt]) -> list[float] | list[list[float]]:
        """log p of each token of a prompt given the ones before (the first token has
        none): a text, tokenized as `generate` does (special tokens included), or token
        ids as given. A list of prompts (as `generate` takes) gives one list per prompt."""
        self._check_open("score")
        prompts, single = _prompts(text, "score")
        params = SamplingParams(max_tokens=0, prompt_logprobs=0)
        done = self._run([(self._tokens(p), params) for p in prompts])
        scores = [list(r.prompt_logprobs) for r in done]
        return scores[0] if single else scores


def _ids(prompt: Any) -> list[int] | None:
    """``prompt`` as token ids if it is a non-empty sequence of integers (a list, tuple or
    1-D NumPy array; ``bool`` is not an id), else ``None``."""
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer) or not prompt.size:
            return None
        return prompt.tolist()
    if not isinstance(prompt, list | tuple) or not prompt:
        return None
    if all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in prompt):
        return [int(t) for t in prompt]
    return None


def _one(prompt: Any, what: str) -> str | list[int] | None:
    """One prompt as a text or token ids (``None``: neither). vLLM's TextPrompt /
    TokensPrompt dicts are taken; a dict with neither key is refused here."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            # An empty id list reaches the scheduler, whose error says the prompt is empty.
            return [] if isinstance(ids, list | tuple) and not ids else _ids(ids)
        if isinstance(prompt.get("prompt"), str):
            return prompt["prompt"]
        raise RequestError(
            f"{what}: a dict prompt needs 'prompt_token_ids' (a list of token ids) or "
            f"'prompt' (a str), as vLLM's TokensPrompt / TextPrompt; got keys {sorted(prompt)}."
        )
    if isinstance(prompt, str):
        return prompt
    return _ids(prompt)


def _prompts(prompt: Any, what: str) -> tuple[list[str | list[int]], bool]:
    """``prompt`` as a list of texts / token-id lists, and whether it was one prompt.

    As vLLM parses prompts: a str, a list of ints or a dict is one prompt; a list of
    those (or a 2-D integer array) is a batch, ``[]`` an empty one. Anything else (bytes,
    None, floats, a batch holding a bare int) is refused here: the tokenizer's own error
    did not say what to pass.
    """
    one = _one(prompt, what)
    if one is not None:
        return [one], True
    if isinstance(prompt, np.ndarray) and prompt.ndim == 2:
        prompt = list(prompt)
    elif not isinstance(prompt, str | bytes | dict | list | tuple | np.ndarray):
        try:  # any other iterable (a generator of texts) is read once, as list() would
            return _prompts(list(prompt), what)
        except TypeError:
            pass
    if isinstance(prompt, list | tuple):
        # An empty id list in a batch reaches the scheduler, which says the prompt is empty.
        batch = [[] if isinstance(p, list | tuple) and not p else _one(p, what) for p in prompt]
        if all(p is not None for p in batch):
            return batch, False
        bad = [p for p, got in zip(prompt, batch, strict=True) if got is None]
        got = f"a {type(prompt).__name__} holding {_kinds(bad)}"
    else:
        got = type(prompt).__name__
    raise RequestError(
        f"{what}: the prompt must be a str, a list of token ids (ints), or a list of str / "
        f"token-id lists (vLLM's {{'prompt_token_ids': ids}} works too); got {got}."
        + (" Decode bytes to str first." if "bytes" in got else "")
    )


def _kinds(items: list[Any]) -> str:
    return ", ".join(sorted({type(p).__name__ for p in items}))
