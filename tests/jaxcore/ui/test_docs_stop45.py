"""The Dashboard and Notebooks sections driven as a user would, then one step off the path.

`jaxcore ui`'s command line (no server is started: `_serve` is replaced, so a refusal is
seen before anything listens) and the notebooks' install cell run with a Python that
cannot import jaxcore and a stand-in pip.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import sqlite3
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa

from jaxcore.errors import ConfigError
from jaxcore.launch import free_port
from jaxcore.ui import cli, create_app, queries
from jaxcore.ui.auth import TOKEN_ENV
from tests.jaxcore.ui.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, require_chromium
from tests.jaxcore.ui.test_offpath_stop38 import _serving, _store

TOKEN = "0123456789abcdef-token"
PORT = str(free_port())  # free now; each main() binds and closes it
EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture
def served(monkeypatch):
    """`jaxcore ui` up to the point where it would serve: the calls to `_serve`."""
    import uvicorn

    calls: list[tuple] = []

    def fake(app, sock):
        calls.append((app, sock.getsockname()))
        sock.close()

    monkeypatch.setattr(cli, "_serve", fake, raising=False)
    # (the code before `_serve` called uvicorn.run: recorded too, so the old code is seen)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw["port"])))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for var in ("JAXCORE_DB", "JAXCORE_DB_URL"):
        monkeypatch.delenv(var, raising=False)
    return calls


def _args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(
        workdir=str(tmp_path / "experiments"),
        db=None,
        datasets=[],
        host="127.0.0.1",
        port=8765,
        token_file=None,
        require_token=False,
    )
    return argparse.Namespace(**{**base, **kw})


def test_an_empty_token_file_is_named_not_called_a_non_local_host(tmp_path, monkeypatch):
    """`--token-file empty.tok` said "--host 127.0.0.1 is not local"; a folder said "no such
    file"; a file that is not text (a key in DER form) was a UnicodeDecodeError traceback."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    empty = tmp_path / "empty.tok"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"--token-file .*empty\.tok is empty; .*openssl rand"):
        cli.resolve(_args(tmp_path, token_file=str(empty)))
    with pytest.raises(ConfigError, match=r"is a folder"):
        cli.resolve(_args(tmp_path, token_file=str(tmp_path)))
    binary = tmp_path / "key.der"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 8)
    with pytest.raises(ConfigError, match=r"key\.der is not a text file"):
        cli.resolve(_args(tmp_path, token_file=str(binary)))
    two = tmp_path / "two.tok"
    two.write_text(f"{TOKEN}\n{TOKEN}\n")  # a Bearer header or a cookie cannot carry it
    with pytest.raises(ConfigError, match=r"one line without spaces"):
        cli.resolve(_args(tmp_path, token_file=str(two)))


def test_a_token_file_every_user_can_read_is_warned(tmp_path, served, capsys):
    """A token file left at mode 0644 (what `echo ... > tok` makes) guards nothing on the
    shared machine `--token-file` is for: the startup says so, with the chmod."""
    tok = tmp_path / "ui.tok"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o644)
    argv = ["--workdir", str(tmp_path), "--token-file", str(tok), "--port", PORT]
    assert cli.main(argv) == 0 and len(served) == 1
    out = capsys.readouterr()
    assert f"chmod 600 {tok}" in out.err and "every user" in out.err and TOKEN not in out.out
    tok.chmod(0o600)
    assert cli.main(argv) == 0 and len(served) == 2
    assert "chmod" not in capsys.readouterr().err


