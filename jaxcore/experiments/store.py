"""The store: experiments, trials, metrics, checkpoints and models in one SQL database.

One SQLAlchemy URL: ``sqlite:///<workdir>/jaxcore.db`` by default, PostgreSQL
(``postgresql://user:pw@host/db``, driven by psycopg 3) when a team shares it. SQLite
runs in WAL mode with a busy timeout and ``BEGIN IMMEDIATE`` for writes, so several
trial processes can report at once: writers queue on the database lock instead of
failing with "database is locked" half-way through a transaction (the recipe in
SQLAlchemy's pysqlite notes, "Serializable isolation / Savepoints / Transactional DDL").
Transient lock or serialization errors are retried. Tables are prefixed ``jaxcore_`` so
an Optuna RDB study (which has its own ``studies``/``trials`` tables) can share the URL.

Schema changes are additive: columns added since a database was created are added to it
on open (``ALTER TABLE ... ADD COLUMN``, nullable), so older stores keep working and
readers that do not know the new columns are unaffected. Each store has a UUID
(``jaxcore_store_info``) that workdirs are bound to, and each experiment one that names
its directory.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import random
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from jaxcore.errors import JaxcoreError

log = logging.getLogger(__name__)

# What databases say when their storage refuses a write (SQLite, PostgreSQL): not
# transient, and not a bug in the caller.
_STORAGE_FULL = (
    "database or disk is full",
    "disk i/o error",
    "readonly database",
    "no space left on device",
    "could not extend file",
    "disk quota exceeded",
)


# What SQLite says of a file that is no (longer a whole) database: a copy cut short, a
# file overwritten by another program.
_DAMAGED = ("database disk image is malformed", "file is not a database")


class StoreError(JaxcoreError):
    """The experiment store cannot be written (its disk is full or read-only) or read (its
    file is damaged)."""


meta = sa.MetaData()

experiments = sa.Table(
    "jaxcore_experiments",
    meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("config", sa.JSON, nullable=False),
    # ACTIVE PAUSED COMPLETED FAILED CANCELED (KILLED: stores written before CANCELED)
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("workdir", sa.Text, nullable=False),
    # The loop's snapshot: searcher, event cursor and policies, committed with each turn.
    sa.Column("searcher_state", sa.LargeBinary, nullable=True),
    sa.Column("heartbeat", sa.Float, nullable=True),
    sa.Column("best_metric", sa.Float, nullable=True),
    sa.Column("created", sa.DateTime, nullable=False),
    sa.Column("ended", sa.DateTime, nullable=True),
    sa.Column("uuid", sa.String(36), nullable=True),  # names the experiment's directory
    sa.Column("owner", sa.String(300), nullable=True),  # "host pid" of the loop running it
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
    sa.Column("pid", sa.Integer, nullable=True),  # the live trial process (local executor)
    sa.Column("host", sa.String(200), nullable=True),
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
    sa.Index("jaxcore_metrics_trial_step", "trial_id", "step", "kind"),
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
    sa.Column("meta", sa.JSON, nullable=True),  # model config, tokenizer: for the registry
    sa.Index("jaxcore_checkpoints_trial_step", "trial_id", "step"),
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

store_info = sa.Table(
    "jaxcore_store_info",
    meta,
    sa.Column("key", sa.String(100), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

# The largest id a row can have (a signed 64-bit integer in SQLite and PostgreSQL): a
# bigger one names no row, and the drivers raise OverflowError / DataError on it.
MAX_ROW_ID = 2**63 - 1
TERMINAL = ("COMPLETED", "STOPPED", "ERRORED", "CANCELED")
EXPERIMENT_DONE = ("COMPLETED", "FAILED", "CANCELED", "KILLED")


def _add_missing_columns(engine: sa.Engine) -> None:
    """Additive migration: columns of `meta` that an existing table lacks are added."""
    with engine.begin() as conn:
        inspector = sa.inspect(conn)  # on this connection: it holds SQLite's write lock
        for table in meta.sorted_tables:
            if not inspector.has_table(table.name):
                continue
            have = {c["name"] for c in inspector.get_columns(table.name)}
            for col in table.columns:
                if col.name not in have:
                    kind = col.type.compile(dialect=engine.dialect)
                    conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}')


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def normalize_url(url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg://`` (psycopg 3 is the pinned driver);
    a relative SQLite path -> absolute."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite:///"):  # one spelling per file: trial processes match on it
        path = url.removeprefix("sqlite:///")
        if path.startswith("~"):  # `--db sqlite:///~/x.db`: the shell leaves this `~` alone
            path = os.path.expanduser(path)
        if path and path != ":memory:" and not path.startswith("/"):
            return "sqlite:///" + os.path.abspath(path)
        return "sqlite:///" + path
    return url


def safe_url(url: str) -> str:
    """``url`` with its password masked, for messages and logs."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def file_in_the_way(folder: str) -> str | None:
    """The file (not a folder) at ``folder`` or above it that keeps ``os.makedirs(folder)``
    from working, or None."""
    path = os.path.abspath(folder)
    while True:
        if os.path.exists(path) and not os.path.isdir(path):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def sqlite_read_only(path: str) -> str | None:
    """Why the SQLite file at ``path`` cannot be written here, or None when it can:
    ``"file system"`` (mounted read-only: an archive, a read-only share) or
    ``"permission"`` (no write permission on the file or its folder, where SQLite keeps
    the ``-wal``/``-shm`` files of a WAL database)."""
    folder = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "file system"
    except OSError:
        return None
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "permission"
    return None


