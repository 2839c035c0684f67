"""Continuous batching: a request queue, a scheduler thread and the slot bookkeeping.

Requests wait in a bounded queue (a full queue rejects at once with `QueueFullError`, so
callers can answer 429 instead of piling up work). The scheduler thread loops: it admits
waiting requests into free slots (prefill + insert), then advances every busy slot by a
multi-step decode dispatch; a sequence that hits a stop token, a stop string, its token
limit or the end of its slot, or that was cancelled, frees its slot for the next request
(Orca's iteration-level scheduling, Yu et al. OSDI 2022; vLLM and JetStream work the
same way).

The loop is pipelined: an iteration dispatches this round's prefills and decode first,
then hands out the previous round's tokens while the device computes, so the host's
detokenizing, stop-string checks and callbacks overlap the device's work.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import jaxcore as jc
from inference.engine import SlotEngine, SlotSettings, fetch, fetch_prefill
from inference.paging import PagePool, PromptScores, Reservation
from inference.request import QueueFullError, Request, RequestError
from inference.sampling import SamplingParams
from inference.tokenizer import Tokenizer

log = logging.getLogger(__name__)

__all__ = ["QueueFullError", "Request", "RequestError", "Scheduler", "run_to_completion"]

# Latency histogram bucket bounds in seconds (Prometheus ``le`` labels).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self.bounds, value))] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count of observations <= le)`` pairs, ending with ``+Inf``."""
        running, out = 0, []
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


def _eos_ids(tokenizer: Tokenizer, model_ids: Sequence[int], vocab: int) -> tuple[int, ...]:
    """The tokenizer's EOS and the model's (its generation config's), as transformers'
    ``generate`` stops at any of them; a model id outside the vocabulary is a config
    error (it would fail every dispatch)."""
    bad = [t for t in model_ids if not 0 <= t < vocab]
    if bad:
        raise jc.ConfigError(
            f"end-of-sequence ids {bad} are outside this model's vocabulary [0, {vocab}); "
            "correct eos_token_id in its generation_config.json (or config.json)."
        )
    own = () if tokenizer.eos_id is None else (tokenizer.eos_id,)
    return tuple(dict.fromkeys((*own, *model_ids)))


