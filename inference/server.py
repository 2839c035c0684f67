"""An OpenAI-compatible HTTP server (FastAPI + uvicorn) over the continuous-batching engine.

Endpoints: ``/v1/completions`` (``echo``, ``logprobs``, ``n``, ``best_of`` and vLLM's
sampling extensions), ``/v1/chat/completions`` (the model's own Jinja chat template when
its tokenizer has one), ``/v1/models`` (with ``max_model_len``), vLLM's ``/tokenize``,
``/detokenize`` (and ``/tokenizer_info`` when enabled), server-sent-event streaming
(log-probs and echo included), ``/health`` and ``/metrics`` (Prometheus text, latency
histograms). Every handler only queues work on the scheduler thread and awaits its
callbacks, so concurrent requests share decode steps; a client that disconnects cancels
its requests (streaming or not). Bad input gets an OpenAI-style error object with a 4xx
status; an unexpected failure answers 500 and the server keeps running.

    jaxcore serve --model model.safetensors --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import pathlib
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

import jaxcore as jc
from inference import openai_format as fmt
from inference.llm import LLM
from inference.protocol import (
    CHAT_STOP,
    APIError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    chat_prompt,
    parse,
)
from inference.request import QueueFullError, Request, RequestError, check_text
from inference.sampling import SamplingParams
from inference.weights import config_from_json

log = logging.getLogger(__name__)

# Request bodies above this many bytes get a 413 before they are read.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# Prompts x samples (n or best_of) one request may queue; independent of the queue's size,
# since a group bigger than the queue still runs on an idle server.
DEFAULT_MAX_SEQUENCES_PER_REQUEST = 256
# How often a waiting non-streaming handler checks whether its client is still there.
DISCONNECT_POLL_S = 0.2
# The /metrics path label takes only these values (any other URL counts as "other").
ROUTES = (
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/models/{name}",
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
)


class ClientGone(Exception):
    """The HTTP client disconnected while its requests ran."""


class _Watcher:
    """Turns scheduler-thread callbacks of a group of requests into an asyncio wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.changed = asyncio.Event()

    def __call__(self, request: Request, finished: bool) -> None:
        self.loop.call_soon_threadsafe(self.changed.set)

    async def wait(self) -> None:
        await self.changed.wait()
        self.changed.clear()

    async def until_done(
        self,
        requests: Sequence[Request],
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Return when every request is done; raise `ClientGone` if ``disconnected()``
        turns true first (checked every `DISCONNECT_POLL_S`)."""
        while not all(r.done for r in requests):
            if disconnected is None:  # the wake-up alone must suffice: no polling
                await self.wait()
                continue
            try:
                await asyncio.wait_for(self.wait(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await disconnected():
                    raise ClientGone from None


@dataclasses.dataclass
class _Group:
    """The requests of one HTTP call: ``samples`` per prompt (``best_of`` or ``n``)."""

    prompts: list[list[int]]
    requests: list[list[Request]]

    def flat(self) -> list[Request]:
        return [r for rs in self.requests for r in rs]


class OpenAIServer:
    """The app state: the model, its name and limits, and HTTP counters for /metrics."""

    def __init__(
        self,
        llm: LLM,
        *,
        model_name: str = "jaxcore",
        max_tokens_limit: int | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST,
        lineage: dict[str, Any] | None = None,
        tokenizer_info: bool = False,
    ):
        self.llm = llm
        self.tokenizer_info = tokenizer_info
        self.lineage = lineage  # where the weights came from (registry), in /v1/models
        self.tok = llm.tokenizer
        self.model_name = model_name
        limits = {
            "max_tokens_limit": max_tokens_limit,
            "max_request_bytes": max_request_bytes,
            "max_sequences_per_request": max_sequences_per_request,
        }
        for name, value in limits.items():  # 0 was "no limit" or refused every request
            if value is None and name == "max_tokens_limit":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise jc.ConfigError(f"{name}={value!r}: must be an integer >= 1 ({flag}).")
        self.max_tokens_limit = max_tokens_limit or llm.scheduler.max_len
        self.max_request_bytes = max_request_bytes
        self.max_sequences = max_sequences_per_request
        self.created = int(time.time())
        self.http_counts: dict[tuple[str, int], int] = {}
        self.app = self._build()

    # ----------------------------------------------------------------- app
    def _build(self) -> Any:
        app = FastAPI(title="jaxcore inference", docs_url=None, redoc_url=None)

        def error(e: APIError) -> Response:
            # ASCII-escaped: a message quoting the client's text (a model name holding a
            # lone surrogate) could not be encoded as UTF-8, which answered a 500.
            body = json.dumps(e.body())
            return Response(body, status_code=e.status, media_type="application/json")

        app.add_middleware(_Guard, server=self)

        @app.exception_handler(HTTPException)
        async def http_error(request: HTTPRequest, exc: HTTPException):
            return error(APIError(exc.status_code, str(exc.detail), code=str(exc.status_code)))

        @app.exception_handler(APIError)
        async def api_error(request: HTTPRequest, exc: APIError):
            return error(exc)

        @app.exception_handler(RequestError)
        async def request_error(request: HTTPRequest, exc: RequestError):
            return error(APIError(400, str(exc), param=exc.param, code=exc.code))

        async def body_of(request: HTTPRequest) -> Any:
            _check_json_content_type(request.headers.get("content-type"))
            raw = bytearray()
            async for chunk in request.stream():  # bounded even without Content-Length
                raw += chunk
                if len(raw) > self.max_request_bytes:
                    raise self._too_large()
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise APIError(400, f"the request body is not valid JSON ({e}).") from None

        @app.get("/health")
        async def health():
            alive = self.llm.scheduler.alive
            return JSONResponse(
                {"status": "ok" if alive else "stopped"}, status_code=200 if alive else 503
            )

        @app.get("/metrics")
        async def metrics():
            return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [self._model_card()]}

        @app.get("/v1/models/{name:path}")  # names from paths hold slashes ("org/model")
        async def model(name: str):
            self._check_model(name)
            return self._model_card()

        @app.post("/tokenize")
        async def tokenize(request: HTTPRequest):
            req = parse(TokenizeRequest, await body_of(request))
            if req.model is not None:
                self._check_model(req.model)
            if req.messages is not None:
                ids, _ = self._chat_ids(req.messages, req.add_generation_prompt)
            else:
                text = check_text(req.prompt or "")
                ids = self.tok.encode(text, add_special_tokens=req.add_special_tokens)
            body: dict[str, Any] = {
                "count": len(ids),
                "max_model_len": self.llm.scheduler.max_len,
                "tokens": ids,
            }
            if req.return_token_strs:
                body["token_strs"] = [fmt.piece(self.tok.token_bytes(t)) for t in ids]
            return body

        @app.post("/detokenize")
        async def detokenize(request: HTTPRequest):
            req = parse(DetokenizeRequest, await body_of(request))
            if req.model is not None:
                self._check_model(req.model)
            vocab = self.llm.config.vocab_size
            bad = [t for t in req.tokens if not 0 <= t < vocab]
            if bad:
                raise APIError(
                    400, f"token ids must lie in [0, {vocab}); got {bad[:5]}.", param="tokens"
                )
            return {"prompt": self.tok.decode(req.tokens)}

        if self.tokenizer_info:  # opt-in, as vLLM's --enable-tokenizer-info-endpoint

            @app.get("/tokenizer_info")
            async def tokenizer_info():
                return self._tokenizer_info()

        @app.post("/v1/completions")
        async def completions(request: HTTPRequest):
            req = parse(CompletionRequest, await body_of(request))
            self._check_model(req.model)
            prompts = self._completion_prompts(req)
            want_prompt_lp = req.echo and req.logprobs is not None
            prompt_lp = req.prompt_logprobs
            if want_prompt_lp:
                prompt_lp = max(prompt_lp or 0, req.logprobs or 0)
            params = dataclasses.replace(
                self._sampling(req, req.max_tokens if req.max_tokens is not None else 16),
                logprobs=req.logprobs,
                prompt_logprobs=prompt_lp,
            )
            samples = req.best_of or req.n
            if req.stream:
                group = self._submit(prompts, params, samples, _Watcher(asyncio.get_running_loop()))
                return StreamingResponse(
                    self._stream(req, group, chat=False), media_type="text/event-stream"
                )
            group = await self._run(prompts, params, samples, request)
            return self._completion_body(req, group)

        @app.post("/v1/chat/completions")
        async def chat(request: HTTPRequest):
            req = parse(ChatRequest, await body_of(request))
            self._check_model(req.model)
            prompt, stops = self._chat_ids(req.messages, req.add_generation_prompt)
            limit = req.max_completion_tokens or req.max_tokens
            field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
            if limit is None:
                room = self.llm.scheduler.max_len - len(prompt)
                if room < 1:  # say so, not "max_tokens is 1", which the client never sent
                    raise APIError(
                        400,
                        f"this model's context is {self.llm.scheduler.max_len} tokens, but the "
                        f"prompt has {len(prompt)} tokens, which leaves no room for a reply. "
                        "Shorten the messages.",
                        param="messages",
                        code="context_length_exceeded",
                    )
                limit = min(self.max_tokens_limit, room)
            base = self._sampling(req, limit, field)
            params = dataclasses.replace(
                base,
                stop=(*base.stop, *stops),
                logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                prompt_logprobs=req.prompt_logprobs,
            )
            if req.stream:
                group = self._submit([prompt], params, req.n, _Watcher(asyncio.get_running_loop()))
                return StreamingResponse(
                    self._stream(req, group, chat=True), media_type="text/event-stream"
                )
            group = await self._run([prompt], params, req.n, request)
            return self._chat_body(req, group)

        return app

    # ----------------------------------------------------------------- helpers
    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is larger than this server's limit of "
            f"{self.max_request_bytes} bytes; send less (or raise --max-request-bytes).",
            code="request_too_large",
        )

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "jaxcore",
            "max_model_len": self.llm.scheduler.max_len,
            **({"lineage": self.lineage} if self.lineage else {}),
        }

    def _tokenizer_info(self) -> dict[str, Any]:
        """vLLM's ``/tokenizer_info``: the special tokens' text, the chat template and the
        context. lm-evaluation-harness probes it (with ``/tokenize``) to pick its
        ``remote`` tokenizer backend, so ``local-completions`` runs with no tokenizer of
        its own; without it lm-eval loads ``model=`` as a Hub tokenizer name. Opt-in, as
        in vLLM: lm-eval's remote backend ignores ``add_bos_token``."""
        info: dict[str, Any] = {"tokenizer_class": type(self.tok).__name__}
        for key in ("bos", "eos", "pad"):
            tid = getattr(self.tok, f"{key}_id", None)
            info[f"{key}_token"] = (
                None if tid is None else self.tok.token_bytes(tid).decode("utf-8", "replace")
            )
        info["chat_template"] = self.tok.chat_template
        info["model_max_length"] = self.llm.scheduler.max_len
        return info

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(
                404,
                f"the model '{name}' does not exist; this server serves '{self.model_name}'.",
                param="model",
                code="model_not_found",
            )

    def _chat_ids(
        self, messages: list[Any], add_generation_prompt: bool
    ) -> tuple[list[int], tuple]:
        """Token ids of a chat, and the stop strings its template needs."""
        for i, m in enumerate(messages):
            check_text(m.text(), f"messages.{i}.content")
        if self.tok.chat_template:
            text = self.tok.apply_chat_template(
                [{"role": m.role, "content": m.text()} for m in messages],
                add_generation_prompt=add_generation_prompt,
            )
            return self.tok.encode(text, add_special_tokens=False), ()
        return self.tok.encode(chat_prompt(messages, add_generation_prompt)), (CHAT_STOP,)

    def _completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            return [self.tok.encode(check_text(p), add_special_tokens=True)]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        if p and all(isinstance(x, str) for x in p):
            return [
                self.tok.encode(check_text(x, f"prompt.{i}"), add_special_tokens=True)  # type: ignore[arg-type]
                for i, x in enumerate(p)
            ]
        if p and all(isinstance(x, list) for x in p):
            return [list(x) for x in p]  # type: ignore[arg-type]
        raise APIError(
            400, "prompt must be a non-empty string, list of strings or token ids.", param="prompt"
        )

    def _sampling(self, req: Any, max_tokens: int, field: str = "max_tokens") -> SamplingParams:
        if max_tokens > self.max_tokens_limit:
            raise APIError(
                400,
                f"{field}={max_tokens} is above this server's limit of {self.max_tokens_limit}; "
                f"ask for at most {self.max_tokens_limit}.",
                param=field,
            )
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min(req.min_tokens, max_tokens),
            temperature=req.temperature,
            top_k=max(req.top_k, 0),
            top_p=req.top_p,
            stop=req.stops(),
            stop_token_ids=tuple(req.stop_token_ids or ()),
            include_stop_str_in_output=req.include_stop_str_in_output,
            seed=req.seed,
            ignore_eos=req.ignore_eos,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            logit_bias=req.bias(),
        )

    def _submit(
        self, prompts: list[list[int]], params: SamplingParams, samples: int, watcher: _Watcher
    ) -> _Group:
        """Queue ``samples`` requests per prompt, all or none (seeded ones get seed + i)."""
        if len(prompts) * samples > self.max_sequences:
            raise APIError(
                400,
                f"this request asks for {len(prompts) * samples} sequences ({len(prompts)} "
                f"prompts x {samples} samples each, from n or best_of) but this server's "
                f"limit is {self.max_sequences} per request; send fewer prompts or a smaller "
                "n/best_of, or raise the limit with --max-sequences-per-request.",
                code="too_many_sequences",
            )
        self._check_running()
        work = []
        for prompt in prompts:
            for i in range(samples):
                seed = None if params.seed is None else params.seed + i
                work.append((prompt, dataclasses.replace(params, seed=seed)))
        try:
            flat = self.llm.scheduler.submit_many(work, on_update=watcher)
        except RequestError as e:
            raise APIError(400, str(e), param=e.param, code=e.code) from None
        except QueueFullError as e:
            raise APIError(429, str(e), type="server_overloaded", code="queue_full") from None
        nested = [flat[i * samples : (i + 1) * samples] for i in range(len(prompts))]
        return _Group(prompts, nested)

    def _check_running(self) -> None:
        """A 503 when nothing would run the request: queued on a stopped scheduler (the
        LLM closed, or its thread ended on an error) it waited until the client gave up."""
        scheduler = self.llm.scheduler
        if not scheduler.alive:
            why = (
                "it stopped on an error"
                if scheduler.failure is None
                else f"it stopped on {type(scheduler.failure).__name__}: {scheduler.failure}"
            )
            raise APIError(
                503,
                f"the model's scheduler is not running (its LLM was closed, or {why}: see "
                "the server log), so no request can finish; restart the server.",
                type="server_error",
                code="scheduler_stopped",
            )

    async def _run(
        self, prompts: list[list[int]], params: SamplingParams, samples: int, http: HTTPRequest
    ) -> _Group:
        watcher = _Watcher(asyncio.get_running_loop())
        group = self._submit(prompts, params, samples, watcher)
        flat = group.flat()
        try:
            await watcher.until_done(flat, http.is_disconnected)
        finally:  # a disconnected client (or a cancelled task) frees its slots
            for r in flat:
                if not r.done:
                    r.cancel()
        for r in flat:
            if r.error is not None:
                raise APIError(500, f"generation failed: {r.error}", type="server_error")
        return group

    @staticmethod
    def _best(requests: list[Request], n: int) -> list[Request]:
        if len(requests) == n:
            return requests
        return sorted(requests, key=lambda r: -r.cumulative_logprob())[:n]

    def _completion_body(self, req: CompletionRequest, group: _Group) -> dict[str, Any]:
        choices = []
        for rs in group.requests:
            for r in self._best(rs, req.n):
                choices.append(self._completion_choice(req, r, len(choices)))
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": fmt.usage(group.prompts, group.flat()),
        }

    def _completion_choice(self, req: CompletionRequest, r: Request, index: int) -> dict:
        text = (self.tok.decode(r.prompt) if req.echo else "") + r.text
        logprobs = None
        if req.logprobs is not None:
            all_entries = fmt.entries(r, echo=req.echo)
            logprobs = fmt.completion_logprobs(self.tok, all_entries, 0, len(all_entries))
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": fmt.finish_reason(r),
            "stop_reason": r.stop_reason,
        }
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = fmt.prompt_logprobs(self.tok, r)
        return choice

    def _chat_body(self, req: ChatRequest, group: _Group) -> dict[str, Any]:
        choices = []
        for i, r in enumerate(group.requests[0]):
            logprobs = fmt.chat_logprobs(self.tok, r, 0, len(r.output)) if req.logprobs else None
            choices.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": r.text},
                    "logprobs": logprobs,
                    "finish_reason": fmt.finish_reason(r),
                    "stop_reason": r.stop_reason,
                }
            )
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": fmt.usage(group.prompts, group.flat()),
        }
        if req.prompt_logprobs is not None:
            body["prompt_logprobs"] = fmt.prompt_logprobs(self.tok, group.requests[0][0])
        return body

    def _stream(self, req: Any, group: _Group, *, chat: bool) -> AsyncIterator[str]:
        watcher: _Watcher = group.flat()[0].on_update  # type: ignore[assignment]
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        choices = [r for rs in group.requests for r in rs]
        echo = bool(getattr(req, "echo", False))

        def event(payload: list[dict[str, Any]], usage: dict | None = None) -> str:
            body: dict[str, Any] = {
                "id": ident,
                "object": kind,
                "created": created,
                "model": self.model_name,
                "choices": payload,
            }
            if usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n"

        def delta(i: int, r: Request, text: str, start: int, stop: int, finish: str | None):
            """One choice's chunk: ``text`` and the log-probs of output tokens start:stop."""
            if chat:
                d: dict[str, Any] = {} if text is None else {"content": text}
                lp = fmt.chat_logprobs(self.tok, r, start, stop) if req.logprobs else None
                return {"index": i, "delta": d, "logprobs": lp, "finish_reason": finish}
            lp = None
            if req.logprobs is not None:
                all_entries = fmt.entries(r, echo=echo)
                shift = len(r.prompt) if echo else 0
                lp = fmt.completion_logprobs(self.tok, all_entries, shift + start, shift + stop)
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}

        async def gen() -> AsyncIterator[str]:
            sent_chars = [0] * len(choices)
            sent_tokens = [0] * len(choices)
            finished = [False] * len(choices)
            try:
                if chat:
                    yield event(
                        [
                            {
                                "index": i,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                            for i in range(len(choices))
                        ]
                    )
                elif echo:  # the prompt's log-probs arrive with its prefill
                    while not all(r.done or r.first_token_time is not None for r in choices):
                        await watcher.wait()
                    yield event([self._echo_chunk(req, i, r) for i, r in enumerate(choices)])
                while not all(finished):
                    for i, r in enumerate(choices):
                        if finished[i]:
                            continue
                        done = r.done
                        upto, tokens = r.stable_len, fmt.stable_tokens(self.tok, r)
                        if upto > sent_chars[i] or tokens > sent_tokens[i]:
                            text = r.text[sent_chars[i] : upto]
                            yield event([delta(i, r, text, sent_tokens[i], tokens, None)])
                            sent_chars[i], sent_tokens[i] = upto, tokens
                        if done:
                            if r.error is not None:  # headers are sent: say why in-band
                                error = APIError(
                                    500, f"generation failed: {r.error}", type="server_error"
                                )
                                yield f"data: {json.dumps(error.body())}\n\n"
                                yield "data: [DONE]\n\n"
                                return
                            finished[i] = True
                            end = delta(i, r, None if chat else "", tokens, tokens, None)
                            end["finish_reason"] = fmt.finish_reason(r)
                            end["stop_reason"] = r.stop_reason
                            yield event([end])
                    if not all(finished):
                        await watcher.wait()
                if req.include_usage():
                    yield event([], usage=fmt.usage(group.prompts, group.flat()))
                yield "data: [DONE]\n\n"
            finally:  # the client went away (the task is cancelled) or we are done
                for r in group.flat():
                    if not r.done:
                        r.cancel()

        return gen()

    def _echo_chunk(self, req: CompletionRequest, i: int, r: Request) -> dict[str, Any]:
        """The first completion chunk of an echoed stream: the prompt and its log-probs."""
        lp = None
        if req.logprobs is not None:
            lp = fmt.completion_logprobs(self.tok, fmt.entries(r, echo=True), 0, len(r.prompt))
        return {
            "index": i,
            "text": self.tok.decode(r.prompt),
            "logprobs": lp,
            "finish_reason": None,
        }

    def metrics_text(self) -> str:
        """Prometheus text exposition of the scheduler's counters, gauges and histograms."""
        s = self.llm.scheduler
        lines: list[str] = []

        def header(full: str, kind: str, help_: str) -> None:
            if not any(line.startswith(f"# TYPE {full} ") for line in lines):
                lines.append(f"# HELP {full} {help_}")
                lines.append(f"# TYPE {full} {kind}")

        def metric(name: str, kind: str, help_: str, value: float, labels: str = "") -> None:
            full = f"jaxcore_inference_{name}"
            header(full, kind, help_)
            lines.append(f"{full}{labels} {value}")

        helps = {
            "requests_total": "requests accepted into the queue",
            "requests_finished": "requests that left their slot",
            "requests_rejected": "requests refused because the queue was full",
            "requests_cancelled": "requests cancelled by their client",
            "requests_failed": "requests that ended with an error",
            "prompt_tokens_total": "prompt tokens prefilled",
            "generation_tokens_total": "tokens generated",
            "decode_steps_total": "batched decode steps run",
            "decode_dispatches_total": "multi-step decode dispatches to the device",
        }
        for name, value in s.stats.items():
            metric(name, "counter", helps.get(name, name), value)
        metric("queue_depth", "gauge", "requests waiting for a slot", s.queue_depth())
        metric("active_slots", "gauge", "slots generating now", s.active_slots())
        metric("slots", "gauge", "decode slots", len(s.slots))
        metric("weight_bytes", "gauge", "bytes of served weights", s.engine.weight_bytes)
        if s.pool is not None:  # paged cache: free pages return to the total when idle
            free = s.pool.free_pages()
            metric("kv_pages_free", "gauge", "KV-cache pages a new request can take", free)
            metric("kv_pages_total", "gauge", "KV-cache pages in the pool", s.pool.total)
        for name, hist in s.histograms.items():
            full = f"jaxcore_inference_{name}"
            header(full, "histogram", name.replace("_", " "))
            for le, n in hist.cumulative():
                lines.append(f'{full}_bucket{{le="{le}"}} {n}')
            lines.append(f"{full}_sum {hist.sum}")
            lines.append(f"{full}_count {hist.count}")
        for (path, status), n in sorted(self.http_counts.items()):
            metric(
                "http_requests_total",
                "counter",
                "HTTP responses by route and status",
                n,
                f'{{path="{path}",status="{status}"}}',
            )
        return "\n".join(lines) + "\n"


class _Guard:
    """Pure ASGI middleware: refuses oversized bodies, turns unhandled errors into a 500
    and counts responses per route. (Starlette's ``BaseHTTPMiddleware`` would hide the
    client's disconnect from `Request.is_disconnected`.)"""

    def __init__(self, app: Any, server: OpenAIServer):
        self.app = app
        self.server = server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500, "started": False}

        async def tracked(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            await send(message)

        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        try:
            if length.isdigit() and int(length) > self.server.max_request_bytes:
                error = self.server._too_large()
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, tracked)
            else:
                await self.app(scope, receive, tracked)
        except Exception:  # never let one request take the server down
            log.exception("unhandled error on %s", scope.get("path"))
            if not status["started"]:
                error = APIError(500, "internal server error", type="server_error")
                await JSONResponse(error.body(), status_code=500)(scope, receive, tracked)
        finally:
            key = (_route_label(scope.get("path", "")), status["code"])
            counts = self.server.http_counts
            counts[key] = counts.get(key, 0) + 1


