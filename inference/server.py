"""An OpenAI-compatible HTTP server (FastAPI + uvicorn) over the continuous-batching engine.

Endpoints: ``/v1/completions`` (with ``echo`` and ``logprobs``, what evaluation harnesses
use), ``/v1/chat/completions``, ``/v1/models``, server-sent-event streaming, ``/health``
and ``/metrics`` (Prometheus text). Every handler only queues work on the scheduler
thread and awaits its callbacks, so concurrent requests share decode steps. Bad input
gets an OpenAI-style error object with a 4xx status; an unexpected failure answers 500
and the server keeps running.

    jaxcore serve --model model.safetensors --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import pathlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from inference.batching import QueueFullError, Request, RequestError
from inference.llm import LLM
from inference.protocol import (
    CHAT_STOP,
    APIError,
    ChatRequest,
    CompletionRequest,
    chat_prompt,
    parse,
)
from inference.sampling import SamplingParams
from jaxcore.models import TransformerConfig

log = logging.getLogger(__name__)


class _Watcher:
    """Turns a request's scheduler-thread callbacks into an asyncio wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.changed = asyncio.Event()

    def __call__(self, request: Request, finished: bool) -> None:
        self.loop.call_soon_threadsafe(self.changed.set)

    async def wait(self) -> None:
        await self.changed.wait()
        self.changed.clear()


