"""The dashboard's JSON API against a store filled by real searches and a real dataset build:
each answer is checked against the store itself (and the snapshot manifests)."""

from __future__ import annotations

import json
import os

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from jaxcore.experiments import Store, run_experiment
from jaxcore.ui import StoreReader, create_app
from tests.jaxcore.experiments.objectives import __file__ as OBJECTIVES
from tests.jaxcore.ui.conftest import ASHA_TRIALS, PBT_POP, PBT_ROUNDS


@pytest.fixture(scope="module")
def client(filled):
    with TestClient(create_app(filled.db_url, datasets=[filled.dataset_dir])) as c:
        yield c


@pytest.fixture(scope="module")
def store(filled):
    s = Store(filled.db_url, create=False)
    yield s
    s.close()


def _validations(store: Store, trial_id: int) -> list[tuple[int, float]]:
    return [(m["step"], m["values"]["loss"]) for m in store.metrics(trial_id, kind="validation")]


def test_experiment_list_matches_store(client, filled, store):
    data = client.get("/api/experiments").json()
    rows = {e["id"]: e for e in data["experiments"]}
    assert set(rows) == {e["id"] for e in store.experiments()}
    asha = rows[filled.asha_id]
    exp = store.experiment(filled.asha_id)
    assert asha["searcher"] == "adaptive_asha" and asha["state"] == "COMPLETED"
    assert asha["trials"] == ASHA_TRIALS
    assert asha["progress"] == {"done": ASHA_TRIALS, "expected": ASHA_TRIALS}
    # The best metric is the best validation any trial reported.
    every = [v for t in store.trials(filled.asha_id) for _, v in _validations(store, t["id"])]
    assert asha["best_metric"] == exp["best_metric"] == min(every)
    failed = {t["state"] for t in store.trials(filled.fails_id) if t["hparams"]["fail"]}
    assert failed <= {"ERRORED", "FAILED"}
    assert rows[filled.fails_id]["trials_by_state"] == {"COMPLETED": 1, failed.pop(): 1}


def test_experiment_curves_and_asha_rungs(client, filled, store):
    d = client.get(f"/api/experiments/{filled.asha_id}").json()
    trials = store.trials(filled.asha_id)
    assert len(d["trials_detail"]) == ASHA_TRIALS == len(trials)
    for t in trials:
        assert [tuple(p) for p in d["curves"][str(t["id"])]] == _validations(store, t["id"])
    best = min(trials, key=lambda t: min(v for _, v in _validations(store, t["id"])))
    assert d["best_trial"] == best["id"]
    assert d["hparam_names"] == ["x"]
    # Every trial appears in its bracket's first rung; those that went on report at the next.
    brackets = {tuple(t["milestones"]) for t in trials}
    assert {tuple(b["units"]) for b in d["asha"]} == brackets
    for b in d["asha"]:
        members = [t for t in trials if tuple(t["milestones"]) == tuple(b["units"])]
        assert b["trials"] == len(members) == len(b["rungs"][0]["trials"])
        for lower, upper in zip(b["rungs"], b["rungs"][1:], strict=False):
            went_on = {t["trial"] for t in lower["trials"] if t["promoted"]}
            assert went_on == {t["trial"] for t in upper["trials"]}
            values = [t["metric"] for t in lower["trials"]]
            assert values == sorted(values)


def test_pbt_lineage_is_the_parent_links(client, filled, store):
    d = client.get(f"/api/experiments/{filled.pbt_id}").json()
    trials = store.trials(filled.pbt_id)
    children = {t["id"]: t for t in trials if t["parent_trial"] is not None}
    assert children, "PBT exploited no trial"
    edges = {(e["parent"], e["child"]) for e in d["pbt"]["edges"]}
    assert edges == {(t["parent_trial"], c) for c, t in children.items()}
    assert d["pbt"]["rounds"] == PBT_ROUNDS
    nodes = {n["trial"]: n for n in d["pbt"]["nodes"]}
    for e in d["pbt"]["edges"]:
        assert e["round"] == 2 == nodes[e["child"]]["first_round"]  # exploited after round 1
        parent_lr = store.trial(e["parent"])["hparams"]["lr"]
        assert e["explore"]["lr"] == [parent_lr, store.trial(e["child"])["hparams"]["lr"]]
    assert sum(1 for n in nodes.values() if n["last_round"] == PBT_ROUNDS) == PBT_POP


