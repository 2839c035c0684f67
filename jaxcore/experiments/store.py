"""The store: experiments, trials, metrics, checkpoints and models in one SQL database.

One SQLAlchemy URL: ``sqlite:///<workdir>/jaxcore.db`` by default, PostgreSQL
(``postgresql://user:pw@host/db``, driven by psycopg 3) when a team shares it. SQLite
runs in WAL mode with a busy timeout and ``BEGIN IMMEDIATE`` for writes, so several
trial processes can report at once: writers queue on the database lock instead of
failing with "database is locked" half-way through a transaction (the recipe in
SQLAlchemy's pysqlite notes, "Serializable isolation / Savepoints / Transactional DDL").
Transient lock or serialization errors are retried. Tables are prefixed ``jaxcore_`` so
an Optuna RDB study (which has its own ``studies``/``trials`` tables) can share the URL.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

log = logging.getLogger(__name__)

meta = sa.MetaData()

experiments = sa.Table(
    "jaxcore_experiments",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("config", sa.JSON, nullable=False),
    sa.Column("state", sa.String(20), nullable=False),  # ACTIVE PAUSED COMPLETED KILLED ERROR
    sa.Column("workdir", sa.Text, nullable=False),
    sa.Column("searcher_state", sa.LargeBinary, nullable=True),
    sa.Column("heartbeat", sa.Float, nullable=True),
    sa.Column("best_metric", sa.Float, nullable=True),
    sa.Column("created", sa.DateTime, nullable=False),
    sa.Column("ended", sa.DateTime, nullable=True),
)
trials = sa.Table(
    "jaxcore_trials",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("experiment_id", sa.Integer, sa.ForeignKey("jaxcore_experiments.id"), index=True),
    sa.Column("hparams", sa.JSON, nullable=False),
    # PENDING RUNNING WAITING PAUSED COMPLETED STOPPED ERRORED CANCELED
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("max_length", sa.Integer, nullable=False),
    sa.Column("milestones", sa.JSON, nullable=True),
    sa.Column("restarts", sa.Integer, nullable=False, default=0),
    sa.Column("stop_requested", sa.Boolean, nullable=False, default=False),
    sa.Column("acked_step", sa.Integer, nullable=False, default=-1),
    sa.Column("steps_done", sa.Integer, nullable=False, default=0),
    sa.Column("best_metric", sa.Float, nullable=True),
    sa.Column("parent_trial", sa.Integer, nullable=True),
    sa.Column("source_checkpoint", sa.Text, nullable=True),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("created", sa.DateTime, nullable=False),
    sa.Column("ended", sa.DateTime, nullable=True),
)
metrics = sa.Table(
    "jaxcore_metrics",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer, sa.ForeignKey("jaxcore_trials.id"), index=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(20), nullable=False),  # training | validation
    sa.Column("values", sa.JSON, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
)
checkpoints = sa.Table(
    "jaxcore_checkpoints",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer, sa.ForeignKey("jaxcore_trials.id"), index=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("format", sa.String(20), nullable=False),  # orbax | json
    sa.Column("state", sa.String(20), nullable=False),  # COMPLETED DELETED
    sa.Column("metrics", sa.JSON, nullable=True),
    sa.Column("created", sa.DateTime, nullable=False),
    sa.Column("deleted", sa.DateTime, nullable=True),
)
models = sa.Table(
    "jaxcore_models",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(200), nullable=False, unique=True),
    sa.Column("description", sa.Text, nullable=False, default=""),
    sa.Column("meta", sa.JSON, nullable=False),
    sa.Column("tags", sa.JSON, nullable=False),
    sa.Column("created", sa.DateTime, nullable=False),
)
model_versions = sa.Table(
    "jaxcore_model_versions",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("model_id", sa.Integer, sa.ForeignKey("jaxcore_models.id"), index=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("checkpoint_id", sa.Integer, nullable=True),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, default=""),
    sa.Column("meta", sa.JSON, nullable=False),
    sa.Column("tags", sa.JSON, nullable=False),
    sa.Column("metrics", sa.JSON, nullable=True),
    sa.Column("created", sa.DateTime, nullable=False),
    sa.UniqueConstraint("model_id", "version"),
)
aliases = sa.Table(
    "jaxcore_model_aliases",
    meta,
    sa.Column("model_id", sa.Integer, sa.ForeignKey("jaxcore_models.id"), primary_key=True),
    sa.Column("alias", sa.String(100), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
)

TERMINAL = ("COMPLETED", "STOPPED", "ERRORED", "CANCELED")


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def normalize_url(url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg://`` (psycopg 3 is the pinned driver)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _sqlite_setup(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below govern
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # Take the write lock up front: a deferred transaction that later upgrades to
        # a writer can fail with SQLITE_BUSY without waiting for the busy timeout.
        conn.exec_driver_sql("BEGIN IMMEDIATE")


class Store:
    """Typed access to the database; safe to use from several processes at once."""

    def __init__(self, url: str, *, create: bool = True):
        self.url = normalize_url(url)
        if self.url.startswith("sqlite:///"):
            path = self.url.removeprefix("sqlite:///")
            if path and path != ":memory:":
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.engine = sa.create_engine(
                self.url, connect_args={"timeout": 60, "check_same_thread": False}
            )
            _sqlite_setup(self.engine)
        else:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True)
        if create:
            self._retry(lambda: meta.create_all(self.engine))

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def close(self) -> None:
        self.engine.dispose()

    # ----------------------------------------------------------------- plumbing
    @staticmethod
    def _retry(fn: Any, attempts: int = 30) -> Any:
        for i in range(attempts):
            try:
                return fn()
            except (sa.exc.OperationalError, sa.exc.IntegrityError) as e:
                text = str(e).lower()
                transient = any(
                    k in text for k in ("locked", "busy", "serializ", "deadlock", "already exists")
                )
                if not transient or i == attempts - 1:
                    raise
                time.sleep(min(1.0, 0.01 * 2**i) * (0.5 + random.random()))
        return None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        with self.engine.begin() as conn:
            yield conn

    def _run(self, fn: Any) -> Any:
        def attempt():
            with self._tx() as conn:
                return fn(conn)

        return self._retry(attempt)

    def _rows(self, stmt: Any) -> list[dict[str, Any]]:
        return self._run(lambda c: [dict(r._mapping) for r in c.execute(stmt)])

    def _one(self, stmt: Any) -> dict[str, Any] | None:
        rows = self._rows(stmt)
        return rows[0] if rows else None

    # ----------------------------------------------------------------- experiments
    def create_experiment(self, name: str, config: dict, workdir: str) -> int:
        row = dict(name=name, config=config, state="ACTIVE", workdir=workdir, created=now())
        return self._run(
            lambda c: c.execute(experiments.insert().values(**row)).inserted_primary_key[0]
        )

    def experiment(self, exp_id: int) -> dict[str, Any] | None:
        return self._one(sa.select(experiments).where(experiments.c.id == exp_id))

    def experiments(self) -> list[dict[str, Any]]:
        return self._rows(sa.select(experiments).order_by(experiments.c.id))

    def update_experiment(self, exp_id: int, **values: Any) -> None:
        self._run(
            lambda c: c.execute(
                experiments.update().where(experiments.c.id == exp_id).values(**values)
            )
        )

    # ----------------------------------------------------------------- trials
    def create_trial(self, exp_id: int, hparams: dict, max_length: int, **values: Any) -> int:
        row = dict(
            experiment_id=exp_id,
            hparams=hparams,
            state="PENDING",
            max_length=max_length,
            restarts=0,
            stop_requested=False,
            acked_step=-1,
            steps_done=0,
            created=now(),
        )
        row.update(values)
        return self._run(lambda c: c.execute(trials.insert().values(**row)).inserted_primary_key[0])

    def trial(self, trial_id: int) -> dict[str, Any] | None:
        return self._one(sa.select(trials).where(trials.c.id == trial_id))

    def trials(self, exp_id: int) -> list[dict[str, Any]]:
        return self._rows(
            sa.select(trials).where(trials.c.experiment_id == exp_id).order_by(trials.c.id)
        )

    def update_trial(self, trial_id: int, **values: Any) -> None:
        self._run(
            lambda c: c.execute(trials.update().where(trials.c.id == trial_id).values(**values))
        )

    # ----------------------------------------------------------------- metrics
    def add_metrics(self, trial_id: int, step: int, values: dict, kind: str = "training") -> int:
        clean = {k: float(v) for k, v in values.items()}
        row = dict(trial_id=trial_id, step=int(step), kind=kind, values=clean, time=time.time())

        def write(c):
            new_id = c.execute(metrics.insert().values(**row)).inserted_primary_key[0]
            c.execute(
                trials.update()
                .where(trials.c.id == trial_id, trials.c.steps_done < int(step))
                .values(steps_done=int(step))
            )
            return new_id

        return self._run(write)

    def metrics(
        self,
        trial_id: int | None = None,
        *,
        after_id: int = 0,
        exp_id: int | None = None,
        kind: str | None = None,
    ) -> list[dict[str, Any]]:
        stmt = sa.select(metrics).where(metrics.c.id > after_id).order_by(metrics.c.id)
        if trial_id is not None:
            stmt = stmt.where(metrics.c.trial_id == trial_id)
        if exp_id is not None:
            stmt = stmt.where(
                metrics.c.trial_id.in_(
                    sa.select(trials.c.id).where(trials.c.experiment_id == exp_id)
                )
            )
        if kind is not None:
            stmt = stmt.where(metrics.c.kind == kind)
        return self._rows(stmt)

    # ----------------------------------------------------------------- checkpoints
    def add_checkpoint(
        self, trial_id: int, step: int, path: str, fmt: str, values: dict | None = None
    ) -> int:
        row = dict(
            trial_id=trial_id,
            step=int(step),
            path=str(path),
            format=fmt,
            state="COMPLETED",
            metrics=values,
            created=now(),
        )
        return self._run(
            lambda c: c.execute(checkpoints.insert().values(**row)).inserted_primary_key[0]
        )

    def checkpoints(
        self, *, trial_id: int | None = None, exp_id: int | None = None, state: str | None = None
    ) -> list[dict[str, Any]]:
        stmt = sa.select(checkpoints).order_by(checkpoints.c.id)
        if trial_id is not None:
            stmt = stmt.where(checkpoints.c.trial_id == trial_id)
        if exp_id is not None:
            stmt = stmt.where(
                checkpoints.c.trial_id.in_(
                    sa.select(trials.c.id).where(trials.c.experiment_id == exp_id)
                )
            )
        if state is not None:
            stmt = stmt.where(checkpoints.c.state == state)
        return self._rows(stmt)

    def checkpoint(self, ckpt_id: int) -> dict[str, Any] | None:
        return self._one(sa.select(checkpoints).where(checkpoints.c.id == ckpt_id))

    def mark_deleted(self, ckpt_id: int) -> None:
        self._run(
            lambda c: c.execute(
                checkpoints.update()
                .where(checkpoints.c.id == ckpt_id)
                .values(state="DELETED", deleted=now())
            )
        )

    # ----------------------------------------------------------------- models
    def create_model(
        self, name: str, description: str = "", meta_: dict | None = None, tags: list | None = None
    ) -> int:
        row = dict(
            name=name, description=description, meta=meta_ or {}, tags=tags or [], created=now()
        )
        return self._run(lambda c: c.execute(models.insert().values(**row)).inserted_primary_key[0])

    def model(self, name: str) -> dict[str, Any] | None:
        return self._one(sa.select(models).where(models.c.name == name))

    def models(self) -> list[dict[str, Any]]:
        return self._rows(sa.select(models).order_by(models.c.id))

    def add_version(self, model_id: int, **values: Any) -> int:
        def write(c):
            top = c.execute(
                sa.select(sa.func.max(model_versions.c.version)).where(
                    model_versions.c.model_id == model_id
                )
            ).scalar()
            version = (top or 0) + 1
            c.execute(
                model_versions.insert().values(
                    model_id=model_id, version=version, created=now(), **values
                )
            )
            return version

        return self._run(write)

    def versions(self, model_id: int) -> list[dict[str, Any]]:
        return self._rows(
            sa.select(model_versions)
            .where(model_versions.c.model_id == model_id)
            .order_by(model_versions.c.version)
        )

    def set_alias(self, model_id: int, alias: str, version: int) -> None:
        def write(c):
            c.execute(
                aliases.delete().where(aliases.c.model_id == model_id, aliases.c.alias == alias)
            )
            c.execute(aliases.insert().values(model_id=model_id, alias=alias, version=version))

        self._run(write)

    def aliases(self, model_id: int) -> dict[str, int]:
        rows = self._rows(sa.select(aliases).where(aliases.c.model_id == model_id))
        return {r["alias"]: r["version"] for r in rows}


def dumps(value: Any) -> str:
    return json.dumps(value, default=str, indent=1)
