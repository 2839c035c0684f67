"""Continuous batching: a request queue, a scheduler thread and the slot bookkeeping.

Requests wait in a bounded queue (a full queue rejects at once with `QueueFullError`, so
callers can answer 429 instead of piling up work). The scheduler thread loops: it admits
waiting requests into free slots (prefill + insert), then advances every busy slot by one
decode step; a sequence that hits a stop token, a stop string, its token limit or the end
of its slot, or that was cancelled, frees its slot at once for the next request (Orca's
iteration-level scheduling, Yu et al. OSDI 2022; vLLM and JetStream work the same way).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import jaxcore as jc
from inference.engine import SlotEngine, fetch
from inference.sampling import SamplingParams
from inference.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class RequestError(jc.JaxcoreError, ValueError):
    """A request that can never run (too long for the context, empty prompt...)."""


class QueueFullError(jc.JaxcoreError, RuntimeError):
    """The waiting queue is full: retry later (HTTP 429)."""


class Request:
    """One generation request: its prompt, settings, progress and result.

    The scheduler thread appends tokens; other threads read `text`, wait with `wait()`
    or get called back through ``on_update(request, finished)`` after every token.
    """

    _ids = itertools.count()

    def __init__(
        self,
        prompt: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        on_update: Callable[[Request, bool], None] | None = None,
    ):
        self.id = next(Request._ids)
        self.prompt = list(prompt)
        self.params = params
        self.tokenizer = tokenizer
        self.on_update = on_update
        self.output: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.prompt_logprobs: list[float] = []
        self.prompt_top_logprobs: list[list[tuple[int, float]]] = []
        self.text = ""
        self.stable_len = 0  # characters of `text` that can no longer change
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.arrival = time.perf_counter()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self._cancelled = False
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

    # --------------------------------------------------------------- scheduler side
    def _add(self, token: int, logprob: float, top_ids: np.ndarray, top_lps: np.ndarray) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        p = self.params
        eos = self.tokenizer.eos_id
        if token in p.stop_token_ids or (eos is not None and token == eos and not p.ignore_eos):
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
        hold = 0
        for stop in self.params.stop:
            at = text.find(stop, max(0, self.stable_len - len(stop)))
            if at >= 0:
                self.text = text[:at]
                self.stable_len = len(self.text)
                self._finish("stop")
                return
            # Hold back a tail that could still grow into this stop string.
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for the rest
            hold = max(hold, 1)
        self.text = text
        self.stable_len = max(self.stable_len, len(text) - hold)

    def _finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.stable_len = len(self.text)
            self.finish_time = time.perf_counter()

    def _notify(self) -> None:
        if self.on_update is not None:
            try:
                self.on_update(self, self.finish_reason is not None)
            except Exception:  # a broken callback must not stop the scheduler
                log.exception("on_update callback of request %d failed", self.id)
        if self.finish_reason is not None:
            self._done.set()


class Scheduler:
    """Owns a `SlotEngine` and runs requests on it from a background thread."""

    def __init__(self, engine: SlotEngine, tokenizer: Tokenizer, *, queue_size: int = 256):
        if queue_size < 1:
            raise jc.ConfigError(f"queue_size={queue_size!r}: must be >= 1.")
        self.engine = engine
        self.tokenizer = tokenizer
        self.queue: queue.Queue[Request] = queue.Queue(maxsize=queue_size)
        self.slots: list[Request | None] = [None] * engine.config.slots
        self._seed = np.random.SeedSequence(engine.config.seed)
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # The decode step in flight and the requests its slots held when dispatched.
        self._pending: tuple[Any, list[Request | None]] | None = None
        self.stats: dict[str, float] = {
            "requests_total": 0,
            "requests_finished": 0,
            "requests_rejected": 0,
            "requests_cancelled": 0,
            "prompt_tokens_total": 0,
            "generation_tokens_total": 0,
            "decode_steps_total": 0,
            "time_to_first_token_seconds_sum": 0.0,
            "request_latency_seconds_sum": 0.0,
        }

    # --------------------------------------------------------------- public
    @property
    def max_len(self) -> int:
        return self.engine.max_len

    def start(self) -> Scheduler:
        """Start the scheduler thread (idempotent)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="inference-scheduler", daemon=True
                )
                self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still waiting or running finish as ``cancelled``."""
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def validate(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise `RequestError` for a request that can never run."""
        if not prompt:
            raise RequestError("the prompt is empty; send at least one token.")
        if len(prompt) + params.max_tokens > self.max_len:
            raise RequestError(
                f"this model's context is {self.max_len} tokens, but the prompt has "
                f"{len(prompt)} tokens and max_tokens is {params.max_tokens} "
                f"({len(prompt) + params.max_tokens} in all). Shorten the prompt or lower "
                "max_tokens."
            )
        vocab = self.engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt token ids must lie in [0, {vocab}).")

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams | None = None,
        on_update: Callable[[Request, bool], None] | None = None,
    ) -> Request:
        """Queue a request; raises `RequestError` or `QueueFullError` at once."""
        params = params or SamplingParams()
        self.validate(prompt, params)
        request = Request(prompt, params, self.tokenizer, on_update)
        try:
            self.queue.put_nowait(request)
        except queue.Full:
            self.stats["requests_rejected"] += 1
            raise QueueFullError(
                f"the request queue is full ({self.queue.maxsize} waiting); retry later."
            ) from None
        self.stats["requests_total"] += 1
        self._wakeup.set()
        return request

    def active_slots(self) -> int:
        return sum(r is not None for r in self.slots)

    # --------------------------------------------------------------- the loop
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.step()
                if not self.busy() and self.queue.empty():
                    self._wakeup.wait(0.05)
                    self._wakeup.clear()
        except BaseException as e:  # fail every request rather than hang their callers
            log.exception("scheduler stopped on an error")
            self._fail_all(e)
            raise
        self._fail_all(None)

    def step(self) -> None:
        """One scheduler iteration: drop cancelled, admit into free slots, then dispatch a
        decode step and, while it runs, hand out the tokens of the previous one.

        Overlapping host work with the device is what makes the loop pipelined (JetStream's
        detokenizing thread serves the same purpose); a slot that finished in the previous
        step computes one extra token in the step already dispatched, which is dropped.
        """
        for i, r in enumerate(self.slots):
            if r is not None and r.cancelled:
                r._finish("cancelled")
                self.stats["requests_cancelled"] += 1
                self._release(i)
        for i in range(len(self.slots)):
            if self.slots[i] is None:
                request = self._next_request()
                if request is None:
                    break
                self._admit(i, request)
        active = np.array([r is not None for r in self.slots])
        pending, self._pending = self._pending, None
        if active.any():
            self._pending = (self.engine.decode_async(active), list(self.slots))
            self.stats["decode_steps_total"] += 1
        if pending is not None:
            self._deliver(*pending)

    def busy(self) -> bool:
        """Whether any slot is generating or a decode step is still in flight."""
        return self._pending is not None or self.active_slots() > 0

    def _deliver(self, out: Any, holders: list[Request | None]) -> None:
        out = fetch(out)
        for i, r in enumerate(holders):
            if r is None or r.finish_reason is not None or self.slots[i] is not r:
                continue  # the slot was free, or its request ended before this step
            self._add(
                r, int(out.tokens[i]), float(out.logprobs[i]), out.top_ids[i], out.top_logprobs[i]
            )
            self.stats["generation_tokens_total"] += 1
            if r.finish_reason is None and len(r.prompt) + len(r.output) >= self.max_len:
                r._finish("length")
            if r.finish_reason is not None:
                self._release(i)
            else:
                r._notify()

    @staticmethod
    def _add(r: Request, *token: Any) -> None:
        # A failure that belongs to one request (its tokenizer, its stop strings) fails
        # that request only; the scheduler thread keeps serving the others.
        try:
            r._add(*token)
        except Exception as e:
            log.exception("request %d failed while adding a token", r.id)
            r.error = e
            r._finish("error")

    def _next_request(self) -> Request | None:
        while True:
            try:
                request = self.queue.get_nowait()
            except queue.Empty:
                return None
            if not request.cancelled:
                return request
            request._finish("cancelled")
            self.stats["requests_cancelled"] += 1
            request._notify()

    def _key(self, params: SamplingParams) -> np.ndarray:
        seed = (
            params.seed
            if params.seed is not None
            else int(self._seed.spawn(1)[0].generate_state(1)[0])
        )
        return np.asarray([0, seed & 0xFFFFFFFF], np.uint32)

    def _admit(self, slot: int, r: Request) -> None:
        p = r.params
        try:
            out = self.engine.prefill(
                slot,
                r.prompt,
                key=self._key(p),
                temperature=p.temperature,
                top_k=p.top_k,
                top_p=p.top_p,
            )
        except Exception as e:
            r.error = e
            r._finish("error")
            r._notify()
            return
        self.stats["prompt_tokens_total"] += len(r.prompt)
        if p.prompt_logprobs:
            r.prompt_logprobs = out.prompt_logprobs.tolist()
            n = p.logprobs or 0
            r.prompt_top_logprobs = [
                list(zip(ids[:n].tolist(), lps[:n].tolist(), strict=True))
                for ids, lps in zip(out.prompt_top_ids, out.prompt_top_logprobs, strict=True)
            ]
        if p.max_tokens == 0:
            r.first_token_time = time.perf_counter()
            r._finish("length")
        else:
            self._add(r, out.token, out.logprob, out.top_ids, out.top_logprobs)
            self.stats["generation_tokens_total"] += 1
        self.slots[slot] = r
        if r.finish_reason is not None:
            self._release(slot)
        else:
            r._notify()

    def _release(self, slot: int) -> None:
        r = self.slots[slot]
        self.slots[slot] = None
        if r is None:
            return
        self.stats["requests_finished"] += 1
        if r.first_token_time is not None:
            self.stats["time_to_first_token_seconds_sum"] += r.first_token_time - r.arrival
        self.stats["request_latency_seconds_sum"] += time.perf_counter() - r.arrival
        r._notify()

    def _fail_all(self, error: BaseException | None) -> None:
        pending = [r for r in self.slots if r is not None]
        self.slots = [None] * len(self.slots)
        self._pending = None
        while True:
            try:
                pending.append(self.queue.get_nowait())
            except queue.Empty:
                break
        for r in pending:
            r.error = error
            r._finish("cancelled" if error is None else "error")
            r._notify()


def run_to_completion(
    scheduler: Scheduler, requests: list[tuple[list[int], SamplingParams]]
) -> list[Any]:
    """Run requests on a scheduler without its thread (notebooks, tests): step until done."""
    handles = [scheduler.submit(p, s) for p, s in requests]
    while not all(h.done for h in handles):
        scheduler.step()
    return [h.wait() for h in handles]
