"""Off the tested path (round 40): diverged metrics on the dashboard, odd categorical
choices, and two commands writing one store.

Stores here are small ones written through `jaxcore.experiments.Store`; faults are
injected deterministically (a file barrier, a held lock), never by sleeping.
"""

from __future__ import annotations

import pathlib
import re
import sqlite3
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from jaxcore.experiments import Store
from jaxcore.ui import create_app
from tests.jaxcore.experiments.conftest import OBJECTIVES

NAN, INF = float("nan"), float("inf")
ASHA = {"searcher": {"name": "adaptive_asha", "metric": "loss", "max_trials": 6}}


def _diverged_store(tmp_path: pathlib.Path) -> tuple[str, int, dict[str, int]]:
    """(url, experiment id, trial id by label): an ASHA rung at step 2 where trials
    reported NaN, +inf, -inf, 0.5 and 0.7, and one trial that has not reported yet."""
    url = f"sqlite:///{tmp_path / 'jaxcore.db'}"
    s = Store(url)
    exp = s.create_experiment("diverged", ASHA, str(tmp_path))
    ids = {}
    for label, value in [("nan", NAN), ("inf", INF), ("-inf", -INF), ("0.5", 0.5), ("0.7", 0.7)]:
        tid = s.create_trial(exp, {"lr": 0.1}, 4, milestones=[2, 4])
        s.add_metrics(tid, 2, {"loss": value}, kind="validation")
        s.update_trial(tid, state="COMPLETED", steps_done=2)
        ids[label] = tid
    ids["none"] = s.create_trial(exp, {"lr": 0.2}, 4, milestones=[2, 4])
    s.update_experiment(exp, best_metric=0.5)
    s.close()
    return url, exp, ids


def test_the_dashboard_api_tells_nan_and_inf_from_a_missing_value(tmp_path):
    """NaN, +inf and -inf validations all came out of the API as ``null`` (JSON has no
    NaN), the same as a trial that never reported; the 'best trial' was the NaN one
    (``min`` over keys where NaN compares false with everything), and ASHA's rung listed
    the diverged trials first. Non-finite numbers are now the strings "NaN", "Infinity",
    "-Infinity", never the best, and rank last."""
    url, exp, ids = _diverged_store(tmp_path)
    with TestClient(create_app(url)) as c:
        d = c.get(f"/api/experiments/{exp}").json()
        rows = {t["id"]: t for t in d["trials_detail"]}
        assert d["best_trial"] == ids["0.5"]
        spelled = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity", "0.5": 0.5}
        for label, wire in spelled.items():
            assert rows[ids[label]]["best_metric"] == wire, label
            assert rows[ids[label]]["latest_metric"] == wire, label
            assert d["curves"][str(ids[label])] == [[2, wire]], label
        assert rows[ids["none"]]["best_metric"] is None  # missing stays null
        ((rung2, _rung4),) = [b["rungs"] for b in d["asha"]]
        order = [t["trial"] for t in rung2["trials"]]
        assert order == [ids[k] for k in ("0.5", "0.7", "-inf", "inf", "nan")]
        t = c.get(f"/api/trials/{ids['nan']}").json()
        assert t["best_metric"] == "NaN"
        assert t["series"]["validation"]["loss"] == [[2, "NaN"]]


def test_a_trial_best_is_its_best_finite_value(tmp_path):
    """A trial that reported 0.4 and then diverged has best 0.4 (``min`` over its values
    returned NaN when NaN came first); a larger-is-better search never ranks +inf best."""
    url = f"sqlite:///{tmp_path / 'jaxcore.db'}"
    s = Store(url)
    exp = s.create_experiment(
        "acc",
        {"searcher": {"name": "random", "metric": "acc", "smaller_is_better": False}},
        str(tmp_path),
    )
    a = s.create_trial(exp, {}, 4)
    for step, v in [(1, NAN), (2, 0.4), (3, INF)]:
        s.add_metrics(a, step, {"acc": v}, kind="validation")
    b = s.create_trial(exp, {}, 4)
    s.add_metrics(b, 1, {"acc": 0.3}, kind="validation")
    s.close()
    with TestClient(create_app(url)) as c:
        d = c.get(f"/api/experiments/{exp}").json()
        rows = {t["id"]: t for t in d["trials_detail"]}
        assert rows[a]["best_metric"] == 0.4 and rows[a]["latest_metric"] == "Infinity"
        assert d["best_trial"] == a
        assert c.get(f"/api/trials/{a}").json()["best_metric"] == 0.4


