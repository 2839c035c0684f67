"""The dashboard: experiments, trials, metrics, checkpoints, models and datasets in a browser.

``jaxcore ui --workdir experiments`` serves it on http://127.0.0.1:8765 (FastAPI +
uvicorn, the inference server's stack). Read-only: it reads the experiment store
(SQLite or PostgreSQL) and ``data build`` snapshot directories and never writes either.
A bind beyond 127.0.0.1 requires an access token. Needs the ``ui`` extra.
"""

from jaxcore.ui.app import create_app, dataset_roots
from jaxcore.ui.auth import TokenMiddleware, is_local_host
from jaxcore.ui.queries import StoreReader

__all__ = ["StoreReader", "TokenMiddleware", "create_app", "dataset_roots", "is_local_host"]