def test_trial_checkpoints_logs_and_restarts(client, filled, store):
    t = store.trials(filled.grid_id)[0]
    d = client.get(f"/api/trials/{t['id']}").json()
    ckpts = store.checkpoints(trial_id=t["id"])
    assert [(c["id"], c["step"], c["state"], c["metrics"]) for c in d["checkpoints"]] == [
        (c["id"], c["step"], c["state"], c["metrics"]) for c in ckpts
    ]
    assert [tuple(p) for p in d["series"]["validation"]["loss"]] == _validations(store, t["id"])
    failed = next(t for t in store.trials(filled.fails_id) if t["hparams"]["fail"])
    d = client.get(f"/api/trials/{failed['id']}").json()
    assert d["state"] == failed["state"] in ("ERRORED", "FAILED")
    assert d["restarts"] == failed["restarts"] == 1
    assert d["logs"].count("RuntimeError: this trial always fails") == 2  # first run + restart
    assert client.get("/api/trials/99999").status_code == 404


def test_models_trace_back_to_the_dataset(client, filled, store):
    (m,) = client.get("/api/models").json()["models"]
    assert m["name"] == filled.model and m["aliases"] == {"production": 1}
    (v,) = m["versions"]
    ckpt = store.checkpoint(v["lineage"]["checkpoint"])
    assert v["metrics"] == ckpt["metrics"] and v["aliases"] == ["production"]
    assert v["lineage"]["trial"] == ckpt["trial_id"]
    assert v["lineage"]["experiment"] == filled.grid_id
    assert v["lineage"]["dataset"] == str(filled.dataset_dir / "v2")


def test_datasets_versions_stages_and_diff(client, filled):
    (ds,) = client.get("/api/datasets").json()["datasets"]
    assert [v["version"] for v in ds["versions"]] == ["v1", "v2"]
    for v in ds["versions"]:
        m = json.loads((filled.dataset_dir / v["version"] / "manifest.json").read_text())
        assert [(s["name"], s["kept"], s["dropped"]) for s in v["stages"]] == [
            (s["name"], s["files_out"], sum(s["dropped"].values())) for s in m["stages"]
        ]
        assert v["languages"] == m["languages"] and v["licenses"] == m["licenses"]
    assert ds["versions"][0]["languages"]["Python"] == 2
    d = client.get(f"/api/datasets/{ds['name']}/diff", params={"a": "v1", "b": "v2"}).json()
    assert d["added"] == {"count": 1, "files": ["alpha/src/added.py"]}
    assert d["changed"] == {"count": 1, "files": ["alpha/src/core.py"]}
    assert d["removed"]["count"] == 0
    bad = client.get(f"/api/datasets/{ds['name']}/diff", params={"a": "v1", "b": "v9"})
    assert bad.status_code == 400 and "no finished version 'v9'" in bad.json()["detail"]


def test_revision_changes_only_with_the_store(client, filled, store):
    url = f"/api/experiments/{filled.grid_id}"
    rev = client.get(url).json()["revision"]
    assert client.get(url, params={"since": rev}).json() == {"revision": rev, "unchanged": True}
    t = store.trials(filled.grid_id)[-1]
    store.add_metrics(t["id"], 100, {"loss": 0.5}, kind="validation")
    fresh = client.get(url, params={"since": rev}).json()
    assert fresh["revision"] != rev and [100, 0.5] in fresh["curves"][str(t["id"])]


def test_read_only(client, filled):
    assert client.post("/api/experiments").status_code == 405
    assert client.delete(f"/api/experiments/{filled.asha_id}").status_code == 405
    reader = StoreReader(filled.db_url)
    try:
        with pytest.raises(sa.exc.OperationalError, match="readonly"), reader.engine.begin() as c:
            c.execute(reader.table("experiments").delete())
    finally:
        reader.close()