class OpenAIServer:
    """The app state: the model, its name and limits, and HTTP counters for /metrics."""

    def __init__(
        self, llm: LLM, *, model_name: str = "jaxcore", max_tokens_limit: int | None = None
    ):
        self.llm = llm
        self.model_name = model_name
        self.max_tokens_limit = max_tokens_limit or llm.scheduler.max_len
        self.created = int(time.time())
        self.http_counts: dict[tuple[str, int], int] = {}
        self.app = self._build()

    # ----------------------------------------------------------------- app
    def _build(self) -> Any:
        app = FastAPI(title="jaxcore inference", docs_url=None, redoc_url=None)

        def error(e: APIError) -> JSONResponse:
            return JSONResponse(e.body(), status_code=e.status)

        @app.middleware("http")
        async def count(request: HTTPRequest, call_next):
            try:
                response = await call_next(request)
            except Exception:  # never let one request take the server down
                log.exception("unhandled error on %s", request.url.path)
                response = error(APIError(500, "internal server error", type="server_error"))
            key = (request.url.path, response.status_code)
            self.http_counts[key] = self.http_counts.get(key, 0) + 1
            return response

        @app.exception_handler(HTTPException)
        async def http_error(request: HTTPRequest, exc: HTTPException):
            return error(APIError(exc.status_code, str(exc.detail), code=str(exc.status_code)))

        @app.exception_handler(APIError)
        async def api_error(request: HTTPRequest, exc: APIError):
            return error(exc)

        async def body_of(request: HTTPRequest) -> Any:
            raw = await request.body()
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise APIError(400, f"the request body is not valid JSON ({e}).") from None

        @app.get("/health")
        async def health():
            alive = self.llm.scheduler._thread is not None and self.llm.scheduler._thread.is_alive()
            return JSONResponse(
                {"status": "ok" if alive else "stopped"}, status_code=200 if alive else 503
            )

        @app.get("/metrics")
        async def metrics():
            return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [self._model_card()]}

        @app.get("/v1/models/{name}")
        async def model(name: str):
            self._check_model(name)
            return self._model_card()

        @app.post("/v1/completions")
        async def completions(request: HTTPRequest):
            req = parse(CompletionRequest, await body_of(request))
            self._check_model(req.model)
            prompts = self._completion_prompts(req)
            params = self._sampling(req, req.max_tokens if req.max_tokens is not None else 16)
            params = SamplingParams(
                **{
                    **params.__dict__,
                    "logprobs": req.logprobs,
                    "prompt_logprobs": req.echo and req.logprobs is not None,
                }
            )
            if req.stream:
                if len(prompts) != 1:
                    raise APIError(400, "streaming takes one prompt.", param="prompt")
                return StreamingResponse(
                    self._stream(req, prompts[0], params, chat=False),
                    media_type="text/event-stream",
                )
            done = await self._run_all(prompts, params)
            return self._completion_body(req, done)

        @app.post("/v1/chat/completions")
        async def chat(request: HTTPRequest):
            req = parse(ChatRequest, await body_of(request))
            self._check_model(req.model)
            prompt = self.llm.tokenizer.encode(chat_prompt(req.messages))
            limit = req.max_completion_tokens or req.max_tokens
            if limit is None:
                limit = max(1, min(self.max_tokens_limit, self.llm.scheduler.max_len - len(prompt)))
            params = self._sampling(req, limit)
            params = SamplingParams(
                **{
                    **params.__dict__,
                    "stop": (*params.stop, CHAT_STOP),
                    "logprobs": (req.top_logprobs or 0) if req.logprobs else None,
                }
            )
            if req.stream:
                return StreamingResponse(
                    self._stream(req, prompt, params, chat=True), media_type="text/event-stream"
                )
            (r,) = await self._run_all([prompt], params)
            return self._chat_body(req, r)

        return app

    # ----------------------------------------------------------------- helpers
    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "jaxcore",
        }

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(
                404,
                f"the model '{name}' does not exist; this server serves '{self.model_name}'.",
                param="model",
                code="model_not_found",
            )

    def _completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            return [self.llm.tokenizer.encode(p)]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        if p and all(isinstance(x, str) for x in p):
            return [self.llm.tokenizer.encode(x) for x in p]  # type: ignore[arg-type]
        if p and all(isinstance(x, list) for x in p):
            return [list(x) for x in p]  # type: ignore[arg-type]
        raise APIError(
            400, "prompt must be a non-empty string, list of strings or token ids.", param="prompt"
        )

    def _sampling(self, req: Any, max_tokens: int) -> SamplingParams:
        if max_tokens > self.max_tokens_limit:
            raise APIError(
                400,
                f"max_tokens={max_tokens} is above this server's limit of {self.max_tokens_limit}.",
                param="max_tokens",
            )
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            stop=req.stops(),
            seed=req.seed,
            ignore_eos=req.ignore_eos,
        )

    def _submit(self, prompt: list[int], params: SamplingParams, watcher: _Watcher) -> Request:
        try:
            return self.llm.scheduler.submit(prompt, params, on_update=watcher)
        except RequestError as e:
            raise APIError(400, str(e), param="prompt", code="context_length_exceeded") from None
        except QueueFullError as e:
            raise APIError(429, str(e), type="server_overloaded", code="queue_full") from None

    async def _run_all(self, prompts: list[list[int]], params: SamplingParams) -> list[Request]:
        loop = asyncio.get_running_loop()
        watchers = [_Watcher(loop) for _ in prompts]
        requests: list[Request] = []
        try:
            for prompt, w in zip(prompts, watchers, strict=True):
                requests.append(self._submit(prompt, params, w))
            for r, w in zip(requests, watchers, strict=True):
                while not r.done:
                    await w.wait()
                if r.error is not None:
                    raise APIError(500, f"generation failed: {r.error}", type="server_error")
            return requests
        finally:  # a disconnected client (cancelled task) frees its slots
            for r in requests:
                if not r.done:
                    r.cancel()

    def _usage(self, requests: Sequence[Request]) -> dict[str, int]:
        prompt = sum(len(r.prompt) for r in requests)
        completion = sum(len(r.output) for r in requests)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _finish(self, r: Request) -> str:
        return "length" if r.finish_reason == "length" else "stop"

    def _completion_logprobs(self, req: CompletionRequest, r: Request) -> dict[str, Any] | None:
        if req.logprobs is None:
            return None
        tok = self.llm.tokenizer
        tokens, lps, tops = [], [], []
        if req.echo:
            tokens += [tok.piece(t) for t in r.prompt]
            lps += [None, *r.prompt_logprobs]
            tops += [
                None,
                *[{tok.piece(i): lp for i, lp in alts} for alts in r.prompt_top_logprobs],
            ]
        tokens += [tok.piece(t) for t in r.output]
        lps += list(r.logprobs)
        tops += [{tok.piece(i): lp for i, lp in alts} for alts in r.top_logprobs]
        tops += [{}] * (len(tokens) - len(tops))  # logprobs=0: no alternatives
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _completion_body(self, req: CompletionRequest, done: list[Request]) -> dict[str, Any]:
        choices = []
        for i, r in enumerate(done):
            text = (self.llm.tokenizer.decode(r.prompt) if req.echo else "") + r.text
            choices.append(
                {
                    "index": i,
                    "text": text,
                    "logprobs": self._completion_logprobs(req, r),
                    "finish_reason": self._finish(r),
                }
            )
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": self._usage(done),
        }

    def _chat_logprobs(self, r: Request) -> dict[str, Any] | None:
        if r.params.logprobs is None:
            return None
        tok = self.llm.tokenizer

        def entry(t: int, lp: float) -> dict[str, Any]:
            piece = tok.decode([t])
            return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8"))}

        content = []
        for i, (t, lp) in enumerate(zip(r.output, r.logprobs, strict=True)):
            alts = r.top_logprobs[i] if i < len(r.top_logprobs) else []
            content.append({**entry(t, lp), "top_logprobs": [entry(a, b) for a, b in alts]})
        return {"content": content}

    def _chat_body(self, req: ChatRequest, r: Request) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": r.text},
                    "logprobs": self._chat_logprobs(r),
                    "finish_reason": self._finish(r),
                }
            ],
            "usage": self._usage([r]),
        }

    def _stream(
        self, req: Any, prompt: list[int], params: SamplingParams, *, chat: bool
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        watcher = _Watcher(loop)
        r = self._submit(prompt, params, watcher)  # errors here answer 4xx before streaming
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None, first: bool = False) -> str:
            if chat:
                d: dict[str, Any] = {}
                if first:
                    d["role"] = "assistant"
                if delta is not None:
                    d["content"] = delta
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            else:
                choice = {
                    "index": 0,
                    "text": delta or "",
                    "logprobs": None,
                    "finish_reason": finish,
                }
            body = {
                "id": ident,
                "object": kind,
                "created": created,
                "model": self.model_name,
                "choices": [choice],
            }
            return f"data: {json.dumps(body)}\n\n"

        async def gen() -> AsyncIterator[str]:
            sent = 0
            try:
                if chat:
                    yield chunk("", None, first=True)
                while True:
                    finished = r.done
                    upto = r.stable_len
                    if upto > sent:
                        yield chunk(r.text[sent:upto], None)
                        sent = upto
                    if finished:
                        break
                    await watcher.wait()
                yield chunk(None if chat else "", self._finish(r))
                if req.include_usage():
                    body = {
                        "id": ident,
                        "object": kind,
                        "created": created,
                        "model": self.model_name,
                        "choices": [],
                        "usage": self._usage([r]),
                    }
                    yield f"data: {json.dumps(body)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if not r.done:
                    r.cancel()

        return gen()

    def metrics_text(self) -> str:
        """Prometheus text exposition of the scheduler's counters and gauges."""
        s = self.llm.scheduler
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float, labels: str = "") -> None:
            full = f"jaxcore_inference_{name}"
            if not any(line.startswith(f"# TYPE {full} ") for line in lines):
                lines.append(f"# HELP {full} {help_}")
                lines.append(f"# TYPE {full} {kind}")
            lines.append(f"{full}{labels} {value}")

        helps = {
            "requests_total": "requests accepted into the queue",
            "requests_finished": "requests that left their slot",
            "requests_rejected": "requests refused because the queue was full",
            "requests_cancelled": "requests cancelled by their client",
            "prompt_tokens_total": "prompt tokens prefilled",
            "generation_tokens_total": "tokens generated",
            "decode_steps_total": "batched decode steps run",
            "time_to_first_token_seconds_sum": "summed time to first token",
            "request_latency_seconds_sum": "summed end-to-end latency",
        }
        for name, value in s.stats.items():
            metric(name, "counter", helps.get(name, name), value)
        metric("queue_depth", "gauge", "requests waiting for a slot", s.queue.qsize())
        metric("active_slots", "gauge", "slots generating now", s.active_slots())
        metric("slots", "gauge", "decode slots", len(s.slots))
        metric("weight_bytes", "gauge", "bytes of served weights", s.engine.weight_bytes)
        for (path, status), n in sorted(self.http_counts.items()):
            metric(
                "http_requests_total",
                "counter",
                "HTTP responses by path and status",
                n,
                f'{{path="{path}",status="{status}"}}',
            )
        return "\n".join(lines) + "\n"


