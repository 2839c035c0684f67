"""The dashboard's adapter onto the experiment store (`jaxcore.ui.snapshots` is the one
onto ``data`` builds).

Every read of the store's structures lives here, so a change in its schema is a local
fix. Tables are *reflected* from the database (their names come from
`jaxcore.experiments.store`), so a column that an older or newer store lacks or adds is
tolerated: rows are plain dicts read with ``.get``. Queries are SQLAlchemy Core
expressions, never strings. The connection is read-only at the database level: SQLite
opens with ``mode=ro``; PostgreSQL sessions get ``default_transaction_read_only``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import pathlib
import threading
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from jaxcore.experiments import store as _store
from jaxcore.experiments.registry import metric_rank

# store table -> its name in the database, from the store module's Table objects (the
# literal is only the fallback should the store rename its Python attribute)
_NAMES = {
    "experiments": ("experiments", "jaxcore_experiments"),
    "trials": ("trials", "jaxcore_trials"),
    "metrics": ("metrics", "jaxcore_metrics"),
    "checkpoints": ("checkpoints", "jaxcore_checkpoints"),
    "models": ("models", "jaxcore_models"),
    "versions": ("model_versions", "jaxcore_model_versions"),
    "aliases": ("aliases", "jaxcore_model_aliases"),
}
TABLES = {
    key: getattr(getattr(_store, attr, None), "name", default)
    for key, (attr, default) in _NAMES.items()
}
# FAILED: the store's next spelling of ERRORED
TERMINAL = {
    *getattr(_store, "TERMINAL", ()),
    "COMPLETED",
    "STOPPED",
    "ERRORED",
    "FAILED",
    "CANCELED",
}
PREEMPTED_EXIT = 75  # a trial that checkpointed and exited on SIGTERM
LOG_TAIL_BYTES = 64_000


# JSON columns and the shape the store writes in each
JSON_COLUMNS: dict[str, type] = {
    "config": dict,
    "hparams": dict,
    "milestones": list,
    "values": dict,
    "metrics": dict,
    "meta": dict,
    "tags": list,
}
log = logging.getLogger(__name__)


def _json(key: str, value: Any) -> Any:
    """A JSON column's value decoded (SQLite's come as text, see `StoreReader.table`).

    One that does not decode to the shape the store writes (half a document left by
    another tool or a damaged page) is None, which the pages show as empty: it used to
    make every route that read the row a 500.
    """
    if key not in JSON_COLUMNS or value is None:
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            warn_once(f"store column {key!r} holds no valid JSON ({value[:80]!r}); shown empty")
            return None
    return value if isinstance(value, JSON_COLUMNS[key]) else None


@functools.lru_cache(maxsize=256)
def warn_once(message: str) -> None:
    """Log a warning the first time only: pages poll every second and would repeat it."""
    log.warning("jaxcore ui: %s", message)


# How the API spells the floats JSON has no literal for, as protobuf's proto3 JSON mapping
# does: a diverged trial's NaN or infinite loss used to go out as ``null``, the same as a
# value never reported. The pages read them back with ``UI.num`` (``Number("NaN")``).
NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def wire(value: Any) -> Any:
    """``value`` with every non-finite float spelled as a string (see `NONFINITE`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return NONFINITE[str(value)]
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [wire(v) for v in value]
    return value


def best_value(values: Iterable[Any], smaller_is_better: bool) -> Any:
    """The best of ``values`` by `metric_rank`: the best finite one where there is one,
    else an infinity or NaN (the trial diverged), else None."""
    best = min(values, key=lambda v: metric_rank(v, smaller_is_better), default=None)
    return None if metric_rank(best, smaller_is_better)[0] == 3 else best


def _json_as_text(_inspector: Any, _table: sa.Table, column: dict[str, Any]) -> None:
    """Reflect SQLite's JSON columns as text so that `_json` decodes them, one value at a
    time, instead of SQLAlchemy failing the whole query on one bad value."""
    if isinstance(column["type"], sa.JSON):
        column["type"] = sa.Text()


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON-ready values (binary blobs such as pickled searcher state dropped)."""
    out = {}
    for k, v in row.items():
        if isinstance(v, bytes | memoryview):
            continue
        out[k] = v.isoformat() if hasattr(v, "isoformat") else _json(k, v)
    return out


def trial_dir(experiment: dict[str, Any], trial_id: int) -> pathlib.Path:
    """Where a trial's files live, mirroring the experiments package's layout:
    ``<workdir>/<experiment uuid>/trial-<id>``, ``exp-<id>`` for stores without UUIDs."""
    name = experiment.get("uuid") or f"exp-{experiment['id']}"
    return pathlib.Path(experiment["workdir"]) / name / f"trial-{trial_id}"


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///`` URL (None for other databases)."""
    url = _store.normalize_url(url)
    if not url.startswith("sqlite:///"):
        return None
    return url.removeprefix("sqlite:///").split("?", 1)[0]


class StoreReader:
    """Read-only typed reads of the experiment store for the dashboard."""

    def __init__(self, url: str):
        self.url = _store.normalize_url(url)
        self.path = sqlite_path(self.url)
        if self.path is not None:
            # mode=ro: the database refuses writes; the UI can never change a search. On a
            # read-only file system (an archived workdir) it is also opened immutable, or
            # SQLite cannot open a WAL database whose -shm file it cannot create there.
            ro = _store.sqlite_read_only_url(self.path, _store.sqlite_read_only(self.path))
            self.engine = sa.create_engine(ro, connect_args={"timeout": 30})
        else:
            self.engine = sa.create_engine(
                self.url,
                pool_pre_ping=True,
                connect_args={"options": "-c default_transaction_read_only=on"},
            )
        self._tables: dict[str, sa.Table] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    def available(self) -> bool:
        """False while the SQLite file does not exist yet (no experiment has run)."""
        return self.path is None or os.path.exists(self.path)

    def table(self, key: str) -> sa.Table | None:
        """The reflected table, or None when the database has no such table (yet)."""
        with self._lock:
            if key not in self._tables:
                if not self.available():
                    return None
                md = sa.MetaData()
                if self.path is not None:
                    sa.event.listen(md, "column_reflect", _json_as_text)
                try:
                    md.reflect(self.engine, only=[TABLES[key]])
                except sa.exc.InvalidRequestError:  # not created yet
                    return None
                self._tables[key] = md.tables[TABLES[key]]
            return self._tables[key]

    def rows(self, key: str, *where: Any, order: str = "id") -> list[dict[str, Any]]:
        """Rows of a store table (``where``: expressions, or functions of the table)."""
        t = self.table(key)
        if t is None:
            return []
        stmt = sa.select(t)
        for clause in where:
            stmt = stmt.where(clause(t) if callable(clause) else clause)
        if order in t.c:
            stmt = stmt.order_by(t.c[order])
        with self.engine.connect() as conn:
            return [_plain(dict(r._mapping)) for r in conn.execute(stmt)]

    def scalar(self, stmt: Any) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(stmt).scalar()


# --------------------------------------------------------------------------- experiments
def _searcher(exp: dict[str, Any]) -> dict[str, Any]:
    return dict((exp.get("config") or {}).get("searcher") or {})


def _expected_trials(searcher: dict[str, Any], n_trials: int) -> int:
    if searcher.get("name") == "pbt":
        return max(n_trials, int(searcher.get("population_size") or 0))
    return max(n_trials, int(searcher.get("max_trials") or 0))


def _summary(exp: dict[str, Any], trials: list[dict[str, Any]]) -> dict[str, Any]:
    s = _searcher(exp)
    by_state: dict[str, int] = {}
    for t in trials:
        by_state[t["state"]] = by_state.get(t["state"], 0) + 1
    done = sum(n for st, n in by_state.items() if st in TERMINAL)
    expected = _expected_trials(s, len(trials))
    return {
        "id": exp["id"],
        "uuid": exp.get("uuid"),
        "name": exp["name"],
        "state": exp["state"],
        "searcher": s.get("name"),
        "metric": s.get("metric"),
        "smaller_is_better": s.get("smaller_is_better", True),
        "best_metric": exp.get("best_metric"),
        "trials": len(trials),
        "trials_by_state": by_state,
        "progress": {"done": done, "expected": expected},
        "created": exp.get("created"),
        "ended": exp.get("ended"),
        "workdir": exp.get("workdir"),
    }


def list_experiments(r: StoreReader) -> list[dict[str, Any]]:
    """Every experiment with its state, searcher, best metric and trial progress."""
    exps = r.rows("experiments")
    trials = r.rows("trials")
    per: dict[int, list[dict[str, Any]]] = {}
    for t in trials:
        per.setdefault(t["experiment_id"], []).append(t)
    return [_summary(e, per.get(e["id"], [])) for e in exps]


def _metric_rows(r: StoreReader, trial_ids: Iterable[int], kind: str | None = None) -> list[dict]:
    """Metric rows of these trials (only ``kind`` rows when given: an experiment's page
    needs validations only, and training reports can outnumber them a hundredfold)."""
    ids = list(trial_ids)
    if not ids:
        return []
    where = [lambda t: t.c.trial_id.in_(ids)]
    if kind is not None:
        where.append(lambda t: t.c.kind == kind)
    return r.rows("metrics", *where)


def revision(r: StoreReader, exp_id: int | None = None, trial_id: int | None = None) -> str:
    """A cheap fingerprint that changes whenever a page's data does (drives live updates)."""
    parts = []
    tt, mt, ct, et = (r.table(k) for k in ("trials", "metrics", "checkpoints", "experiments"))
    if tt is None or et is None:
        return "empty"
    trial_q = sa.select(tt.c.id)
    if exp_id is not None:
        trial_q = trial_q.where(tt.c.experiment_id == exp_id)
    if trial_id is not None:
        trial_q = trial_q.where(tt.c.id == trial_id)
    for table in (mt, ct):
        if table is not None:
            parts.append(
                r.scalar(sa.select(sa.func.max(table.c.id)).where(table.c.trial_id.in_(trial_q)))
            )
    states = r.rows("trials", lambda t: t.c.id.in_(trial_q))
    parts.append([(t["id"], t["state"], t.get("steps_done"), t.get("restarts")) for t in states])
    exps = r.rows("experiments") if exp_id is None else r.rows("experiments", et.c.id == exp_id)
    parts.append([(e["id"], e["state"], e.get("best_metric")) for e in exps])
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _curves(metric_rows: list[dict], kind: str, name: str | None) -> dict[int, list[list]]:
    out: dict[int, list[list]] = {}
    for m in metric_rows:
        if m["kind"] != kind:
            continue
        values = m["values"] or {}
        if name is None or name in values:
            out.setdefault(m["trial_id"], []).append([m["step"], values.get(name)])
    for pts in out.values():
        pts.sort(key=lambda p: p[0])
    return out


def _asha_rungs(trials: list[dict], curves: dict[int, list[list]], smaller: bool) -> list[dict]:
    """Brackets of rungs: which trials reported at each rung and which went on (promoted)."""
    brackets: dict[tuple, list[dict]] = {}
    for t in trials:
        brackets.setdefault(tuple(t.get("milestones") or ()), []).append(t)
    out = []
    for units, members in sorted(brackets.items(), key=lambda kv: -len(kv[0])):
        if not units:
            continue
        rungs = []
        for u in units:
            at = []
            for t in members:
                value = dict((s, v) for s, v in curves.get(t["id"], [])).get(u)
                if value is not None:
                    at.append(
                        {
                            "trial": t["id"],
                            "metric": value,
                            "promoted": int(t.get("steps_done") or 0) > u,
                        }
                    )
            at.sort(key=lambda a: metric_rank(a["metric"], smaller))
            rungs.append({"units": u, "trials": at})
        out.append({"units": list(units), "trials": len(members), "rungs": rungs})
    return out


def _pbt_lineage(trials: list[dict], searcher: dict[str, Any]) -> dict[str, Any]:
    """Each trial's span of rounds, and exploit edges parent -> child with what explore changed."""
    per_round = int(searcher.get("length_per_round") or 1)
    by_id = {t["id"]: t for t in trials}
    nodes, edges = [], []
    for t in trials:
        src = t.get("source_checkpoint")
        start_step = 0
        if src:
            name = pathlib.Path(str(src)).name
            start_step = int(name) if name.isdigit() else 0
        first = start_step // per_round + 1
        last = max(first, -(-int(t.get("steps_done") or 0) // per_round))
        nodes.append(
            {
                "trial": t["id"],
                "first_round": first,
                "last_round": last,
                "state": t["state"],
                "hparams": t.get("hparams") or {},
            }
        )
        parent = t.get("parent_trial")
        if parent is not None and parent in by_id:
            before = by_id[parent].get("hparams") or {}
            after = t.get("hparams") or {}
            changed = {k: [before.get(k), v] for k, v in after.items() if before.get(k) != v}
            edges.append({"parent": parent, "child": t["id"], "round": first, "explore": changed})
    rounds = int(searcher.get("num_rounds") or max((n["last_round"] for n in nodes), default=0))
    return {"rounds": rounds, "length_per_round": per_round, "nodes": nodes, "edges": edges}


def experiment_detail(r: StoreReader, exp_id: int) -> dict[str, Any] | None:
    """One experiment: trials with hyperparameters, curves, ASHA rungs or PBT lineage.

    The revision is taken before the data: a write between the two then shows as a new
    revision at the next poll (taken after, the poll would call the stale data current).
    """
    rev = revision(r, exp_id=exp_id)
    et = r.table("experiments")
    exps = r.rows("experiments", et.c.id == exp_id) if et is not None else []
    if not exps:
        return None
    exp = exps[0]
    trials = r.rows("trials", lambda t: t.c.experiment_id == exp_id)
    summary = _summary(exp, trials)
    metric, smaller = summary["metric"], summary["smaller_is_better"]
    rows = _metric_rows(r, [t["id"] for t in trials], kind="validation")
    curves = _curves(rows, "validation", metric)
    latest = {tid: pts[-1][1] for tid, pts in curves.items() if pts}
    # The store keeps the experiment's best; a trial's best comes from its validations.
    best_of = {tid: best_value((v for _, v in pts), smaller) for tid, pts in curves.items()}
    hp_names = sorted({k for t in trials for k in (t.get("hparams") or {})})
    out_trials = [
        {
            "id": t["id"],
            "state": t["state"],
            "hparams": t.get("hparams") or {},
            "steps_done": t.get("steps_done"),
            "max_length": t.get("max_length"),
            "best_metric": t.get("best_metric")
            if t.get("best_metric") is not None
            else best_of.get(t["id"]),
            "latest_metric": latest.get(t["id"]),
            "restarts": t.get("restarts"),
            "parent_trial": t.get("parent_trial"),
        }
        for t in trials
    ]
    # Only a finite value makes a trial the best one (never a NaN or an infinite loss).
    best = [t for t in out_trials if metric_rank(t["best_metric"], smaller)[0] == 0]
    best_trial = (
        min(best, key=lambda t: metric_rank(t["best_metric"], smaller))["id"] if best else None
    )
    searcher = _searcher(exp)
    detail = {
        **summary,
        "config": exp.get("config"),
        "hparam_names": hp_names,
        "trials_detail": out_trials,
        "best_trial": best_trial,
        "curves": {str(k): v for k, v in curves.items()},
        "revision": rev,
    }
    if searcher.get("name") == "adaptive_asha":
        detail["asha"] = _asha_rungs(trials, curves, smaller)
    if searcher.get("name") == "pbt":
        detail["pbt"] = _pbt_lineage(trials, searcher)
    return detail


def _log_tail(path: pathlib.Path) -> str:
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
        return f.read().decode("utf-8", errors="replace")


def trial_revision(r: StoreReader, trial_id: int) -> str:
    """`revision` of one trial, plus its log file's size (logs grow without store writes)."""
    rev = revision(r, trial_id=trial_id)
    tt, et = r.table("trials"), r.table("experiments")
    if tt is None or et is None:
        return rev
    found = r.rows("trials", tt.c.id == trial_id)
    if not found:
        return rev
    exp = r.rows("experiments", et.c.id == found[0]["experiment_id"])[0]
    log = trial_dir(exp, trial_id) / "logs.txt"
    return f"{rev}-{log.stat().st_size if log.is_file() else 0}"


def _trial_best(t: dict, series: dict, searcher: dict) -> float | None:
    if t.get("best_metric") is not None:
        return t["best_metric"]
    values = [v for _, v in series.get("validation", {}).get(searcher.get("metric"), [])]
    return best_value(values, searcher.get("smaller_is_better", True))


def trial_detail(r: StoreReader, trial_id: int) -> dict[str, Any] | None:
    """One trial: every metric curve, its checkpoints with metrics, logs, restarts (the
    revision taken before the data, as in `experiment_detail`)."""
    rev = trial_revision(r, trial_id)
    tt = r.table("trials")
    found = r.rows("trials", tt.c.id == trial_id) if tt is not None else []
    if not found:
        return None
    t = found[0]
    et = r.table("experiments")
    exp = r.rows("experiments", et.c.id == t["experiment_id"])[0]
    rows = _metric_rows(r, [trial_id])
    series: dict[str, dict[str, list[list]]] = {}
    for m in rows:
        for name, value in (m["values"] or {}).items():
            series.setdefault(m["kind"], {}).setdefault(name, []).append([m["step"], value])
    ckpts = [
        {
            k: c.get(k)
            for k in ("id", "step", "path", "format", "state", "metrics", "created", "deleted")
        }
        for c in r.rows("checkpoints", lambda c: c.c.trial_id == trial_id)
    ]
    logs = _log_tail(trial_dir(exp, trial_id) / "logs.txt")
    exit_code = t.get("exit_code")
    return {
        "id": t["id"],
        "experiment_id": exp["id"],
        "experiment_name": exp["name"],
        "state": t["state"],
        "hparams": t.get("hparams") or {},
        "steps_done": t.get("steps_done"),
        "max_length": t.get("max_length"),
        "best_metric": _trial_best(t, series, _searcher(exp)),
        "metric": _searcher(exp).get("metric"),
        "restarts": t.get("restarts") or 0,
        # A count only where the store keeps one; today's store records the last exit
        # code, which says whether the trial's latest run ended preempted (code 75).
        "preemptions": t.get("preemptions"),
        "preempted_last_exit": exit_code == PREEMPTED_EXIT,
        "exit_code": exit_code,
        "parent_trial": t.get("parent_trial"),
        "source_checkpoint": t.get("source_checkpoint"),
        "created": t.get("created"),
        "ended": t.get("ended"),
        "series": series,
        "checkpoints": ckpts,
        "logs": logs,
        "revision": rev,
    }


# --------------------------------------------------------------------------- models
def _dataset_ref(*metas: dict[str, Any] | None) -> str | None:
    """The dataset version a model was trained on, where its metadata records one
    (``dataset``: a snapshot version directory)."""
    for meta in metas:
        ref = (meta or {}).get("dataset")
        if isinstance(ref, dict):
            ref = ref.get("path") or ref.get("dir")
        if ref:
            return str(ref)
    return None


def list_models(r: StoreReader) -> list[dict[str, Any]]:
    """Models with versions, aliases and metrics, each version traced back through its
    checkpoint -> trial -> experiment -> dataset version, where recorded."""
    out = []
    for m in r.rows("models"):
        versions = r.rows("versions", lambda v, mid=m["id"]: v.c.model_id == mid, order="version")
        aliases = r.rows("aliases", lambda a, mid=m["id"]: a.c.model_id == mid, order="alias")
        by_version: dict[int, list[str]] = {}
        for a in aliases:
            by_version.setdefault(a["version"], []).append(a["alias"])
        vs = []
        for v in versions:
            lineage: dict[str, Any] = {"checkpoint": v.get("checkpoint_id")}
            hparams: dict[str, Any] = {}
            if v.get("checkpoint_id") is not None:
                ck = r.rows("checkpoints", lambda c, cid=v["checkpoint_id"]: c.c.id == cid)
                if ck:
                    lineage.update(step=ck[0]["step"], trial=ck[0]["trial_id"])
                    tr = r.rows("trials", lambda t, tid=ck[0]["trial_id"]: t.c.id == tid)
                    if tr:
                        lineage["experiment"] = tr[0]["experiment_id"]
                        hparams = tr[0].get("hparams") or {}
            lineage["dataset"] = _dataset_ref(v.get("meta"), m.get("meta"), hparams)
            vs.append(
                {
                    "version": v["version"],
                    "aliases": by_version.get(v["version"], []),
                    "metrics": v.get("metrics") or {},
                    "path": v.get("path"),
                    "description": v.get("description"),
                    "created": v.get("created"),
                    "lineage": lineage,
                }
            )
        out.append(
            {
                "id": m["id"],
                "name": m["name"],
                "description": m.get("description"),
                "tags": m.get("tags") or [],
                "versions": vs,
                "aliases": {a["alias"]: a["version"] for a in aliases},
            }
        )
    return out
