"""Access token on a non-local bind: 401 for every page, static file and API route without
it, 200 with it; constant-time comparison; the token never reaches a log. Checked on the
ASGI app and on a real ``jaxcore ui`` (uvicorn) process on 127.0.0.1 in token mode."""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.cookiejar import CookieJar

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Mount

from jaxcore.errors import ConfigError
from jaxcore.launch import free_port
from jaxcore.ui import auth, create_app, is_local_host
from jaxcore.ui.auth import COOKIE, TOKEN_ENV, RedactTokenFilter
from jaxcore.ui.cli import resolve

TOKEN = "t0ken-for-the-dashboard-tests-0123456789"


def every_url(app, filled) -> list[str]:
    """One concrete URL per route of the app (so a new route cannot escape the check)."""
    ids = {"exp_id": filled.asha_id, "trial_id": 1, "name": filled.dataset_dir.name}
    urls = []
    for route in app.routes:
        if isinstance(route, Mount):
            urls += ["/static/ui.js", "/static/chart.umd.min.js", "/static/style.css"]
        elif isinstance(route, APIRoute):
            url = route.path.format(**{k: v for k, v in ids.items() if "{" + k in route.path})
            urls.append(url + ("?a=v1&b=v2" if url.endswith("/diff") else ""))
    return urls


@pytest.fixture(scope="module")
def app(filled):
    return create_app(filled.db_url, datasets=[filled.dataset_dir], token=TOKEN)


def test_401_everywhere_without_the_token_200_with_it(app, filled):
    urls = every_url(app, filled)
    assert len(urls) >= 14 and "/" in urls and f"/experiments/{filled.asha_id}" in urls
    with TestClient(app) as c:
        for url in urls:
            assert c.get(url).status_code == 401, url
            assert c.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401, url
            assert c.get(url, headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 401
            assert c.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, url
        body = c.get("/api/experiments").text
        assert "access token" in body and TOKEN not in body


def test_query_token_sets_a_cookie_and_drops_it_from_the_url(app, filled):
    with TestClient(app) as c:
        r = c.get(f"/experiments/{filled.asha_id}?token={TOKEN}&x=1", follow_redirects=False)
        assert r.status_code == 303
        assert r.headers["location"] == f"/experiments/{filled.asha_id}?x=1"
        assert c.cookies.get(f"{COOKIE}_80") == TOKEN  # httponly, per port; sent on later requests
        assert c.get("/api/experiments").status_code == 200
        c.cookies.clear()
        assert c.get("/api/experiments").status_code == 401


def test_comparison_is_constant_time(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth._matches(TOKEN, TOKEN) and not auth._matches("nope", TOKEN)
    assert calls == [(TOKEN.encode(), TOKEN.encode()), (b"nope", TOKEN.encode())]


def _args(**kw) -> argparse.Namespace:
    base = dict(
        workdir="experiments",
        db=None,
        datasets=[],
        host="127.0.0.1",
        port=0,
        token_file=None,
        require_token=False,
    )
    return argparse.Namespace(**{**base, **kw})


def test_non_local_bind_needs_a_token(monkeypatch, tmp_path):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert is_local_host("127.0.0.1") and is_local_host("::1") and is_local_host("localhost")
    assert not is_local_host("0.0.0.0") and not is_local_host("10.1.2.3")
    assert resolve(_args())[1] is None  # local: no token
    with pytest.raises(ConfigError, match=f"--host 0.0.0.0 is not local.*{TOKEN_ENV}"):
        resolve(_args(host="0.0.0.0"))
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(ConfigError, match="at least 16"):
        resolve(_args(host="0.0.0.0"))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert resolve(_args(host="0.0.0.0"))[1] == TOKEN
    assert resolve(_args())[1] is None  # a local bind ignores a token in the environment
    monkeypatch.delenv(TOKEN_ENV)
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert resolve(_args(host="0.0.0.0", token_file=str(path)))[1] == TOKEN
    with pytest.raises(ConfigError, match="no such file"):
        resolve(_args(host="0.0.0.0", token_file=str(tmp_path / "missing")))


def test_redact_filter():
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        "",
        0,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", f"/?token={TOKEN}&a=1", "1.1", 303),
        None,
    )
    RedactTokenFilter().filter(record)
    assert TOKEN not in record.getMessage() and "token=<redacted>&a=1" in record.getMessage()


def _get(url: str, token: str | None = None, opener=None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with (opener or urllib.request.build_opener()).open(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_real_server_in_token_mode(filled):
    port = free_port()
    env = dict(os.environ, **{TOKEN_ENV: TOKEN})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxcore.cli",
            "ui",
            "--db",
            filled.db_url,
            "--port",
            str(port),
            "--datasets",
            str(filled.dataset_dir),
            "--require-token",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = _get(base + "/api/experiments")
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "jaxcore ui did not start within 60 s"
                time.sleep(0.2)
        assert status == 401
        for url in ("/", f"/experiments/{filled.asha_id}", "/static/ui.js", "/api/models"):
            assert _get(base + url)[0] == 401, url
            assert _get(base + url, TOKEN)[0] == 200, url
        # ?token= redirects to the bare URL with the cookie set; the cookie then suffices.
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        status, body = _get(f"{base}/?token={TOKEN}", opener=browser)
        assert status == 200 and "<title>Experiments" in body
        assert _get(base + "/api/models", opener=browser)[0] == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "GET /api/models" in out and "token=<redacted>" in out  # access log is on
    assert TOKEN not in out


def test_cli_refuses_a_non_local_bind_without_a_token(monkeypatch, capsys):
    from jaxcore.ui.cli import main

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 is not local" in err and f"set ${TOKEN_ENV}" in err
