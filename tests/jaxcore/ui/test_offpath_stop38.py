"""The dashboard off its tested path: a store written while a page is being read, a damaged
store file, and rows whose JSON columns do not decode. Each store here is a small one
written through `jaxcore.experiments.Store`; faults are injected deterministically."""

from __future__ import annotations

import contextlib
import json
import pathlib
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from jaxcore.experiments import Store
from jaxcore.launch import free_port
from jaxcore.ui import create_app, queries
from tests.jaxcore.ui.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, require_chromium

SEARCHER = {"searcher": {"name": "random", "metric": "loss", "max_trials": 2}}


def _store(tmp_path: pathlib.Path) -> tuple[str, int, int]:
    """(url, experiment id, trial id): one running trial with one validation."""
    url = f"sqlite:///{tmp_path / 'jaxcore.db'}"
    s = Store(url)
    exp = s.create_experiment("live", SEARCHER, str(tmp_path))
    tid = s.create_trial(exp, {"x": 0.5}, 10)
    s.update_trial(tid, state="RUNNING")
    s.add_metrics(tid, 1, {"loss": 1.0}, kind="validation")
    s.close()
    return url, exp, tid


@pytest.mark.parametrize("route", ["experiments", "trials"])
def test_a_write_during_a_read_is_not_lost_to_the_next_poll(tmp_path, monkeypatch, route):
    """The trial reports its last validation and completes after the page's metrics were
    read but before the answer was sent: the page's next poll must bring that write (the
    answer's revision used to be taken after the data, so the poll said 'unchanged' and
    the page showed the trial RUNNING at step 1 until the store changed again)."""
    url, exp, tid = _store(tmp_path)
    read = queries._metric_rows
    writer = Store(url)

    def read_then_write(*args, **kwargs):
        rows = read(*args, **kwargs)
        monkeypatch.setattr(queries, "_metric_rows", read)  # one write, in the first read
        writer.add_metrics(tid, 10, {"loss": 0.25}, kind="validation")
        writer.update_trial(tid, state="COMPLETED")
        return rows

    monkeypatch.setattr(queries, "_metric_rows", read_then_write)
    path = f"/api/{route}/{exp if route == 'experiments' else tid}"
    try:
        with TestClient(create_app(url)) as c:
            first = c.get(path).json()
            states = first["state"] if route == "trials" else list(first["trials_by_state"])
            assert "RUNNING" in states  # read before the write
            poll = c.get(path, params={"since": first["revision"]}).json()
    finally:
        writer.close()
    assert not poll.get("unchanged"), "the poll hid a write the page never showed"
    if route == "trials":
        assert poll["state"] == "COMPLETED"
        assert [10, 0.25] in poll["series"]["validation"]["loss"]
    else:
        assert poll["trials_by_state"] == {"COMPLETED": 1}
        assert [10, 0.25] in poll["curves"][str(tid)]


def _damage(path: pathlib.Path, how: str) -> None:
    if how == "not a database":
        path.write_bytes(b"these bytes are no SQLite database\n" * 200)
    else:  # cut off mid-page, as a copy interrupted half way leaves it
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])


@pytest.mark.parametrize("how", ["not a database", "truncated"])
def test_a_damaged_store_is_a_503_that_says_what_to_do(tmp_path, how):
    """A damaged store file used to answer every API route with a bare
    '500 Internal Server Error' (and a traceback per poll in the server's log)."""
    url, exp, tid = _store(tmp_path)
    db = tmp_path / "jaxcore.db"
    with sqlite3.connect(db) as con:  # fold the WAL into the file so the cut hits the data
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _damage(db, how)
    with TestClient(create_app(url), raise_server_exceptions=False) as c:
        for path in ("/api/experiments", f"/api/experiments/{exp}", f"/api/trials/{tid}"):
            r = c.get(path)
            assert r.status_code == 503, (path, r.status_code, r.text)
            detail = r.json()["detail"]
            assert str(db) in detail and "cannot be read" in detail
            assert "PRAGMA integrity_check" in detail and "--workdir" in detail
        assert c.get("/").status_code == 200  # the page loads and shows the message