def create_app(
    llm: LLM, *, model_name: str = "jaxcore", max_tokens_limit: int | None = None
) -> Any:
    """The FastAPI app serving ``llm`` (starts its scheduler thread)."""
    llm.start()
    return OpenAIServer(llm, model_name=model_name, max_tokens_limit=max_tokens_limit).app


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
        "--model", required=True, help="a .safetensors file or a registry name (tiny, small, base)"
    )
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: bytes)")
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
    p.add_argument("--max-tokens-limit", type=int, default=None)
    p.add_argument("--queue-size", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--quantize", default=None, choices=["int8"])
    p.add_argument("--tensor", type=int, default=1, help="tensor-parallel ways")
    p.add_argument("--data", type=int, default=1, help="data-parallel ways (slots split over them)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-level", default="info")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``jaxcore serve``: load, compile every bucket, then serve until interrupted."""
    import uvicorn

    import jaxcore as jc
    from inference.engine import ServingConfig

    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    parallel = None
    if args.tensor > 1 or args.data > 1:
        parallel = jc.ParallelConfig(data=args.data, tensor=args.tensor, fsdp=1)
    engine = ServingConfig(
        slots=args.slots,
        max_len=args.max_len,
        dtype=args.dtype,
        quantize=args.quantize,
        parallel=parallel,
        seed=args.seed,
    )
    config = None
    if args.config:
        config = TransformerConfig(**json.loads(pathlib.Path(args.config).read_text()))
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
    name = args.served_model_name or str(args.model)
    app = create_app(llm, model_name=name, max_tokens_limit=args.max_tokens_limit)
    log.info("serving %s on http://%s:%d/v1", name, args.host, args.port)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())
    finally:
        llm.close()
    return 0