def test_the_pages_show_diverged_values_apart_from_missing_ones(tmp_path):
    """In Chromium: the trials table shows NaN / +inf / -inf (marked as diverged) where it
    showed '–' for all of them, keeps '–' for a trial with no report, highlights the
    finite best trial, and the chart draws no point for a non-finite value."""
    from playwright.sync_api import sync_playwright

    from tests.jaxcore.ui.test_browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, require_chromium
    from tests.jaxcore.ui.test_offpath_stop38 import _serving

    require_chromium()
    url, exp, ids = _diverged_store(tmp_path)
    with _serving(create_app(url)) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/experiments/{exp}")
            page.locator("#trials-table tbody tr").nth(5).wait_for()

            def cell(label: str, col: str) -> str:
                return page.locator(f"#trials-table tr[data-trial='{ids[label]}'] td.{col}")

            shown = {k: cell(k, "best").text_content() for k in ids}
            assert shown == {
                "nan": "NaN",
                "inf": "+inf",
                "-inf": "-inf",
                "0.5": "0.5",
                "0.7": "0.7",
                "none": "–",
            }, shown
            for k in ("nan", "inf", "-inf"):
                assert cell(k, "best").locator("span.diverged").count() == 1, k
            assert cell("0.5", "best").locator("span.diverged").count() == 0
            best_row = page.locator("#trials-table tr.best")
            assert best_row.get_attribute("data-trial") == str(ids["0.5"])
            ys = page.evaluate(
                "() => Object.fromEntries(Chart.getChart('curves').data.datasets"
                ".map(d => [d.trialId, d.data.map(p => p.y)]))"
            )
            assert ys[str(ids["0.5"])] == [0.5]
            assert ys[str(ids["nan"])] == [None] and ys[str(ids["inf"])] == [None]
            chips = page.locator("a.chip").all_text_contents()
            assert chips[0].endswith("0.5") and chips[-1].endswith("NaN"), chips
            page.goto(f"{base}/trials/{ids['nan']}")
            page.locator("#best-metric span.diverged").wait_for()
            assert page.locator("#best-metric").text_content() == "NaN"
            assert not errors, errors
        finally:
            browser.close()


# --------------------------------------------------------------------------- Optuna study
def _bayesian_raw(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict]:
    db = tmp_path / "jaxcore.db"
    Store(f"sqlite:///{db}").close()
    raw = {
        "name": "bayes",
        "entrypoint": f"{OBJECTIVES}:bowl",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {"x": {"type": "double", "minval": 0, "maxval": 1}},
        "searcher": {
            "name": "bayesian",
            "metric": "loss",
            "max_trials": 2,
            "max_length": 1,
            "optuna_storage": f"sqlite:///{db}",
        },
    }
    return db, raw


def _bayesian(tmp_path: pathlib.Path) -> tuple[pathlib.Path, Any]:
    from jaxcore.experiments import parse_config

    db, raw = _bayesian_raw(tmp_path)
    return db, parse_config(raw)


def test_two_commands_creating_the_optuna_tables_at_once_both_work(tmp_path, monkeypatch):
    """Two `jaxcore experiment create` of a bayesian search whose study lives in a fresh
    store: both saw no Optuna schema, both stamped it, and the second died with a
    traceback (UNIQUE constraint failed: alembic_version.version_num), leaving its
    experiment ACTIVE with no loop. The other process's stamp is injected at that line."""
    from alembic.runtime.migration import HeadMaintainer

    from jaxcore.experiments.searchers.bayesian import BayesianSearch

    db, cfg = _bayesian(tmp_path)
    insert = HeadMaintainer._insert_version

    def the_other_process_stamps_first(self, version):
        monkeypatch.setattr(HeadMaintainer, "_insert_version", insert)  # once
        with sqlite3.connect(db) as con:  # it read "no version" too, and commits first
            con.execute("INSERT INTO alembic_version VALUES (?)", (version,))
        insert(self, version)

    monkeypatch.setattr(HeadMaintainer, "_insert_version", the_other_process_stamps_first)
    search = BayesianSearch(cfg, study_name="jaxcore-exp-1")
    assert [len(a.hparams) for a in search.initial()] == [1, 1]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)