def test_a_row_whose_json_does_not_decode_leaves_the_rest_readable(tmp_path, caplog):
    """A JSON column holding half a document (written by another tool, or a damaged
    page) made every route that read the row a 500: the experiment list for a bad config,
    the experiment and trial pages for one bad metrics row."""
    url, exp, tid = _store(tmp_path)
    s = Store(url)
    other = s.create_experiment("bad config", SEARCHER, str(tmp_path))
    good = s.create_trial(exp, {"x": 0.1}, 10)
    s.add_metrics(good, 2, {"loss": 0.5}, kind="validation")
    s.add_metrics(good, 3, {"loss": 0.4}, kind="validation")
    s.add_metrics(tid, 2, {"loss": 0.75}, kind="validation")
    s.close()
    values = 'UPDATE jaxcore_metrics SET "values" = ? WHERE trial_id = ? AND step = ?'
    with sqlite3.connect(tmp_path / "jaxcore.db") as con:
        con.execute(values, ('{"loss": 0.7', tid, 2))  # cut off
        con.execute(values, ("[0.4]", good, 3))  # valid JSON, but not the mapping written there
        con.execute("UPDATE jaxcore_trials SET hparams = ? WHERE id = ?", ("[1, 2", tid))
        con.execute("UPDATE jaxcore_experiments SET config = ? WHERE id = ?", ('{"a": ', other))
    with TestClient(create_app(url), raise_server_exceptions=False) as c:
        listed = c.get("/api/experiments")
        assert listed.status_code == 200, listed.text
        assert {e["name"] for e in listed.json()["experiments"]} == {"live", "bad config"}
        detail = c.get(f"/api/experiments/{exp}")
        assert detail.status_code == 200, detail.text
        rows = {t["id"]: t for t in detail.json()["trials_detail"]}
        assert rows[tid]["hparams"] == {} and rows[good]["hparams"] == {"x": 0.1}
        assert detail.json()["curves"][str(good)] == [[2, 0.5]]
        trial = c.get(f"/api/trials/{tid}")
        assert trial.status_code == 200, trial.text
        assert trial.json()["series"]["validation"]["loss"] == [[1, 1.0]]
        bad = c.get(f"/api/experiments/{other}")
        assert bad.status_code == 200 and bad.json()["config"] is None, bad.text
        c.get(f"/api/experiments/{exp}")  # a poll: the same rows again
    warned = [r.getMessage() for r in caplog.records if "holds no valid JSON" in r.getMessage()]
    assert len(warned) == len(set(warned)) == 3, warned  # once per bad value, not per poll


def _version(root: pathlib.Path, name: str, manifest: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "manifest.json").write_text(manifest)


def test_a_damaged_snapshot_manifest_is_named_not_a_500(tmp_path):
    """One version folder whose manifest.json is cut off (or is not a build's manifest)
    made /api/datasets a 500, so the datasets page showed none of the good versions."""
    out = tmp_path / "out"
    good = {
        "version": "v1",
        "inputs": {"files": 3},
        "outputs": {"files": 2, "bytes": 100},
        "dropped": {"files": 1},
        "stages": [{"name": "filter", "files_in": 3, "files_out": 2, "dropped": {"size": 1}}],
    }
    _version(out, "v1", json.dumps(good))
    _version(out, "v2", json.dumps(good)[:40])
    _version(out, "v3", json.dumps({**good, "version": "v3", "stages": [{"files_in": 1}]}))
    url = f"sqlite:///{tmp_path / 'none.db'}"
    with TestClient(create_app(url, datasets=[out]), raise_server_exceptions=False) as c:
        r = c.get("/api/datasets")
        assert r.status_code == 200, r.text
        (ds,) = r.json()["datasets"]
        assert [v["version"] for v in ds["versions"]] == ["v1"]
        damaged = {d["version"]: d["error"] for d in ds["damaged"]}
        assert set(damaged) == {"v2", "v3"}
        assert "not valid JSON" in damaged["v2"] and "rerun the build" in damaged["v2"]
        assert "a 'stages' entry has no 'name'" in damaged["v3"]
        diff = c.get("/api/datasets/out/diff", params={"a": "v1", "b": "v2"})
        assert diff.status_code == 400 and "no finished version 'v2'" in diff.text


@contextlib.contextmanager
def _serving(app: Any) -> Iterator[str]:
    """The app on a real uvicorn server in a thread; yields its base URL."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        assert thread.is_alive(), "uvicorn did not start"
        thread.join(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def test_the_pages_say_what_is_damaged(tmp_path):
    """In Chromium: the datasets page shows the good version and names the damaged one;
    the experiments page over a damaged store shows the store's error text."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    out = tmp_path / "out"
    good = {"inputs": {"files": 1}, "outputs": {"files": 1, "bytes": 9}, "dropped": {"files": 0}}
    _version(out, "v1", json.dumps({**good, "version": "v1", "stages": []}))
    _version(out, "v2", "{")
    db = tmp_path / "jaxcore.db"
    db.write_bytes(b"these bytes are no SQLite database\n" * 200)
    app = create_app(f"sqlite:///{db}", datasets=[out])
    with _serving(app) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{base}/datasets")
            damaged = page.locator("p.damaged[data-version=v2]")
            assert "is not valid JSON" in damaged.text_content()
            assert page.locator("table.versions tr[data-version=v1]").count() == 1
            page.goto(base)
            error = page.locator("#error")
            error.wait_for(state="visible")
            assert "HTTP 503" in error.text_content() and "PRAGMA integrity_check" in (
                error.text_content()
            )
        finally:
            browser.close()