class Scheduler:
    """Owns a `SlotEngine` and runs requests on it from a background thread.

    ``eos_ids``: the model's end-of-sequence ids (a Hugging Face ``generation_config.json``
    may list several); they end a request as the tokenizer's EOS does.
    """

    def __init__(
        self,
        engine: SlotEngine,
        tokenizer: Tokenizer,
        *,
        queue_size: int = 256,
        eos_ids: Sequence[int] = (),
    ):
        if queue_size < 1:
            raise jc.ConfigError(f"queue_size={queue_size!r}: must be >= 1.")
        self.engine = engine
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(tokenizer, eos_ids, engine.model_config.vocab_size)
        self.queue_size = queue_size
        self._queue: collections.deque[Request] = collections.deque()
        self._queue_lock = threading.Lock()
        self.slots: list[Request | None] = [None] * engine.config.slots
        self.pool: PagePool | None = None
        if engine.paged:
            self.pool = PagePool(
                engine.num_pages,
                engine.config.page_size,
                engine.pages_per_slot,
                prefix_caching=engine.config.prefix_caching,
            )
        self._reserved: list[Reservation | None] = [None] * engine.config.slots
        # Per slot: tokens its dispatches can have produced so far (prefill's one, plus
        # decode_steps per decode dispatch it was active in) and the most it can produce.
        self._issued = [0] * engine.config.slots
        self._needed = [0] * engine.config.slots
        # Keys of requests without a seed: drawn from the engine's seed (a Generator draw
        # is microseconds; spawning a SeedSequence per request took milliseconds).
        self._seeds = np.random.default_rng(engine.config.seed)
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # What ended the thread, if an error did: the server's 503 names it.
        self.failure: BaseException | None = None
        self._lock = threading.Lock()
        # Dispatched but not yet delivered: ("prefill" | "decode", device outputs, holders).
        self._inflight: list[tuple[str, Any, Any]] = []
        self.stats: dict[str, float] = {
            "requests_total": 0,
            "requests_finished": 0,
            "requests_rejected": 0,
            "requests_cancelled": 0,
            "requests_failed": 0,
            "prompt_tokens_total": 0,
            "prefill_tokens_computed_total": 0,
            "prefix_cache_hit_tokens_total": 0,
            "generation_tokens_total": 0,
            "decode_steps_total": 0,
            "decode_dispatches_total": 0,
        }
        self.histograms = {
            "time_to_first_token_seconds": Histogram(),
            "request_latency_seconds": Histogram(),
            "time_per_output_token_seconds": Histogram(
                (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
            ),
        }

    # --------------------------------------------------------------- public
    @property
    def max_len(self) -> int:
        return self.engine.max_len

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def queue_depth(self) -> int:
        return len(self._queue)

    def start(self) -> Scheduler:
        """Start the scheduler thread (idempotent)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self.failure = None
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
        vocab = self.engine.model_config.vocab_size
        bad = [t for t in prompt if not (isinstance(t, int | np.integer) and 0 <= t < vocab)]
        if bad:
            raise RequestError(
                f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}.",
                code="invalid_token_id",
            )
        bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad:  # a NumPy index: 256 failed the prefill, -1 silently stopped on token 255
            raise RequestError(
                f"stop_token_ids must be token ids in [0, {vocab}) (this model's vocabulary); "
                f"got {bad[:5]}. Remove or correct them.",
                code="invalid_stop_token_id",
                param="stop_token_ids",
            )
        bad = [t for t, _ in params.logit_bias if t >= vocab]
        if bad:
            raise RequestError(
                f"logit_bias keys must be token ids in [0, {vocab}) (this model's "
                f"vocabulary); got {bad[:5]}. Remove or correct them.",
                code="invalid_logit_bias",
                param="logit_bias",
            )
        if len(prompt) + params.max_tokens > self.max_len:
            raise RequestError(
                f"this model's context is {self.max_len} tokens, but the prompt has "
                f"{len(prompt)} tokens and max_tokens is {params.max_tokens} "
                f"({len(prompt) + params.max_tokens} in all). Shorten the prompt or lower "
                "max_tokens.",
                code="context_length_exceeded",
            )
        largest = self.engine.buckets[-1]
        if len(prompt) > largest:  # it was admitted, then failed in its prefill (a 500)
            raise RequestError(
                f"the prompt has {len(prompt)} tokens but the largest prefill bucket is "
                f"{largest} (the buckets are {self.engine.buckets}, from "
                "ServingConfig.prefill_buckets). Shorten the prompt, or serve with a "
                f"bucket of at least {len(prompt)} (prefill_buckets=None: powers of two up "
                f"to max_len={self.max_len}).",
                code="context_length_exceeded",
            )
        if self.pool is not None:
            total = min(len(prompt) + max(params.max_tokens, 1), self.max_len)
            pages = -(-total // self.pool.page_size)
            if pages > self.pool.total:
                raise RequestError(
                    f"this request needs {pages} KV-cache pages but the pool holds "
                    f"{self.pool.total}; lower max_tokens or serve with more pages.",
                    code="context_length_exceeded",
                )

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams | None = None,
        on_update: Callable[[Request, bool], None] | None = None,
    ) -> Request:
        """Queue a request; raises `RequestError` or `QueueFullError` at once."""
        (request,) = self.submit_many([(prompt, params or SamplingParams())], on_update)
        return request

    def submit_many(
        self,
        work: Sequence[tuple[list[int], SamplingParams]],
        on_update: Callable[[Request, bool], None] | None = None,
    ) -> list[Request]:
        """Queue several requests all or none (one HTTP request with several prompts).

        A group larger than the whole queue is still taken when the queue is empty:
        otherwise it could never run and retrying would never succeed.
        """
        for prompt, params in work:
            self.validate(prompt, params)
        requests = [Request(p, s, self.tokenizer, on_update, eos_ids=self.eos_ids) for p, s in work]
        with self._queue_lock:
            waiting = len(self._queue)
            if waiting and waiting + len(requests) > self.queue_size:
                self.stats["requests_rejected"] += len(requests)
                raise QueueFullError(
                    f"the request queue is full ({waiting} of {self.queue_size} waiting, "
                    f"{len(requests)} more asked); retry later."
                )
            self._queue.extend(requests)
            self.stats["requests_total"] += len(requests)
        self._wakeup.set()
        return requests

    def active_slots(self) -> int:
        return sum(r is not None for r in self.slots)

    # --------------------------------------------------------------- the loop
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.step()
                if not self.busy() and not self._queue:
                    self._wakeup.wait(0.05)
                    self._wakeup.clear()
        except BaseException as e:  # fail every request rather than hang their callers
            log.exception("scheduler stopped on an error")
            self.failure = e
            self._fail_all(e)
            raise
        self._fail_all(None)

    def step(self) -> None:
        """One scheduler iteration: drop cancelled, dispatch prefills into free slots and
        one multi-step decode, then hand out what the previous iteration dispatched.

        A slot that finished in the previous iteration computes extra tokens in the
        dispatch already under way; they are dropped.
        """
        for i, r in enumerate(self.slots):
            if r is not None and r.cancelled:
                r._finish("cancelled")
                self.stats["requests_cancelled"] += 1
                self._release(i)
        previous, self._inflight = self._inflight, []
        for i in range(len(self.slots)):
            if self.slots[i] is None:
                request = self._next_request()
                if request is None:
                    break
                if not self._admit(i, request):  # no pages free: it waits at the head
                    with self._queue_lock:
                        self._queue.appendleft(request)
                    break
        # A slot whose dispatched tokens already reach its limit (max_tokens or the end of
        # its context) sits this dispatch out, and with none left the dispatch is skipped:
        # otherwise every wave ended with a whole K-step dispatch computed and dropped.
        active = np.array(
            [r is not None and self._issued[i] < self._needed[i] for i, r in enumerate(self.slots)]
        )
        if active.any():
            greedy = all(_greedy(r.params) for r, on in zip(self.slots, active, strict=True) if on)
            out = self.engine.decode_async(active, greedy=greedy)
            self._inflight.append(("decode", out, list(self.slots)))
            steps = self.engine.config.decode_steps
            for i in np.flatnonzero(active):
                self._issued[i] += steps
            self.stats["decode_dispatches_total"] += 1
            self.stats["decode_steps_total"] += steps
        for kind, out, holders in previous:
            if kind == "prefill":
                self._deliver_prefill(out, holders)
            else:
                self._deliver_decode(out, holders)

    def busy(self) -> bool:
        """Whether any slot is generating or a dispatch is still to be delivered."""
        return bool(self._inflight) or self.active_slots() > 0

    def _holds(self, slot: int, r: Request) -> bool:
        return self.slots[slot] is r and r.finish_reason is None

    def _deliver_decode(self, out: Any, holders: list[Request | None]) -> None:
        out = fetch(out)
        # Python lists once per dispatch: indexing NumPy arrays per token cost more.
        tokens, logprobs, emitted = out.tokens.tolist(), out.logprobs.tolist(), out.emitted.tolist()
        for step in range(len(tokens)):
            for i, r in enumerate(holders):
                if r is None or not emitted[step][i] or not self._holds(i, r):
                    continue  # the slot was free, stopped, or its request ended before
                self._add(r, tokens[step][i], logprobs[step][i], out, (step, i))
                self._after_token(i, r)
        for i, r in enumerate(holders):
            if r is not None and self._holds(i, r):
                r._notify()

    def _deliver_prefill(self, out: Any, holder: tuple[int, Request, Reservation | None]) -> None:
        slot, r, reservation = holder
        try:
            first = fetch_prefill(out)
        except Exception as e:
            self._fail(slot, r, e)
            return
        scores = self._prompt_scores(first, reservation)
        if not self._holds(slot, r):
            return
        p = r.params
        if p.prompt_logprobs is not None:
            n = p.prompt_logprobs
            r.prompt_logprobs = scores.logprobs[1:].tolist()
            r.prompt_ranks = scores.ranks[1:].tolist()
            r.prompt_top_logprobs = [
                list(zip(ids[:n].tolist(), lps[:n].tolist(), strict=True))
                for ids, lps in zip(scores.top_ids[1:], scores.top_logprobs[1:], strict=True)
            ]
        if p.max_tokens == 0:
            r.first_token_time = time.perf_counter()
            r._finish("length")
        else:
            single = _Single(first)
            self._add(r, first.token, first.logprob, single, None)
        self._after_token(slot, r)
        if self._holds(slot, r):
            r._notify()

    def _prompt_scores(self, first: Any, reservation: Reservation | None) -> PromptScores:
        """Scores of every prompt position: the cached head (when the request asked for
        them) and the computed rest; the full blocks among them go into the cache."""
        computed = PromptScores(
            first.prompt_logprobs,
            first.prompt_ranks,
            first.prompt_top_ids,
            first.prompt_top_logprobs,
        )
        start = reservation.cached_tokens if reservation is not None else 0
        head = reservation.scores if reservation is not None else None
        if head is None:  # unknown positions 0 .. start (position 0 never has a score)
            head = PromptScores(
                np.zeros(start + 1, np.float32),
                np.zeros(start + 1, np.int32),
                np.zeros((start + 1, *computed.top_ids.shape[1:]), np.int32),
                np.zeros((start + 1, *computed.top_logprobs.shape[1:]), np.float32),
            )
            known_from = start + 1 if start else 1
        else:
            known_from = 1
        scores = PromptScores.concat([head, computed])
        if reservation is not None and self.pool is not None:
            self.pool.store_scores(reservation.hashes, scores, known_from)
        return scores

    def _after_token(self, slot: int, r: Request) -> None:
        if r.finish_reason is None and len(r.prompt) + len(r.output) >= self.max_len:
            r._finish("length")
        if r.finish_reason is not None:
            self._release(slot)

    def _add(self, r: Request, token: Any, logprob: Any, out: Any, at: Any) -> None:
        # A failure that belongs to one request (its tokenizer, its stop strings) fails
        # that request only; the scheduler thread keeps serving the others.
        try:
            top_ids, top_lps = out.top_ids, out.top_logprobs
            if at is not None and r.params.logprobs:  # alternatives only when reported
                top_ids, top_lps = top_ids[at], top_lps[at]
            r._add(int(token), float(logprob), top_ids, top_lps)
            self.stats["generation_tokens_total"] += 1
        except Exception as e:
            log.exception("request %d failed while adding a token", r.id)
            r.error = e
            r._finish("error")
            self.stats["requests_failed"] += 1

    def _fail(self, slot: int, r: Request, error: BaseException) -> None:
        log.error("request %d failed: %s", r.id, error)
        r.error = error
        r._finish("error")
        self.stats["requests_failed"] += 1
        if self.slots[slot] is r:
            self._release(slot)
        else:
            r._notify()

    def _next_request(self) -> Request | None:
        while True:
            with self._queue_lock:
                if not self._queue:
                    return None
                request = self._queue.popleft()
            if not request.cancelled:
                return request
            request._finish("cancelled")
            self.stats["requests_cancelled"] += 1
            request._notify()

    def _key(self, params: SamplingParams) -> np.ndarray:
        """The request's key data: both 32-bit words of its seed (modulo 2**64), so seeds
        that differ past the low 32 bits (2**32 and 0) draw different tokens."""
        seed = params.seed if params.seed is not None else int(self._seeds.integers(0, 2**32))
        seed %= 2**64
        return np.asarray([seed >> 32, seed & 0xFFFFFFFF], np.uint32)

    def _admit(self, slot: int, r: Request) -> bool:
        """Dispatch ``r``'s prefill into ``slot``; False when the paged cache lacks pages."""
        p = r.params
        start, table, copy, reservation = 0, None, None, None
        if self.pool is not None:
            total = min(len(r.prompt) + max(p.max_tokens, 1), self.max_len)
            # Prompt log-probs come from cached blocks' scores plus the recomputed rest.
            reservation = self.pool.reserve(
                r.prompt, total, use_cache=True, scores=p.prompt_logprobs is not None
            )
            if reservation is None:
                return False
            self._reserved[slot] = reservation
            start, table, copy = reservation.cached_tokens, reservation.table, reservation.copy
        settings = SlotSettings(
            key=self._key(p),
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            repetition=p.repetition_penalty,
            presence=p.presence_penalty,
            frequency=p.frequency_penalty,
            stop_ids=r.stop_ids(),
            bias=p.logit_bias,
        )
        try:
            out = self.engine.prefill_async(
                slot, r.prompt, settings, start=start, pages=table, copy=copy
            )
        except Exception as e:
            log.error("request %d failed in its prefill: %s", r.id, e)
            self._unreserve(slot)
            r.error = e
            r._finish("error")
            self.stats["requests_failed"] += 1
            r._notify()
            return True
        self.stats["prompt_tokens_total"] += len(r.prompt)
        self.stats["prefill_tokens_computed_total"] += len(r.prompt) - start
        self.stats["prefix_cache_hit_tokens_total"] += start
        self.slots[slot] = r
        self._issued[slot] = 1
        self._needed[slot] = min(p.max_tokens, self.max_len - len(r.prompt))
        self._inflight.append(("prefill", out, (slot, r, reservation)))
        return True

    def _unreserve(self, slot: int) -> None:
        reservation, self._reserved[slot] = self._reserved[slot], None
        if reservation is not None and self.pool is not None:
            self.pool.release(reservation)

    def _release(self, slot: int) -> None:
        r = self.slots[slot]
        self.slots[slot] = None
        self._unreserve(slot)
        if r is None:
            return
        self.stats["requests_finished"] += 1
        now = time.perf_counter()
        h = self.histograms
        if r.first_token_time is not None:
            h["time_to_first_token_seconds"].observe(r.first_token_time - r.arrival)
            if len(r.output) > 1:
                per_token = (now - r.first_token_time) / (len(r.output) - 1)
                h["time_per_output_token_seconds"].observe(per_token)
        h["request_latency_seconds"].observe(now - r.arrival)
        r._notify()

    def _fail_all(self, error: BaseException | None) -> None:
        pending = [r for r in self.slots if r is not None]
        self.slots = [None] * len(self.slots)
        for slot in range(len(self.slots)):
            self._unreserve(slot)
        self._inflight = []
        with self._queue_lock:
            pending.extend(self._queue)
            self._queue.clear()
        for r in pending:
            r.error = error
            r._finish("cancelled" if error is None else "error")
            if error is not None:
                self.stats["requests_failed"] += 1
            r._notify()


def _greedy(p: SamplingParams) -> bool:
    """Whether a request can take the engine's greedy decode path: argmax, neutral
    penalties, no logit bias, no reported alternatives (the chosen token's log-prob is
    still there)."""
    return (
        p.temperature == 0
        and not p.logit_bias
        and p.repetition_penalty == 1
        and p.presence_penalty == 0
        and p.frequency_penalty == 0
        and not p.logprobs
    )


class _Single:
    """A prefill's first-token alternatives in the shape `Scheduler._add` reads."""

    def __init__(self, first: Any):
        self.top_ids = first.top_ids
        self.top_logprobs = first.top_logprobs


def run_to_completion(
    scheduler: Scheduler, requests: list[tuple[list[int], SamplingParams]]
) -> list[Any]:
    """Run requests on a scheduler without its thread (notebooks, tests): step until done."""
    handles = scheduler.submit_many(requests)
    while not all(h.done for h in handles):
        scheduler.step()
    return [h.wait() for h in handles]