def test_a_study_locked_by_another_process_is_waited_for(tmp_path):
    """A study database held by another writer (a second `jaxcore experiment` on the
    store, a sqlite3 shell in a transaction) for more than SQLite's default 5 s made the
    searcher die with 'database is locked'; the store's own writes wait up to 60 s. The
    searcher now waits as the store does. The lock is released after 6 s: past sqlite3's
    5 s default, well inside the store's 60 s."""
    from jaxcore.experiments.searchers.bayesian import BayesianSearch

    db, cfg = _bayesian(tmp_path)
    BayesianSearch(cfg, study_name="jaxcore-exp-0")  # the Optuna tables exist
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(6.0, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        search = BayesianSearch(cfg, study_name="jaxcore-exp-1")
        assert len(search.initial()) == 2
    finally:
        release.join()
        holder.close()


# --------------------------------------------------------------------------- search space
@pytest.mark.parametrize(
    ("vals", "says"),
    [
        ([1, 1.0], "1 and 1.0 are the same choice"),
        ([1, "a", True], "1 and True are the same choice"),
        ([0, False, None], "0 and False are the same choice"),
        ([[1, 2], [3], [1, 2]], r"\[1, 2\] and \[1, 2\] are the same choice"),
        ([{"a": 1}, {"a": 1.0}], "are the same choice"),
    ],
)
def test_categorical_choices_that_compare_equal_are_refused(tmp_path, vals, says):
    """[1, true] was accepted; Optuna records a categorical choice by ``list.index``, so
    a bayesian trial that ran with `true` was told to the study as having run with 1 (and
    a grid ran the same point twice)."""
    from jaxcore.errors import ConfigError
    from jaxcore.experiments import parse_config

    _, raw = _bayesian_raw(tmp_path)
    raw = {**raw, "hyperparameters": {"c": {"type": "categorical", "vals": vals}}}
    with pytest.raises(ConfigError, match=rf"hyperparameters\.c\.vals: .*{says}.*list each"):
        parse_config(raw)


def test_unhashable_and_mixed_choices_are_each_sampled(tmp_path):
    """Lists, mappings, None and strings in one categorical: every searcher hands the
    trial the value itself (Optuna keeps the index of a choice it cannot store)."""
    from jaxcore.experiments import parse_config
    from jaxcore.experiments.searchers.bayesian import BayesianSearch
    from jaxcore.experiments.searchers.simple import GridSearch

    vals = [[1, 2], {"a": 1}, None, "x", 2.5]
    _, raw = _bayesian_raw(tmp_path)
    raw = {**raw, "hyperparameters": {"c": {"type": "categorical", "vals": vals}}}
    grid = GridSearch(parse_config({**raw, "searcher": {**raw["searcher"], "name": "grid"}}))
    assert [a.hparams["c"] for a in grid.initial()] == vals
    raw["searcher"] = {**raw["searcher"], "max_trials": 40, "max_concurrent_trials": 40}
    seen = [a.hparams["c"] for a in BayesianSearch(parse_config(raw)).initial()]
    assert all(v in vals for v in seen) and len({repr(v) for v in seen}) == len(vals)


# --------------------------------------------------------------------------- the store
RO_SCRIPT = r"""
set -u
mount --bind "$SRC" "$DST" && mount -o remount,bind,ro "$DST" || exit 90
touch "$DST/probe" 2>/dev/null && exit 91   # the mount really refuses writes
for cmd in "experiment list" "experiment describe 1" "trial describe 1 --metrics" \
           "model list" "model create m"; do
  echo "@@@ $cmd"; $JAXCORE $cmd --db "sqlite:///$DST/work/jaxcore.db" 2>&1; echo "@@@rc=$?"
done
echo "@@@ create"; $JAXCORE experiment create "$DST/x.yaml" --quiet --executor inline 2>&1
echo "@@@rc=$?"
echo "@@@ new store"; $JAXCORE experiment create "$DST/new.yaml" --quiet 2>&1; echo "@@@rc=$?"
echo "@@@ ui"; $PY -c "
from fastapi.testclient import TestClient
from jaxcore.ui import create_app
with TestClient(create_app('sqlite:///$DST/work/jaxcore.db')) as c:
    r = c.get('/api/experiments')
    print(r.status_code, [e['state'] for e in r.json()['experiments']])
" 2>&1; echo "@@@rc=$?"
"""


def _sections(out: str) -> dict[str, tuple[str, int]]:
    parts = {}
    for chunk in out.split("@@@ ")[1:]:
        name, _, rest = chunk.partition("\n")
        body, _, rc = rest.rstrip("\n").rpartition("@@@rc=")
        parts[name] = (body, int(rc))
    return parts


def test_a_store_on_a_read_only_file_system_reads_and_refuses_writes_in_one_line(tmp_path):
    """An experiments folder on a read-only mount (an archive, a read-only share): every
    command, even `experiment list`, died with a traceback ('unable to open database
    file': SQLite cannot create the WAL database's -shm file there), and so did the
    dashboard's API. Reads now work; a write is one line saying what to do. The mount is a
    real one, in a user+mount namespace of its own (`unshare`), gone with the process."""
    import os
    import shutil
    import subprocess
    import sys

    import yaml

    from jaxcore.experiments import run_experiment

    src, dst = tmp_path / "src", tmp_path / "dst"
    dst.mkdir()
    raw = {
        "name": "archived",
        "entrypoint": f"{OBJECTIVES}:bowl",
        "workdir": str(src / "work"),
        "hyperparameters": {"x": {"type": "double", "minval": 0, "maxval": 1}, "y": 0.5},
        "searcher": {"name": "random", "metric": "loss", "max_trials": 2, "max_length": 1},
    }
    assert run_experiment(raw, executor="inline").state == "COMPLETED"
    (src / "x.yaml").write_text(yaml.safe_dump({**raw, "workdir": str(dst / "work")}))
    (src / "new.yaml").write_text(yaml.safe_dump({**raw, "workdir": str(dst / "new")}))
    unshare = shutil.which("unshare")
    assert unshare, "the test needs util-linux's unshare (apt-get install util-linux)"
    bindir = pathlib.Path(sys.executable).parent
    env = dict(
        os.environ, SRC=str(src), DST=str(dst), JAXCORE=str(bindir / "jaxcore"), PY=sys.executable
    )
    run = subprocess.run(
        [unshare, "--map-root-user", "--mount", "bash", "-c", RO_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    got = _sections(run.stdout)
    for cmd in (
        "experiment list",
        "experiment describe 1",
        "trial describe 1 --metrics",
        "model list",
    ):
        body, rc = got[cmd]
        assert rc == 0 and "Traceback" not in body, (cmd, body)
    assert "COMPLETED" in got["experiment list"][0]
    for cmd in ("model create m", "create"):
        body, rc = got[cmd]
        last = body.strip().splitlines()[-1]
        assert rc == 2 and "Traceback" not in body, (cmd, body)
        assert "is read-only here" in last and "--db sqlite:///COPY" in last, last
    body, rc = got["new store"]
    assert rc == 2 and "cannot be created" in body and "Traceback" not in body, body
    assert got["ui"] == ("200 ['COMPLETED']\n", 0), got["ui"]


@pytest.mark.parametrize("how", ["cut short", "not a database"])
@pytest.mark.parametrize(
    "argv", [["experiment", "list"], ["experiment", "resume", "1"], ["model", "list"]]
)
def test_a_damaged_store_is_one_line_naming_the_check(tmp_path, capsys, how, argv):
    """A store file cut short (a copy interrupted half way) or overwritten: every command
    printed a SQLAlchemy traceback ('database disk image is malformed')."""
    from jaxcore.experiments.cli import main

    db = tmp_path / "jaxcore.db"
    s = Store(f"sqlite:///{db}")
    exp = s.create_experiment("x", ASHA, str(tmp_path))
    for i in range(50):
        s.add_metrics(s.create_trial(exp, {"i": i}, 4), 1, {"loss": 0.1 * i}, kind="validation")
    s.close()
    with sqlite3.connect(db) as con:  # fold the WAL into the file, so the cut hits the data
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3] if how == "cut short" else b"not sqlite\n" * 500)
    assert main([*argv, "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert f"the experiment store {db} is damaged" in err[-1]
    assert f"sqlite3 {db} 'PRAGMA integrity_check'" in err[-1]


# --------------------------------------------------------------------------- registry
@pytest.fixture
def registry(tmp_path):
    from jaxcore.experiments import Registry

    reg = Registry(f"sqlite:///{tmp_path}/store/jaxcore.db")
    yield reg
    reg.store.close()


@pytest.fixture
def state_ckpt(tmp_path) -> pathlib.Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "state.json").write_text('{"state": {"a": 1}}')
    return ckpt


def test_creating_one_model_name_twice_at_once_is_a_config_error(registry, monkeypatch, capsys):
    """Two `jaxcore model create tiny-lm` at once: both checked that the name was free,
    and the second's insert died with a traceback (sqlite3.IntegrityError: UNIQUE
    constraint failed: jaxcore_models.name). The other command's insert is injected
    between this one's check and its insert."""
    from jaxcore.experiments.cli import main

    insert = Store.create_model

    def the_other_command_inserts_first(self, name, *args, **kwargs):
        monkeypatch.setattr(Store, "create_model", insert)
        other = Store(self.url)
        other.create_model(name)
        other.close()
        return insert(self, name, *args, **kwargs)

    monkeypatch.setattr(Store, "create_model", the_other_command_inserts_first)
    assert main(["model", "create", "tiny-lm", "--db", registry.store.url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1] == ("jaxcore model: model 'tiny-lm' already exists; register a version instead.")
    assert [m["name"] for m in registry.list()] == ["tiny-lm"]


def test_a_version_whose_files_were_deleted_by_hand_says_so(registry, state_ckpt):
    """`registry.load` of a version whose folder was removed by hand raised a bare
    FileNotFoundError from inside the loader."""
    import shutil

    from jaxcore.errors import ConfigError

    registry.create_model("m")
    v = registry.register("m", checkpoint=str(state_ckpt), aliases=["prod"])
    path = pathlib.Path(registry.version("m", v)["path"])
    shutil.rmtree(path.parent)
    with pytest.raises(
        ConfigError,
        match=rf"model 'm' version {v}: its files are gone "
        rf"\(no {re.escape(str(path))};.*jaxcore model register m CHECKPOINT",
    ):
        registry.load("m", "prod")


def test_compare_ranks_diverged_versions_last(registry, state_ckpt):
    """`Registry.compare` sorted by the raw metric: a NaN loss in the list left it out of
    order (NaN compares false), so 'best first' could start with a worse version."""
    from jaxcore.experiments import store as st

    registry.create_model("m")
    losses = [0.5, NAN, 0.2, INF, 0.3]
    for loss in losses:
        v = registry.register("m", checkpoint=str(state_ckpt))
        registry.store._run(
            lambda c, v=v, loss=loss: c.execute(
                st.model_versions.update()
                .where(st.model_versions.c.version == v)
                .values(metrics={"loss": loss})
            )
        )
    ranked = [v["metrics"]["loss"] for v in registry.compare("m", "loss")]
    assert ranked[:4] == [0.2, 0.3, 0.5, INF] and ranked[4] != ranked[4]


# --------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize(
    ("make", "argv", "says"),
    [
        (lambda p: p.mkdir(), ["experiment", "create"], "is a folder; give the YAML file"),
        (
            lambda p: p.write_bytes(b"\xff\xfe\x00name: x"),
            ["experiment", "preview"],
            "not UTF-8 text",
        ),
        (
            lambda p: p.write_text("name: x\nsearcher: [1\n"),
            ["train"],
            "not valid YAML at line 3, column 1: expected ',' or ']'",
        ),
        (None, ["experiment", "list", "--db", "notaurl"], "is not a database URL; write sqlite"),
        (None, ["model", "list", "--db", "mysql://x/y"], "is not supported here"),
        (
            None,
            ["experiment", "list", "--db", "postgresql://u@127.0.0.1:1/db"],
            "cannot be opened: connection failed",
        ),
    ],
)
def test_readme_commands_with_bad_arguments_print_one_line(tmp_path, capsys, make, argv, says):
    """A folder, a binary file or broken YAML given as the config, and a --db that names
    no usable database: each was a Python traceback (IsADirectoryError,
    UnicodeDecodeError, sqlalchemy's ArgumentError / ModuleNotFoundError /
    OperationalError) or PyYAML's four-line message; now one line, exit status 2."""
    from jaxcore.experiments.cli import main

    if make is not None:
        path = tmp_path / "x.yaml"
        make(path)
        argv = [*argv, str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    lines = [line for line in err if not line.startswith("jaxcore: store ")]
    assert len(lines) == 1 and says in lines[0], err
