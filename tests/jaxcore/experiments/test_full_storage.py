"""A full disk under the experiment layer: the store says so, a trial's failure stays the
trial's. Faults are real and deterministic: SQLite's own page limit (SQLITE_FULL, as a
full disk gives) and a log path whose parent is a file."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from jaxcore.experiments import ExperimentLoop, Store, StoreError, run_experiment


def _cap_pages(store: Store) -> None:
    """Every new connection may not grow the database: the next new page is refused."""

    @sa.event.listens_for(store.engine, "connect")
    def _cap(dbapi_conn, _record):
        pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
        dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

    store.engine.dispose()


def test_a_full_store_raises_a_store_error_that_says_what_to_do(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'jaxcore.db'}")
    exp = store.create_experiment("x", {"a": 1}, str(tmp_path))
    _cap_pages(store)
    big = {"blob": "x" * 200_000}
    with pytest.raises(StoreError, match="cannot be written: database or disk is full") as e:
        store.create_experiment("y", big, str(tmp_path))
    assert "jaxcore experiment resume" in str(e.value)
    with pytest.raises(StoreError, match="database or disk is full"), store.transaction():
        store.create_experiment("z", big, str(tmp_path))
    # What was recorded before is intact and readable.
    assert store.experiment(exp)["name"] == "x"
    assert [x["name"] for x in store.experiments()] == ["x"]


def test_a_trial_log_that_cannot_be_written_leaves_the_trial_failed_not_the_loop(
    raw_config, tmp_path, monkeypatch
):
    """Before: the inline executor's OSError writing logs.txt (a full disk) escaped the
    experiment loop and replaced the trial's own error."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr(ExperimentLoop, "log_path", lambda self, t: blocker / "logs.txt")
    raw = raw_config(
        "always_fail",
        {"name": "grid", "metric": "loss", "max_length": 1},
        {"fail": {"type": "categorical", "vals": [True]}},
        max_restarts=1,
    )
    summary = run_experiment(raw, executor="inline")
    (trial,) = summary.trials
    assert trial["state"] == "ERRORED" and trial["restarts"] == 1