def test_missing_store_is_empty_not_an_error(tmp_path):
    with TestClient(create_app(f"sqlite:///{tmp_path / 'none' / 'jaxcore.db'}")) as c:
        assert c.get("/api/experiments").json()["experiments"] == []
        assert c.get("/api/models").json()["models"] == []
        assert c.get("/api/experiments/1").status_code == 404
    assert not (tmp_path / "none").exists()  # reading never creates the database


PG_URL = os.environ.get("JAXCORE_TEST_POSTGRES_URL")


@pytest.mark.skipif(
    not PG_URL,
    reason='JAXCORE_TEST_POSTGRES_URL is not set (CI sets it: eval "$(bash '
    'scripts/ci-postgres.sh)" starts a local PostgreSQL server)',
)
def test_postgres_store_read_only(tmp_path):
    summary = run_experiment(
        {
            "name": "ui-pg",
            "entrypoint": f"{OBJECTIVES}:asha_quad",
            "workdir": str(tmp_path),
            "database": PG_URL,
            "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
            "searcher": {
                "name": "adaptive_asha",
                "metric": "loss",
                "max_length": 16,
                "max_trials": 4,
                "mode": "aggressive",
                "seed": 0,
            },
        },
        executor="inline",
    )
    with TestClient(create_app(PG_URL)) as c:
        rows = {e["id"]: e for e in c.get("/api/experiments").json()["experiments"]}
        assert rows[summary.experiment_id]["trials"] == 4
        d = c.get(f"/api/experiments/{summary.experiment_id}").json()
        assert d["best_metric"] == summary.best_metric
        assert "@" not in c.get("/api/experiments").json()["store"]  # no password shown
    reader = StoreReader(PG_URL)
    try:
        with pytest.raises(sa.exc.InternalError, match="read-only"), reader.engine.begin() as c:
            c.execute(reader.table("experiments").delete())
    finally:
        reader.close()


def test_preempted_trial(tmp_path):
    """A trial whose last run exited with the preemption code (75) says so."""
    url = f"sqlite:///{tmp_path / 'jaxcore.db'}"
    store = Store(url)
    exp = store.create_experiment("p", {"searcher": {"name": "random", "metric": "loss"}}, "/x")
    running = store.create_trial(exp, {"x": 1}, 10)
    paused = store.create_trial(exp, {"x": 2}, 10)
    store.update_trial(paused, state="PAUSED", exit_code=75)
    store.close()
    with TestClient(create_app(url)) as c:
        assert c.get(f"/api/trials/{paused}").json()["preempted_last_exit"] is True
        assert c.get(f"/api/trials/{running}").json()["preempted_last_exit"] is False


def test_trial_dir_layouts():
    """Logs are found under both layouts the experiments package has used."""
    from jaxcore.ui.queries import trial_dir

    assert str(trial_dir({"id": 3, "workdir": "/w"}, 7)) == "/w/exp-3/trial-7"
    assert str(trial_dir({"id": 3, "uuid": "ab-12", "workdir": "/w"}, 7)) == "/w/ab-12/trial-7"


def test_ids_out_of_the_stores_range_are_a_422_not_a_500(client):
    """SQLite's integer keys stop at 2**63 - 1; a bigger id in the URL used to reach the
    driver and come back as a 500."""
    for route in ("/api/trials/", "/api/experiments/"):
        assert client.get(f"{route}99999999999999999999").status_code == 422
        assert client.get(f"{route}-1").status_code == 422
        assert client.get(f"{route}{2**63 - 1}").status_code == 404


def test_every_page_has_an_icon_and_favicon_ico_is_served(client):
    # Stop 43: each page load logged "GET /favicon.ico 404" (browsers ask for it).
    for page in ("/", "/models", "/datasets", "/experiments/1", "/trials/1"):
        html = client.get(page).text
        assert '<link rel="icon" href="/static/favicon.svg"' in html, page
    for url in ("/favicon.ico", "/static/favicon.svg"):
        r = client.get(url)
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
        assert r.text.startswith("<svg")