def _check_json_content_type(header: str | None) -> None:
    """A 400 unless the body is declared JSON, as vLLM answers: a body sent as
    ``text/plain`` or a form (``curl -d`` without ``-H``) was parsed as JSON all the same,
    so a client that did not mean to send JSON still got a completion."""
    media = (header or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        got = f"Content-Type '{header}'" if header else "no Content-Type"
        raise APIError(
            400,
            f"the request has {got}; only 'application/json' is accepted. Send the JSON body "
            "with the header 'Content-Type: application/json' (curl: -H 'Content-Type: "
            "application/json').",
            code="unsupported_media_type",
        )


def _route_label(path: str) -> str:
    """The ``path`` label for /metrics: a known route, else ``other`` (bounded cardinality)."""
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
        return "/v1/models/{name}"
    return "other"


def create_app(
    llm: LLM,
    *,
    model_name: str = "jaxcore",
    max_tokens_limit: int | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_sequences_per_request: int = DEFAULT_MAX_SEQUENCES_PER_REQUEST,
    lineage: dict[str, Any] | None = None,
    tokenizer_info: bool = False,
) -> Any:
    """The FastAPI app serving ``llm`` (starts its scheduler thread); ``lineage`` (a
    registered version's) is reported by ``/v1/models``; ``tokenizer_info`` adds vLLM's
    ``GET /tokenizer_info``."""
    llm.start()
    return OpenAIServer(
        llm,
        model_name=model_name,
        max_tokens_limit=max_tokens_limit,
        max_request_bytes=max_request_bytes,
        max_sequences_per_request=max_sequences_per_request,
        lineage=lineage,
        tokenizer_info=tokenizer_info,
    ).app


class BackgroundServer:
    """uvicorn serving an app from a thread: for tests, notebooks and benchmarks."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        import socket

        import uvicorn

        if port == 0:
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxcore serve", description="Serve a model over the OpenAI HTTP API."
    )
    p.add_argument(
        "--model",
        required=True,
        help="a Hugging Face model folder, a .safetensors file, registry:NAME@alias, or a demo "
        "name (tiny, small, base)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json, tokenizer.model or their folder (default: the model folder's, "
        "else bytes)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="JSON file of TransformerConfig fields, for weight files that do not carry "
        "one (jaxcore export_checkpoint files)",
    )
    p.add_argument("--served-model-name", default=None, help="the name clients pass as 'model'")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--slots", type=int, default=8, help="sequences decoded together")
    p.add_argument(
        "--max-len", type=int, default=None, help="positions per slot (prompt + completion)"
    )
    p.add_argument("--decode-steps", type=int, default=8, help="tokens per device dispatch")
    p.add_argument("--max-tokens-limit", type=int, default=None)
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES)
    p.add_argument("--queue-size", type=int, default=256)
    p.add_argument(
        "--max-sequences-per-request",
        type=int,
        default=DEFAULT_MAX_SEQUENCES_PER_REQUEST,
        help="prompts x n (or best_of) one request may ask for; more get a 400",
    )
    p.add_argument(
        "--enable-tokenizer-info-endpoint",
        action="store_true",
        help="serve vLLM's GET /tokenizer_info (special tokens, chat template), which "
        "lm-evaluation-harness probes to use the server's tokenizer",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--quantize", default=None, choices=["int8"])
    p.add_argument("--tensor", type=int, default=1, help="tensor-parallel ways")
    p.add_argument("--data", type=int, default=1, help="data-parallel ways (slots split over them)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(  # uvicorn's levels ("trace" below debug)
        "--log-level",
        default="info",
        type=str.lower,
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    return p


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (``SO_REUSEADDR``, as uvicorn binds), before the
    model loads: vLLM binds its port before it builds the engine too, so a taken port is
    said at once, not after minutes of loading and compiling."""
    if not 0 <= port <= 65535:
        raise jc.ConfigError(f"--port {port} is not a TCP port; pass one in 0-65535.")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            hint = "stop what holds it (another jaxcore serve?) or pick another --port."
        elif e.errno == errno.EACCES:
            hint = "ports below 1024 need privileges; pick another --port."
        else:  # a name that does not resolve, an address of another machine
            hint = "pass an address of this machine as --host (127.0.0.1, 0.0.0.0, ::)."
        raise jc.ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}); {hint}") from e
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    """``jaxcore serve``: bind the port, load, compile every bucket, then serve until
    interrupted."""
    import uvicorn

    from inference.config import ServingConfig

    args = _parser().parse_args(argv)
    # uvicorn's "trace" is level 5, which logging only knows once uvicorn.config names it
    logging.basicConfig(level=5 if args.log_level == "trace" else args.log_level.upper())
    limits = {
        "--max-tokens-limit": args.max_tokens_limit,
        "--max-request-bytes": args.max_request_bytes,
        "--max-sequences-per-request": args.max_sequences_per_request,
        "--queue-size": args.queue_size,
    }
    for flag, value in limits.items():  # before the load: each one's mistake shows at once
        if value is not None and value < 1:
            print(f"jaxcore serve: {flag} {value}: must be an integer >= 1.", file=sys.stderr)
            return 2
    try:
        sock = _listen(args.host, args.port)
    except jc.ConfigError as e:
        print(f"jaxcore serve: {e}", file=sys.stderr)
        return 2
    llm = None
    try:
        try:  # a user's mistake (a path, a name, a config key) is one line, as jaxcore rlhf's
            parallel = None
            if args.tensor > 1 or args.data > 1:
                parallel = jc.ParallelConfig(data=args.data, tensor=args.tensor, fsdp=1)
            engine = ServingConfig(
                slots=args.slots,
                max_len=args.max_len,
                decode_steps=args.decode_steps,
                dtype=args.dtype,
                quantize=args.quantize,
                parallel=parallel,
                seed=args.seed,
            )
            config = None
            if args.config:
                config = config_from_json(pathlib.Path(args.config))
            llm = LLM(
                args.model,
                config=config,
                engine=engine,
                tokenizer=args.tokenizer,
                queue_size=args.queue_size,
                seed=args.seed,
            )
            log.info("compiling %d prefill buckets and the decode step", len(llm.engine.buckets))
            llm.engine.warmup()
        except jc.ConfigError as e:
            print(f"jaxcore serve: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C: one line, as jaxcore run / jaxcore rlhf say it
            print(
                "jaxcore serve: interrupted (Ctrl-C) while loading and compiling the model; "
                "nothing was served.",
                file=sys.stderr,
            )
            return 130
        name = args.served_model_name or str(args.model)
        lineage = None
        if str(args.model).startswith("registry:"):  # a registered version reports its lineage
            from jaxcore.experiments.registry import resolve

            lineage = resolve(str(args.model)).lineage
        app = create_app(
            llm,
            model_name=name,
            max_tokens_limit=args.max_tokens_limit,
            max_request_bytes=args.max_request_bytes,
            max_sequences_per_request=args.max_sequences_per_request,
            lineage=lineage,
            tokenizer_info=args.enable_tokenizer_info_endpoint,
        )
        host, port = sock.getsockname()[:2]  # the port --port 0 was given
        shown = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
        log.info("serving %s on http://%s:%d/v1 (Ctrl-C to stop)", name, shown, port)
        config = uvicorn.Config(app, host=host, port=port, log_level=args.log_level.lower())
        # uvicorn re-raises the Ctrl-C it shut down on; uvicorn.run swallows it too
        with contextlib.suppress(KeyboardInterrupt):
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        if llm is not None:
            llm.close()
    return 0
