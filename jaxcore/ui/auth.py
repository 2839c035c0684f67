"""Access token for a dashboard that listens beyond 127.0.0.1.

Every request (pages, static files, API) must carry the token: an
``Authorization: Bearer <token>`` header, the ``jaxcore_ui_token`` cookie, or once, a
``?token=`` query parameter, which is answered with a redirect to the same URL without
it plus the cookie (the way Jupyter's token login works), so the token does not stay in
the address bar or in links. Comparison is constant time (`hmac.compare_digest`). The
token is never logged: uvicorn's access log line is redacted by `RedactTokenFilter`.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
import urllib.parse

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "jaxcore_ui_token"
TOKEN_ENV = "JAXCORE_UI_TOKEN"
_TOKEN_IN_TEXT = re.compile(r"(token=)[^&\s\"]*")


def is_local_host(host: str) -> bool:
    """True for loopback binds (127.0.0.0/8, ::1, localhost): no token needed there."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname may resolve to anything: treat it as non-local


def _matches(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


class TokenMiddleware:
    """ASGI middleware: 401 for any HTTP request without the right token."""

    def __init__(self, app: ASGIApp, token: str):
        if not token:
            raise ValueError("TokenMiddleware needs a non-empty token")
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else None
        if _matches(bearer, self.token) or _matches(request.cookies.get(COOKIE), self.token):
            await self.app(scope, receive, send)
            return
        response: Response
        if _matches(request.query_params.get("token"), self.token):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + ("?" + urllib.parse.urlencode(rest) if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
        else:
            response = PlainTextResponse(
                "401: this dashboard needs its access token. Open it once as "
                "http://HOST:PORT/?token=TOKEN (the token the server was started with, "
                f"${TOKEN_ENV}), or send 'Authorization: Bearer TOKEN'.\n",
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        await response(scope, receive, send)


class RedactTokenFilter(logging.Filter):
    """Replace ``token=...`` in log records (uvicorn logs the full request path)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN_IN_TEXT.sub(r"\1<redacted>", a) if isinstance(a, str) else a
                for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _TOKEN_IN_TEXT.sub(r"\1<redacted>", record.msg)
        return True
