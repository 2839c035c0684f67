"""``jaxcore ui``: serve the dashboard over an experiment store (and dataset snapshots).

    jaxcore ui --workdir experiments                  # http://127.0.0.1:8765
    jaxcore ui --db postgresql://... --datasets out   # a team's store, a dataset's builds
    JAXCORE_UI_TOKEN=... jaxcore ui --host 0.0.0.0    # beyond this machine: token required

The token comes from ``$JAXCORE_UI_TOKEN`` or ``--token-file``, never from an argument
(arguments are visible to every user in ``ps``), and is never printed or logged.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys

from jaxcore.errors import ConfigError
from jaxcore.ui.auth import TOKEN_ENV, RedactTokenFilter, is_local_host
from jaxcore.ui.queries import sqlite_path


def _port(text: str) -> int:
    """A TCP port (argparse type); uvicorn bound --port 99999 as 34463 (modulo 65536)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1 to 65535)")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxcore ui",
        description="Serve the read-only dashboard over an experiment store and dataset builds.",
    )
    p.add_argument(
        "--workdir",
        default="experiments",
        help="experiment workdir whose jaxcore.db is shown (default: experiments)",
    )
    p.add_argument(
        "--db",
        default=None,
        help="SQLAlchemy URL of the store (overrides --workdir; default "
        "$JAXCORE_DB_URL or sqlite:///<workdir>/jaxcore.db)",
    )
    p.add_argument(
        "--datasets",
        action="append",
        default=[],
        metavar="DIR",
        help="a 'data build' output_dir (its version folders); repeatable",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default 127.0.0.1; any other needs a token)",
    )
    p.add_argument("--port", type=_port, default=8765, help="1 to 65535 (default 8765)")
    p.add_argument(
        "--token-file",
        default=None,
        help=f"file holding the access token, then required on any bind (default: ${TOKEN_ENV})",
    )
    p.add_argument(
        "--require-token",
        action="store_true",
        help="require the token even on a local bind (e.g. a shared machine)",
    )
    return p


def read_token(token_file: str | None) -> str | None:
    """The access token from ``--token-file`` or the environment (None when neither)."""
    if token_file:
        path = pathlib.Path(token_file)
        if not path.is_file():
            raise ConfigError(f"--token-file {token_file}: no such file.")
        token = path.read_text().strip()
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def resolve(args: argparse.Namespace) -> tuple[str, str | None]:
    """(store URL, token or None), validating the bind/token combination."""
    db = args.db or os.environ.get("JAXCORE_DB_URL")
    if db is None:
        db = f"sqlite:///{os.path.abspath(os.path.join(args.workdir, 'jaxcore.db'))}"
    token = read_token(args.token_file)
    # An explicit --token-file asks for the token even on a local bind (it was dropped
    # there without a word, leaving a shared machine's dashboard open); a token that is
    # only in the environment is still ignored by a local bind.
    needs = args.require_token or bool(args.token_file) or not is_local_host(args.host)
    if needs and token is None:
        why = "--require-token" if args.require_token else f"--host {args.host} is not local"
        raise ConfigError(
            f"jaxcore ui: {why}, so an access token is required; set ${TOKEN_ENV} (e.g. "
            f'export {TOKEN_ENV}="$(openssl rand -hex 24)") or pass --token-file PATH.'
        )
    if token is not None and len(token) < 16:
        raise ConfigError(f"the access token has {len(token)} characters; use at least 16.")
    return db, token if needs else None


def check_datasets(dirs: list[str] | None) -> list[str]:
    """``--datasets`` must name ``data build`` output_dirs: a version folder (one with a
    ``manifest.json``) showed an empty dataset without a word, so it is refused naming
    its output_dir. A folder that is not there yet (a first build still to run) is
    allowed; the returned notes say so."""
    notes = []
    for d in dirs or []:
        path = pathlib.Path(d)
        if (path / "manifest.json").is_file():
            raise ConfigError(
                f"--datasets {d} is one version of a build (it holds manifest.json); give "
                f"its output_dir: --datasets {path.parent}"
            )
        if not path.is_dir():
            notes.append(
                f"jaxcore ui: no folder {path.absolute()} yet; its versions show once a "
                "'data build' writes there (--datasets takes a build's output_dir)."
            )
    return notes


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        db, token = resolve(args)
        notes = check_datasets(args.datasets)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    from jaxcore.ui.app import create_app

    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(RedactTokenFilter())
    app = create_app(db, datasets=args.datasets, token=token)
    path = sqlite_path(db)
    if path is not None and not os.path.exists(path):
        print(
            f"jaxcore ui: no store at {path} yet; the pages fill in once an experiment "
            "starts there (or pass --workdir / --db).",
            file=sys.stderr,
        )
    for note in notes:
        print(note, file=sys.stderr)
    where = "with its access token" if token else "no token (local bind)"
    print(f"jaxcore ui: http://{args.host}:{args.port}/ ({where}); store {db}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
