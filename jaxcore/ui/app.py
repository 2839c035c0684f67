"""The dashboard's ASGI app: HTML pages, their static files, and a read-only JSON API.

Pages are static HTML + JavaScript shipped in the package (``jaxcore/ui/static``, the
Chart.js build vendored next to them, so it works offline). Each page fetches its data
from ``/api/...`` (a NaN or infinite number spelled "NaN", "Infinity", "-Infinity":
JSON has no literal for them, see `queries.wire`) and polls with the revision it has
(``?since=REV``); the server answers
``{"unchanged": true}`` until the store changes, so a running search updates the page
without a reload and an idle page costs a few cheap queries a second. Only GET routes
exist: the dashboard cannot change an experiment.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator, Iterable
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException, Path, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

from jaxcore.errors import ConfigError
from jaxcore.experiments.store import MAX_ROW_ID, safe_url
from jaxcore.ui import queries, snapshots
from jaxcore.ui.auth import TokenMiddleware, check_token

# A row id: what the store's integer keys can hold (a bigger one is a 422, not a 500 from
# the database driver).
RowId = Annotated[int, Path(ge=0, le=MAX_ROW_ID)]  # SQLite INTEGER

STATIC = pathlib.Path(__file__).with_name("static")
PAGES = {"experiments", "experiment", "trial", "models", "datasets"}


def store_error(reader: queries.StoreReader, error: sa.exc.DBAPIError) -> JSONResponse:
    """503 naming the store and the database's own words, instead of a bare 500 (and a
    traceback in the log at every poll): a damaged or locked file is the store's state,
    not a dashboard bug; the page shows this text while it keeps polling (logged once)."""
    cause = str(error.orig).strip() or type(error.orig).__name__
    where = reader.path or safe_url(reader.url)
    check = (
        f"check the file with: sqlite3 {reader.path} 'PRAGMA integrity_check' and restore "
        "it from a copy if it is damaged"
        if reader.path
        else "check that the database server is up and the store's tables are intact"
    )
    detail = (
        f"the experiment store {where} cannot be read: {cause}. The page retries every "
        f"second; if this persists, {check}, or point jaxcore ui at another store "
        "(--workdir DIR or --db URL)."
    )
    queries.warn_once(detail)
    return JSONResponse({"detail": detail}, status_code=503)


def dataset_roots(dirs: Iterable[str | pathlib.Path]) -> dict[str, pathlib.Path]:
    """``data build`` output directories by a short unique name (their folder name)."""
    roots: dict[str, pathlib.Path] = {}
    for d in dirs:
        path = pathlib.Path(d).expanduser().absolute()  # `--datasets=~/out`: no shell
        name, n = path.name or "dataset", 2
        while name in roots:
            name, n = f"{path.name}-{n}", n + 1
        roots[name] = path
    return roots


def create_app(
    db_url: str, *, datasets: Iterable[str | pathlib.Path] = (), token: str | None = None
) -> FastAPI:
    """The dashboard over the store at ``db_url`` and the dataset output directories.

    With ``token`` every route answers 401 unless the request carries it (see
    `jaxcore.ui.auth`); the CLI sets one whenever the bind is not local.
    """
    if token is not None:
        check_token(token, "create_app(token=...)")
    try:
        reader = queries.StoreReader(db_url)
    except sa.exc.ArgumentError:
        raise ConfigError(
            f"{db_url!r} is not a database URL; write sqlite:///PATH/jaxcore.db or "
            "postgresql://USER@HOST/DB."
        ) from None
    roots = dataset_roots(datasets)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        reader.close()

    app = FastAPI(
        title="jaxcore dashboard",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.reader = reader
    if token is not None:
        app.add_middleware(TokenMiddleware, token=token)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(sa.exc.DBAPIError)
    async def unreadable_store(_request: Request, error: sa.exc.DBAPIError) -> JSONResponse:
        return store_error(reader, error)

    def page(name: str) -> FileResponse:
        return FileResponse(STATIC / f"{name}.html", media_type="text/html")

    def found(data: dict[str, Any] | None, what: str) -> dict[str, Any]:
        if data is None:
            raise HTTPException(404, f"{what} does not exist in this store")
        return data

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:  # browsers ask for it whatever the page links: no 404
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    @app.get("/", include_in_schema=False)
    def experiments_page() -> FileResponse:
        return page("experiments")

    def page_of(kind: str, ident: str) -> Response:
        """The page of one experiment or trial; a name or other text where its id goes
        (`/experiments/asha-quad`) was FastAPI's JSON validation error as the page."""
        if ident.strip().lstrip("+-").isdigit():
            return page(kind)
        return PlainTextResponse(
            f"404: /{kind}s/ takes a {kind}'s id (a number, e.g. /{kind}s/1), not "
            f"{ident!r}; the experiments page (/) lists them with their ids.\n",
            status_code=404,
        )

    @app.get("/experiments/{exp_id}", include_in_schema=False)
    def experiment_page(exp_id: str) -> Response:
        return page_of("experiment", exp_id)

    @app.get("/trials/{trial_id}", include_in_schema=False)
    def trial_page(trial_id: str) -> Response:
        return page_of("trial", trial_id)

    @app.get("/models", include_in_schema=False)
    def models_page() -> FileResponse:
        return page("models")

    @app.get("/datasets", include_in_schema=False)
    def datasets_page() -> FileResponse:
        return page("datasets")

    @app.get("/api/experiments")
    def api_experiments(since: str | None = None) -> dict[str, Any]:
        rev = queries.revision(reader)
        if since is not None and since == rev:
            return {"revision": rev, "unchanged": True}
        return {
            "revision": rev,
            "store": reader.url.split("@")[-1],
            "experiments": queries.wire(queries.list_experiments(reader)),
        }

    @app.get("/api/experiments/{exp_id}")
    def api_experiment(exp_id: RowId, since: str | None = None) -> dict[str, Any]:
        if since is not None and since == queries.revision(reader, exp_id=exp_id):
            return {"revision": since, "unchanged": True}
        return queries.wire(
            found(queries.experiment_detail(reader, exp_id), f"experiment {exp_id}")
        )

    @app.get("/api/trials/{trial_id}")
    def api_trial(trial_id: RowId, since: str | None = None) -> dict[str, Any]:
        if since is not None and since == queries.trial_revision(reader, trial_id):
            return {"revision": since, "unchanged": True}
        return queries.wire(found(queries.trial_detail(reader, trial_id), f"trial {trial_id}"))

    @app.get("/api/models")
    def api_models() -> dict[str, Any]:
        return {
            "models": queries.wire(queries.list_models(reader)),
            "datasets": {name: str(p) for name, p in roots.items()},
        }

    @app.get("/api/datasets")
    def api_datasets() -> dict[str, Any]:
        return {"datasets": snapshots.list_datasets(roots)}

    @app.get("/api/datasets/{name}/diff")
    def api_dataset_diff(name: str, a: str, b: str) -> dict[str, Any]:
        if name not in roots:
            raise HTTPException(404, f"no dataset {name!r}; served: {sorted(roots)}")
        try:
            return snapshots.dataset_diff(roots[name], a, b)
        except ConfigError as e:
            raise HTTPException(400, str(e)) from e

    return app
