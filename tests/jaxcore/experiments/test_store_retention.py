"""The store under concurrent trial processes (SQLite, PostgreSQL) and checkpoint retention."""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import uuid

import pytest

from jaxcore.experiments import Store, parse_config, run_experiment
from jaxcore.experiments.config import RetentionConfig
from jaxcore.experiments.trial_context import trial_dir

N_PROCS, N_METRICS = 4, 1000
PG_URL = os.environ.get("JAXCORE_TEST_POSTGRES_URL")


def _concurrent(raw_config, tmp_path, database: str | None):
    raw = raw_config(
        "spam_metrics",
        {"name": "grid", "metric": "loss", "max_length": N_METRICS},
        {"k": {"type": "categorical", "vals": list(range(N_PROCS))}},
        resources={"devices": 1, "slots": N_PROCS},
        checkpoint_storage={"save_trial_latest": 0, "save_trial_best": 0},
        **({"database": database} if database else {}),
    )
    summary = run_experiment(raw, executor="local")
    store = Store(parse_config(raw).database_url)
    assert summary.state == "COMPLETED"
    assert len(summary.trials) == N_PROCS
    for t in summary.trials:
        assert t["state"] == "COMPLETED", t
        rows = store.metrics(t["id"], kind="training")
        steps = [r["step"] for r in rows]
        assert sorted(steps) == list(range(1, N_METRICS + 1)), f"trial {t['id']} lost metrics"
        assert {r["values"]["step_id"] for r in rows} == {
            float(t["id"] * 10000 + s) for s in range(1, N_METRICS + 1)
        }
    # All four ran at once (their reports interleave in the table).
    rows = store.metrics(exp_id=summary.experiment_id, kind="training")
    switches = sum(a["trial_id"] != b["trial_id"] for a, b in itertools.pairwise(rows))
    assert switches > N_PROCS
    # TensorBoard event files, one folder per trial.
    for t in summary.trials:
        tb = trial_dir(store.experiment(summary.experiment_id), t["id"]) / "tensorboard"
        assert any(tb.glob("events.out.tfevents.*")), tb
    store.close()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_four_processes_sqlite_lose_nothing(raw_config, tmp_path):
    _concurrent(raw_config, tmp_path, None)
    db = tmp_path / "work" / "jaxcore.db"
    assert db.exists()
    store = Store(f"sqlite:///{db}")
    with store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(
    not PG_URL,
    reason="JAXCORE_TEST_POSTGRES_URL is not set (CI sets it: "
    "scripts/ci-postgres.sh starts a local PostgreSQL server)",
)
def test_four_processes_postgres_lose_nothing(raw_config, tmp_path):
    # A fresh schema-free database name is not needed: experiment ids keep runs apart.
    _concurrent(raw_config, tmp_path, PG_URL)
    store = Store(PG_URL)
    assert store.engine.dialect.name == "postgresql"


def _expected_kept(rows, policy: RetentionConfig) -> set[str]:
    """The retention policy, written out plainly (not through jaxcore's keep_set)."""
    keep = set()
    by_trial: dict[int, list] = {}
    for r in rows:
        by_trial.setdefault(r["trial_id"], []).append(r)
    for mine in by_trial.values():
        mine.sort(key=lambda r: r["step"])
        keep |= {r["path"] for r in mine[len(mine) - policy.save_trial_latest :]}
        ranked = sorted(mine, key=lambda r: r["metrics"]["loss"])
        keep |= {r["path"] for r in ranked[: policy.save_trial_best]}
    ranked = sorted(rows, key=lambda r: r["metrics"]["loss"])
    keep |= {r["path"] for r in ranked[: policy.save_experiment_best]}
    return keep


@pytest.mark.parametrize("latest,best,exp_best", [(1, 1, 2), (0, 0, 1), (2, 0, 0)])
def test_retention_keeps_exactly_the_policy(raw_config, latest, best, exp_best):
    policy = {
        "save_trial_latest": latest,
        "save_trial_best": best,
        "save_experiment_best": exp_best,
    }
    raw = raw_config(
        "ckpt_curve",
        {"name": "grid", "metric": "loss", "max_length": 12},
        {"x": {"type": "double", "minval": 0.0, "maxval": 1.0, "count": 4}},
        checkpoint_storage=policy,
    )
    summary = run_experiment(raw, executor="inline")
    cfg = parse_config(raw)
    store = Store(cfg.database_url)
    rows = store.checkpoints(exp_id=summary.experiment_id)
    assert len(rows) == 4 * 6
    assert all(not math.isnan(r["metrics"]["loss"]) for r in rows)
    expected = _expected_kept(rows, RetentionConfig(**policy))
    on_disk = {str(p) for p in pathlib.Path(cfg.workdir).glob("*/trial-*/checkpoints/*")}
    assert on_disk == expected
    # What was deleted is recorded.
    deleted = {r["path"] for r in rows if r["state"] == "DELETED"}
    assert deleted == {r["path"] for r in rows} - expected
    assert summary.deleted_checkpoints == len(deleted)
    assert all(r["deleted"] is not None for r in rows if r["state"] == "DELETED")


def test_store_url_forms(tmp_path):
    from jaxcore.experiments.store import normalize_url

    assert normalize_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    store = Store(f"sqlite:///{tmp_path / 'sub' / 'x.db'}")
    exp = store.create_experiment(f"e-{uuid.uuid4().hex[:6]}", {"a": 1}, str(tmp_path))
    assert store.experiment(exp)["config"] == {"a": 1}
