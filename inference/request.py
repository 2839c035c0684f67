"""`Request`: one generation's prompt, settings, progress and result, shared between the
scheduler thread (which appends tokens) and the caller (which waits or is called back).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

import jaxcore as jc
from inference.sampling import SamplingParams
from inference.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class RequestError(jc.JaxcoreError, ValueError):
    """A request that can never run (too long for the context, empty prompt...).

    ``code`` is the OpenAI error code the server answers with, ``param`` the request
    field at fault.
    """

    def __init__(self, message: str, *, code: str = "invalid_prompt", param: str = "prompt"):
        super().__init__(message)
        self.code = code
        self.param = param


def check_text(text: str, param: str = "prompt") -> str:
    """``text``, if it is valid Unicode; else a `RequestError` naming ``param``. JSON's
    ``"\\ud800"`` and Python strings allow a lone UTF-16 surrogate, which no tokenizer can
    encode (it failed with a TypeError: a 500 from the server)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(
            f"the {param} holds a lone UTF-16 surrogate ({text[e.start]!r} at character "
            f"{e.start}), which is not valid Unicode; send a whole surrogate pair (one "
            "character) or UTF-8 text.",
            code="invalid_text",
            param=param,
        ) from None
    return text


class QueueFullError(jc.JaxcoreError, RuntimeError):
    """The waiting queue is full: retry later (HTTP 429)."""


Alternatives = list[tuple[int, float]]


class Request:
    """One generation request: its prompt, settings, progress and result.

    The scheduler thread appends tokens; other threads read `text`, wait with `wait()`
    or get called back through ``on_update(request, finished)`` after every token.
    ``done`` is already true when the final callback runs, so a waiter woken by it
    always sees the end. ``eos_ids`` are the ids that end it unless ``ignore_eos``
    (``None``: the tokenizer's EOS).
    """

    _ids = itertools.count()

    def __init__(
        self,
        prompt: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        on_update: Callable[[Request, bool], None] | None = None,
        *,
        eos_ids: Sequence[int] | None = None,
    ):
        self.id = next(Request._ids)
        self.prompt = list(prompt)
        self.params = params
        self.tokenizer = tokenizer
        self.on_update = on_update
        if eos_ids is None:
            eos_ids = () if tokenizer.eos_id is None else (tokenizer.eos_id,)
        self.eos_ids = tuple(eos_ids)
        self.output: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[Alternatives] = []
        self.prompt_logprobs: list[float] = []
        self.prompt_ranks: list[int] = []
        self.prompt_top_logprobs: list[Alternatives] = []
        self.text = ""
        self.stable_len = 0  # characters of `text` that can no longer change
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token or string that matched
        self.error: BaseException | None = None
        self.arrival = time.perf_counter()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self._cancelled = False
        self._stop_ids: tuple[int, ...] | None = None
        self._done = threading.Event()

    # --------------------------------------------------------------- caller side
    def cancel(self) -> None:
        """Stop generating; the slot is freed at the scheduler's next iteration."""
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Request:
        """Block until finished; re-raise a scheduler error that hit this request."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} not finished after {timeout} s")
        if self.error is not None:
            raise self.error
        return self

    def cumulative_logprob(self) -> float:
        return float(sum(self.logprobs))

    # --------------------------------------------------------------- scheduler side
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end this request: its stop tokens, and the EOS ids unless ignored."""
        if self._stop_ids is None:  # asked once per generated token: computed once
            extra = () if self.params.ignore_eos else self.eos_ids
            self._stop_ids = tuple(dict.fromkeys((*self.params.stop_token_ids, *extra)))
        return self._stop_ids

    def _add(self, token: int, logprob: float, top_ids: np.ndarray, top_lps: np.ndarray) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        p = self.params
        if token in self.stop_ids() and len(self.output) >= p.min_tokens:
            self.stop_reason = token if token in p.stop_token_ids else None
            self._finish("stop")
            return
        self.output.append(token)
        self.logprobs.append(logprob)
        if p.logprobs:
            n = p.logprobs
            self.top_logprobs.append(
                list(zip(top_ids[:n].tolist(), top_lps[:n].tolist(), strict=True))
            )
        self._update_text()
        if self.finish_reason is None and len(self.output) >= p.max_tokens:
            self._finish("length")

    def _update_text(self) -> None:
        text = self.tokenizer.decode(self.output)
        # An incomplete UTF-8 character at the end: wait for the rest. Hold every trailing
        # U+FFFD: byte-fallback decoders (SentencePiece) give one per byte until it is
        # complete. Stop strings are looked for in whole characters only: a stop holding
        # U+FFFD matched one the next token turned into "\u00e9", and ended the request on
        # text it never returned (vLLM's detokenizer likewise holds a trailing U+FFFD).
        hold = len(text) - len(text.rstrip("\ufffd"))
        whole = text[: len(text) - hold]
        for stop in self.params.stop:
            at = whole.find(stop, max(0, self.stable_len - len(stop)))
            if at >= 0:
                keep = at + len(stop) if self.params.include_stop_str_in_output else at
                self.text = text[:keep]
                self.stable_len = len(self.text)
                self.stop_reason = stop
                self._finish("stop")
                return
            # Hold back a tail that could still grow into this stop string.
            for k in range(min(len(stop) - 1, len(whole)), 0, -1):
                if whole.endswith(stop[:k]):
                    hold = max(hold, len(text) - len(whole) + k)
                    break
        self.text = text
        self.stable_len = max(self.stable_len, len(text) - hold)

    def _finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.stable_len = len(self.text)
            self.finish_time = time.perf_counter()

    def _notify(self) -> None:
        # Mark done *before* waking anyone: a waiter that checks `done` between the
        # callback and the flag would otherwise sleep forever (it was the cause of a
        # 10-minute hang).
        finished = self.finish_reason is not None
        if finished:
            self._done.set()
        if self.on_update is not None:
            try:
                self.on_update(self, finished)
            except Exception:  # a broken callback must not stop the scheduler
                log.exception("on_update callback of request %d failed", self.id)