def sqlite_read_only_url(path: str, why: str | None) -> str:
    """A URL opening ``path`` read-only.

    SQLite opens a WAL database read-only only where its ``-shm`` file exists or can be
    created, else 'unable to open database file'. On a read-only file system nothing can
    change the file, so it is opened ``immutable`` (no ``-shm`` needed); in a folder this
    user may not write, too when there is no ``-shm`` (no writer has it open now).
    """
    immutable = why == "file system" or (why == "permission" and not os.path.exists(f"{path}-shm"))
    extra = "&immutable=1" if immutable else ""
    return f"sqlite:///file:{os.path.abspath(path)}?mode=ro{extra}&uri=true"


def _sqlite_setup(engine: sa.Engine, *, read_only: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below govern
        cur = dbapi_conn.cursor()
        if not read_only:  # a read-only connection keeps the file's journal mode
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # Take the write lock up front: a deferred transaction that later upgrades to
        # a writer can fail with SQLITE_BUSY without waiting for the busy timeout. (A
        # read-only store can take no write lock: its writes fail as `StoreError`s.)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


class Store:
    """Typed access to the database; safe to use from several processes at once."""

    def __init__(self, url: str, *, create: bool = True):
        self.url = normalize_url(url)
        self._local = threading.local()  # the connection of an open `transaction()`
        self._uuid: str | None = None
        # Why this store cannot be written here (a read-only file system or folder): it is
        # then opened read-only, so commands that only read work, and a write says so.
        self.read_only: str | None = None
        if self.url.startswith("sqlite:///"):
            path = self.url.removeprefix("sqlite:///")
            url = self.url
            if path and path != ":memory:":
                self.read_only = sqlite_read_only(path)
                if self.read_only and not os.path.isfile(path):
                    raise StoreError(
                        f"the experiment store {path} cannot be created: its folder is on "
                        f"a read-only {self._why()}. Give a writable workdir (or --db URL "
                        "/ $JAXCORE_DB)."
                    )
                if self.read_only:
                    url = sqlite_read_only_url(path, self.read_only)
                else:
                    folder = os.path.dirname(os.path.abspath(path))
                    blocker = file_in_the_way(folder)
                    if blocker is not None:
                        raise StoreError(
                            f"the experiment store {path} cannot be created: {blocker} is "
                            "a file, not a folder. Give a workdir that is a folder (or not "
                            "there yet), or put the store elsewhere with --db URL / "
                            "$JAXCORE_DB."
                        )
                    os.makedirs(folder, exist_ok=True)
            self.engine = sa.create_engine(
                url, connect_args={"timeout": 60, "check_same_thread": False}
            )
            _sqlite_setup(self.engine, read_only=bool(self.read_only))
        else:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True)
        if create and not self.read_only:
            self._retry(lambda: meta.create_all(self.engine))
            self._retry(lambda: _add_missing_columns(self.engine))

    @property
    def uuid(self) -> str:
        """This database's identity (created on first use; workdirs are bound to it)."""
        if self._uuid is None:

            def get_or_create(c):
                row = c.execute(
                    sa.select(store_info.c.value).where(store_info.c.key == "uuid")
                ).scalar()
                if row is None:
                    row = str(uuidlib.uuid4())
                    c.execute(store_info.insert().values(key="uuid", value=row))
                return row

            self._uuid = self._run(get_or_create)
        return self._uuid

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def close(self) -> None:
        self.engine.dispose()

    # ----------------------------------------------------------------- plumbing
    def _why(self) -> str:
        return {
            "file system": "file system (mounted read-only)",
            "permission": "folder or file this user may not write (no write permission)",
        }.get(self.read_only or "", "file system or folder")

    @contextlib.contextmanager
    def _storage_errors(self) -> Iterator[None]:
        """Turn a write the database's storage refused into a `StoreError` that says so."""
        try:
            yield
        except sa.exc.DatabaseError as e:
            text = str(e).lower()
            damage = next((k for k in _DAMAGED if k in text), None)
            if damage is not None:
                path = self.url.removeprefix("sqlite:///")
                raise StoreError(
                    f"the experiment store {path} is damaged (SQLite: {damage}), e.g. a copy "
                    f"cut short: check it with `sqlite3 {path} 'PRAGMA integrity_check'`, then "
                    "restore it from a copy, or save what it holds with `sqlite3 "
                    f"{path} .recover | sqlite3 RECOVERED.db` and use --db sqlite:///"
                    "RECOVERED.db."
                ) from e
            if not isinstance(e, sa.exc.OperationalError):
                raise
            reason = next((k for k in _STORAGE_FULL if k in text), None)
            if reason is None:
                raise
            if self.read_only or reason == "readonly database":
                raise StoreError(
                    f"the experiment store {safe_url(self.url)} is read-only here: it is on "
                    f"a read-only {self._why()}. Commands that only read it (list, "
                    "describe, logs, jaxcore ui) work; to run or change experiments, use a "
                    "copy in a writable folder (--db sqlite:///COPY) or remount it writable."
                ) from e
            raise StoreError(
                f"the experiment store {safe_url(self.url)} cannot be written: {reason}. "
                "What it recorded before is intact and trials resume from their latest "
                "checkpoints: free space on the disk that holds it (or its server's), then "
                "continue with `jaxcore experiment resume ID` (`jaxcore experiment list` "
                "shows the ID)."
            ) from e

    def _retry(self, fn: Any, attempts: int = 30) -> Any:
        with self._storage_errors():
            return self._retry_transient(fn, attempts)

    @staticmethod
    def _retry_transient(fn: Any, attempts: int) -> Any:
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

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Every store call in this thread inside the block commits (or not) as one.

        The experiment loop makes each turn atomic this way: its searcher snapshot, the
        trials it creates, its decisions and acknowledgements, so a loop killed at any
        point resumes from a state where every decision it made is either recorded in
        full or not at all. Not retried: keep the block free of irreversible effects.
        """
        if getattr(self._local, "conn", None) is not None:
            yield  # nested: part of the outer transaction
            return
        with self._storage_errors(), self.engine.begin() as conn:
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    def _run(self, fn: Any) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return fn(conn)

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
    def create_experiment(
        self, name: str, config: dict, workdir: str, *, owner: str | None = None
    ) -> int:
        row = dict(
            name=name,
            config=config,
            state="ACTIVE",
            workdir=workdir,
            created=now(),
            uuid=str(uuidlib.uuid4()),
            owner=owner,
        )
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

    def claim_experiment(self, exp_id: int, owner: str, expected: str | None) -> bool:
        """Make ``owner`` the experiment's loop if its owner is still ``expected``.

        A compare-and-set, so of two ``resume`` commands racing for a dead loop's
        experiment exactly one wins.
        """

        def cas(c):
            cond = experiments.c.owner == expected if expected else experiments.c.owner.is_(None)
            result = c.execute(
                experiments.update().where(experiments.c.id == exp_id, cond).values(owner=owner)
            )
            return result.rowcount == 1

        return self._run(cas)

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
        """Record a report; a repeat of a (trial, step, kind) already recorded is not
        added again (a trial restarted from an older checkpoint re-reports those steps):
        returns the id of the row that holds it."""
        clean = {k: float(v) for k, v in values.items()}
        row = dict(trial_id=trial_id, step=int(step), kind=kind, values=clean, time=time.time())

        def write(c):
            old = c.execute(
                sa.select(metrics.c.id).where(
                    metrics.c.trial_id == trial_id,
                    metrics.c.step == int(step),
                    metrics.c.kind == kind,
                )
            ).scalar()
            if old is not None:
                return old
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
        self,
        trial_id: int,
        step: int,
        path: str,
        fmt: str,
        values: dict | None = None,
        meta_: dict | None = None,
    ) -> int:
        """Record a finished checkpoint in the ledger: one row per (trial, step, path).

        Saving a step again (a preemption on a checkpoint step, a restarted trial) updates
        that row instead of adding a second one, so retention can never delete a
        directory through one row that another row still points at.
        """
        key = (
            checkpoints.c.trial_id == trial_id,
            checkpoints.c.step == int(step),
            checkpoints.c.path == str(path),
        )
        row = dict(
            trial_id=trial_id,
            step=int(step),
            path=str(path),
            format=fmt,
            state="COMPLETED",
            metrics=values,
            meta=meta_,
            created=now(),
            deleted=None,
        )

        def write(c):
            old = c.execute(sa.select(checkpoints.c.id).where(*key)).scalar()
            if old is None:
                return c.execute(checkpoints.insert().values(**row)).inserted_primary_key[0]
            update = {k: v for k, v in row.items() if v is not None or k == "deleted"}
            if not values:
                update.pop("metrics", None)  # a re-save without metrics keeps the ranking
            c.execute(checkpoints.update().where(checkpoints.c.id == old).values(**update))
            return old

        return self._run(write)

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

    def mark_deleted(self, ckpt_ids: list[int]) -> None:
        self._run(
            lambda c: c.execute(
                checkpoints.update()
                .where(checkpoints.c.id.in_(list(ckpt_ids)))
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

    def delete_version(self, model_id: int, version: int) -> None:
        """Drop a version row (a registration whose files could not be written)."""
        self._run(
            lambda c: c.execute(
                model_versions.delete().where(
                    model_versions.c.model_id == model_id, model_versions.c.version == version
                )
            )
        )

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
