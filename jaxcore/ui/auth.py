"""Access token for a dashboard that listens beyond 127.0.0.1.

Every request (pages, static files, API) must carry the token: an
``Authorization: Bearer <token>`` header, the ``jaxcore_ui_token_<port>`` cookie, or
once, a ``?token=`` query parameter, which is answered with a redirect to the same URL
without it plus the cookie (the way Jupyter's token login works), so the token does not
stay in the address bar or in links. The cookie is named after the server's port, as
Jupyter's login cookie is: browsers keep cookies per host, not per port, so two
dashboards on one machine would otherwise log each other out. Comparison is constant
time (`hmac.compare_digest`). The token is never logged: uvicorn's access log line is
redacted by `RedactTokenFilter`.
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

from jaxcore.errors import ConfigError

COOKIE = "jaxcore_ui_token"  # the cookie's name is this + "_<port>": see `cookie_name`
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


MIN_TOKEN_CHARS = 16


def check_token(token: str, where: str) -> None:
    """ConfigError unless ``token`` is one word of at least 16 characters: an empty one
    (an unset variable read as "") made an app that failed at its first request, a short
    one is guessable, and a Bearer header or a cookie cannot carry spaces or lines."""
    if not token.strip():
        raise ConfigError(f"the access token in {where} is empty; use at least 16 characters.")
    if any(c.isspace() for c in token):
        raise ConfigError(f"the access token in {where} must be one line without spaces.")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the access token in {where} has {len(token)} characters; use at least "
            f"{MIN_TOKEN_CHARS} (e.g. openssl rand -hex 24)."
        )


def cookie_name(scope: Scope) -> str:
    """The login cookie of the server this request reached (its bound port)."""
    server = scope.get("server") or (None, None)
    return f"{COOKIE}_{server[1]}" if server[1] is not None else COOKIE


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
        cookie = cookie_name(scope)
        if _matches(bearer, self.token) or _matches(request.cookies.get(cookie), self.token):
            await self.app(scope, receive, send)
            return
        response: Response
        if _matches(request.query_params.get("token"), self.token):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + ("?" + urllib.parse.urlencode(rest) if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(cookie, self.token, httponly=True, samesite="strict")
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