def test_a_taken_port_is_one_line_before_any_url(tmp_path, served, capsys):
    """A second `jaxcore ui` printed "jaxcore ui: http://127.0.0.1:8765/" as if serving,
    then uvicorn's startup, an "[Errno 98]" ERROR and its shutdown, exit status 3."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert cli.main(["--workdir", str(tmp_path), "--port", str(port)]) == 2
    out = capsys.readouterr()
    assert not served and "http://" not in out.out
    assert f"port {port} on 127.0.0.1 is in use" in out.err and "--port" in out.err
    assert len(out.err.strip().splitlines()) == 1, out.err


def test_a_workdir_or_datasets_that_cannot_hold_what_they_should_is_refused(
    tmp_path, served, capsys
):
    """`--workdir exp.yaml` (a file) said "no store ... yet; the pages fill in once an
    experiment starts there" (none ever can); `--datasets` given a file said the same, and
    a folder inside a version (`out/v1/shards`) served an empty dataset without a word."""
    (tmp_path / "exp.yaml").write_text("name: x\n")
    shards = tmp_path / "out" / "v1" / "shards"
    shards.mkdir(parents=True)
    (tmp_path / "out" / "v1" / "manifest.json").write_text("{}")
    cases = {
        ("--workdir", str(tmp_path / "exp.yaml")): "is a file, not an experiment workdir",
        ("--workdir", str(tmp_path / "exp.yaml" / "sub")): "is a file, not an experiment",
        ("--datasets", str(tmp_path / "exp.yaml")): "is a file, not a 'data build' output_dir",
        ("--datasets", str(shards)): f"give its output_dir: --datasets {tmp_path / 'out'}",
    }
    for (flag, value), said in cases.items():
        argv = ["--workdir", str(tmp_path), "--port", PORT, flag, value]
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not served


def test_the_store_url_line_hides_its_password_and_a_path_is_named(tmp_path, served, capsys):
    """The startup line printed `store postgresql://u:secretpw@...` (a password in every log
    that captures stdout); `--db experiments/jaxcore.db` (a path) was a SQLAlchemy
    ArgumentError traceback."""
    url = "postgresql://ui:secretpw@127.0.0.1:1/jaxcore"
    assert cli.main(["--db", url, "--port", PORT]) == 0 and served
    out = capsys.readouterr()
    assert "secretpw" not in out.out + out.err and "127.0.0.1:1/jaxcore" in out.out
    db = tmp_path / "experiments" / "jaxcore.db"
    assert cli.main(["--db", str(db), "--port", PORT]) == 2 and len(served) == 1
    err = capsys.readouterr().err
    assert f"--db {str(db)!r} is not a database URL" in err and f"sqlite:///{db}" in err


def test_jaxcore_db_is_the_store_as_for_the_experiment_commands(
    tmp_path, served, monkeypatch, capsys
):
    """The README's store variable is $JAXCORE_DB (`jaxcore experiment ...`, `inference`);
    `jaxcore ui` read only $JAXCORE_DB_URL and showed ./experiments instead."""
    url = f"sqlite:///{tmp_path / 'team' / 'jaxcore.db'}"
    monkeypatch.setenv("JAXCORE_DB", url)
    assert cli.resolve(_args(tmp_path))[0] == url
    assert cli.resolve(_args(tmp_path, db="sqlite:////x.db"))[0] == "sqlite:////x.db"
    assert cli.main(["--workdir", str(tmp_path), "--port", PORT]) == 0 and served
    out = capsys.readouterr()
    assert f"store {url}" in out.out
    assert f"--workdir {tmp_path} is not used: $JAXCORE_DB names the store" in out.err


def test_create_app_checks_its_token_and_url_as_the_command_does(tmp_path):
    """From Python (the README's `create_app(db_url, datasets=[...], token=None)`):
    `token=os.environ.get(...)` read as "" made an app whose server failed at its first
    request (ValueError from the middleware), a 5-character token was accepted (the
    command refuses it), and a path for db_url was a SQLAlchemy ArgumentError."""
    url = f"sqlite:///{tmp_path / 'jaxcore.db'}"
    for token, said in (("", "is empty"), ("short", "has 5 characters"), ("a b" * 8, "spaces")):
        with pytest.raises(ConfigError, match=rf"create_app\(token=\.\.\.\) ({said}|.*{said})"):
            create_app(url, token=token)
    with pytest.raises(ConfigError, match="is not a database URL; write sqlite:///"):
        create_app(str(tmp_path / "jaxcore.db"))
    assert create_app(url, token=TOKEN).state.reader.url == url


def test_a_tilde_is_the_home_folder(tmp_path, served, monkeypatch, capsys):
    """`--workdir=~/experiments` (no shell expands a `~` after `=`) showed
    ./~/experiments/jaxcore.db, "no store ... yet"; the experiment commands read `~` as
    the home folder (README), so `jaxcore ui` does too, for --datasets and --token-file."""
    from fastapi.testclient import TestClient

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ui.tok").write_text(TOKEN)
    (tmp_path / "ui.tok").chmod(0o600)
    argv = ["--workdir=~/experiments", "--datasets=~/out", "--token-file=~/ui.tok"]
    assert cli.main([*argv, "--port", PORT]) == 0 and len(served) == 1
    out = capsys.readouterr()
    assert f"store sqlite:///{tmp_path / 'experiments' / 'jaxcore.db'}" in out.out
    assert f"no folder {tmp_path / 'out'} yet" in out.err and "/~/" not in out.out + out.err
    with TestClient(served[0][0]) as c:
        roots = c.get("/api/models", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert roots["datasets"] == {"out": str(tmp_path / "out")}


def test_a_page_addressed_by_name_says_pages_take_ids(tmp_path):
    """`/experiments/asha-quad` (the name the list shows) answered FastAPI's JSON
    validation error, `{"detail":[{"type":"int_parsing",...`, as the page."""
    from fastapi.testclient import TestClient

    url, exp, tid = _store(tmp_path)
    with TestClient(create_app(url)) as c:
        for path, kind in (("/experiments/live", "experiment"), ("/trials/7a", "trial")):
            r = c.get(path)
            assert r.status_code == 404 and r.headers["content-type"].startswith("text/plain")
            assert f"/{kind}s/ takes a {kind}'s id" in r.text and "int_parsing" not in r.text
        assert c.get(f"/experiments/{exp}").headers["content-type"].startswith("text/html")
        assert c.get(f"/trials/{tid}").status_code == 200


# ---------------------------------------------------------------- the notebooks' install cell
_PIP_SHIM = """
import json, os, sys
with open(os.environ["PIP_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.mark.parametrize("name", ["quickstart.ipynb", "finetune_hf.ipynb"])
def test_install_cell_names_a_source_pip_cannot_use(name, tmp_path):
    """`JAXCORE_SOURCE` set to a folder that is not there (a typo, a path with spaces
    quoted twice) or to the GitHub page's https URL (no `git+`) went to pip, whose error
    ended in a CalledProcessError traceback; the cell now says which and how to write it."""
    cell = next(
        c for c in json.loads((EXAMPLES / name).read_text())["cells"] if c["cell_type"] == "code"
    )
    shim = tmp_path / "shim"
    (shim / "pip").mkdir(parents=True)
    (shim / "pip" / "__main__.py").write_text(_PIP_SHIM)
    (shim / "pip" / "__init__.py").write_text("")
    log = tmp_path / "pip.log"
    cases = {
        str(tmp_path / "my code" / "jaxcore"): "is not a folder",
        "https://github.com/someone/jaxcore": "git+https://github.com/someone/jaxcore",
    }
    for source, said in cases.items():
        proc = subprocess.run(
            # -I -S: no site-packages, so jaxcore is not importable in the cell; the pip it
            # starts (without those flags) finds the stand-in first on PYTHONPATH.
            [sys.executable, "-I", "-S", "-c", "".join(cell["source"])],
            env={
                **os.environ,
                "JAXCORE_SOURCE": source,
                "PYTHONPATH": str(shim),
                "PIP_LOG": str(log),
            },
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1 and said in proc.stderr, proc.stderr
        assert "CalledProcessError" not in proc.stderr and not log.exists(), log.read_text()


# ---------------------------------------------------------------- in Chromium
@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for this file's page tests (as tests/jaxcore/ui/test_browser)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def test_the_error_leaves_the_page_once_the_store_answers_again(tmp_path, monkeypatch, chromium):
    """The README: an unreadable store's 503 is "shown on the page while it keeps polling".
    Once the store answered again (a lock released, a file restored, `jaxcore ui`
    restarted) the page drew fresh data under the stale error, which stayed for good."""
    url, exp, _tid = _store(tmp_path)
    broken = threading.Event()
    revision = queries.revision

    def unreadable_while_broken(*args, **kw):  # the fault: the store read fails, real 503
        if broken.is_set():
            cause = sqlite3.DatabaseError("database disk image is malformed")
            raise sa.exc.OperationalError("SELECT max(id) FROM metrics", {}, cause)
        return revision(*args, **kw)

    monkeypatch.setattr(queries, "revision", unreadable_while_broken)
    with _serving(create_app(url)) as base:
        context = chromium.new_context()
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.clock.install()  # the page's 1 s poll timer runs when the test says
            broken.set()  # unreadable when the page opens (a writer's lock, a damaged file)
            page.goto(f"{base}/experiments/{exp}")
            error = page.locator("#error")
            error.wait_for(state="visible")
            assert "HTTP 503" in error.text_content() and "malformed" in error.text_content()
            page.clock.fast_forward(1_000)  # a poll while it is still unreadable: kept
            assert "HTTP 503" in error.text_content() and error.is_visible()
            broken.clear()
            page.clock.fast_forward(1_000)  # the next poll answers
            error.wait_for(state="hidden", timeout=3_000)
            assert page.locator("#live[data-revision]").count() == 1  # and draws the data
            assert page.locator("#title").text_content() == f"Experiment #{exp}: live"
        finally:
            context.close()


def test_two_dashboards_on_one_host_keep_their_own_login(tmp_path):
    """Two `jaxcore ui` servers with their own tokens on one machine (ports 8765, 8766):
    browsers keep cookies per host, not per port (RFC 6265; urllib's cookie jar is such a
    browser here), so logging in to the second replaced the first's `jaxcore_ui_token`
    cookie and the first answered 401 from then on. The cookie is named per port now (as
    Jupyter's login cookie is)."""
    import urllib.error
    import urllib.request
    from http.cookiejar import CookieJar

    url, exp, _tid = _store(tmp_path)
    tokens = ("a" * 20, "b" * 20)
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))

    def status(address: str) -> int:
        try:
            with browser.open(address, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    with (
        _serving(create_app(url, token=tokens[0])) as a,
        _serving(create_app(url, token=tokens[1])) as b,
    ):
        assert status(f"{a}/?token={tokens[0]}") == 200
        assert status(f"{b}/?token={tokens[1]}") == 200  # the second dashboard's login
        assert status(f"{a}/api/experiments/{exp}") == 200  # the first one still open
        assert status(f"{b}/api/experiments/{exp}") == 200
