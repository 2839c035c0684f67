"""``jaxcore ui``: serve the dashboard over an experiment store (and dataset snapshots).

    jaxcore ui --workdir experiments                  # http://127.0.0.1:8765
    jaxcore ui --db postgresql://... --datasets out   # a team's store, a dataset's builds
    JAXCORE_UI_TOKEN=... jaxcore ui --host 0.0.0.0    # beyond this machine: token required

The token comes from ``$JAXCORE_UI_TOKEN`` or ``--token-file``, never from an argument
(arguments are visible to every user in ``ps``), and is never printed or logged.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import pathlib
import socket
import stat
import sys

from jaxcore.errors import ConfigError
from jaxcore.ui.auth import TOKEN_ENV, RedactTokenFilter, check_token, is_local_host
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
        default=None,
        help="experiment workdir whose jaxcore.db is shown (default: experiments)",
    )
    p.add_argument(
        "--db",
        default=None,
        help="SQLAlchemy URL of the store (overrides --workdir; default $JAXCORE_DB "
        "(or $JAXCORE_DB_URL), as for 'jaxcore experiment', else sqlite:///<workdir>/jaxcore.db)",
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
    """The access token from ``--token-file`` or the environment (None when neither).

    A token file that is empty, a folder, not text, or more than one word is named with
    its fix (an empty one was reported as "--host 127.0.0.1 is not local", a binary one
    was a UnicodeDecodeError traceback)."""
    if token_file:
        path = pathlib.Path(token_file).expanduser()
        make = f"write one into it: openssl rand -hex 24 > {token_file}; chmod 600 {token_file}"
        if path.is_dir():
            raise ConfigError(
                f"--token-file {token_file} is a folder; give the file that holds the token."
            )
        if not path.is_file():
            raise ConfigError(f"--token-file {token_file}: no such file; {make}")
        try:
            token = path.read_text().strip()
        except UnicodeDecodeError:
            raise ConfigError(
                f"--token-file {token_file} is not a text file; it holds the token as one "
                f"line: {make}"
            ) from None
        except OSError as e:
            raise ConfigError(f"--token-file {token_file} cannot be read ({e.strerror}).") from None
        if not token:
            raise ConfigError(f"--token-file {token_file} is empty; {make}")
        where = f"--token-file {token_file}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        where = f"${TOKEN_ENV}"
    if token:
        check_token(token, where)
    return token or None


def token_file_warning(token_file: str | None) -> str | None:
    """A warning when every user of this machine can read the token file (mode 0644,
    what ``echo ... > tok`` makes under the usual umask): the token then guards nothing
    on the shared machine ``--token-file`` is for (OpenSSH refuses such key files)."""
    if not token_file:
        return None
    try:
        mode = os.stat(os.path.expanduser(token_file)).st_mode
    except OSError:
        return None
    if not mode & stat.S_IROTH:
        return None
    return (
        f"jaxcore ui: warning: --token-file {token_file} can be read by every user of this "
        f"machine (mode {stat.S_IMODE(mode):04o}); make it yours alone: chmod 600 {token_file}"
    )


def store_url(args: argparse.Namespace) -> str:
    """The store: ``--db``, else ``$JAXCORE_DB`` (or ``$JAXCORE_DB_URL``) as for the
    experiment commands, else ``<workdir>/jaxcore.db``. A ``--db`` that is a path, not a
    URL, and a workdir that is a file are refused with what to write instead."""
    import sqlalchemy as sa

    from jaxcore.experiments.store import file_in_the_way

    db = args.db or os.environ.get("JAXCORE_DB") or os.environ.get("JAXCORE_DB_URL")
    if db is not None:
        try:
            sa.engine.make_url(db)
        except sa.exc.ArgumentError:
            flag = (
                "--db"
                if args.db
                else "$JAXCORE_DB"
                if os.environ.get("JAXCORE_DB")
                else ("$JAXCORE_DB_URL")
            )
            raise ConfigError(
                f"{flag} {db!r} is not a database URL; write sqlite:///"
                f"{os.path.abspath(os.path.expanduser(db))} (or --workdir FOLDER) or "
                "postgresql://USER@HOST/DB."
            ) from None
        return db
    workdir = os.path.expanduser(args.workdir or "experiments")  # `--workdir=~/x`: no shell
    blocker = file_in_the_way(workdir)
    if blocker is not None:
        raise ConfigError(
            f"--workdir {workdir}: {blocker} is a file, not an experiment workdir; give "
            "the folder holding jaxcore.db (the experiment config's workdir:)."
        )
    return f"sqlite:///{os.path.abspath(os.path.join(workdir, 'jaxcore.db'))}"


def resolve(args: argparse.Namespace) -> tuple[str, str | None]:
    """(store URL, token or None), validating the bind/token combination."""
    db = store_url(args)
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
    return db, token if needs else None


def check_datasets(dirs: list[str] | None) -> list[str]:
    """``--datasets`` must name ``data build`` output_dirs: a version folder (one with a
    ``manifest.json``) or a folder inside one (``out/v1/shards``) showed an empty dataset
    without a word, so it is refused naming its output_dir; so is a file. A folder that is
    not there yet (a first build still to run) is allowed; the returned notes say so."""
    notes = []
    for d in dirs or []:
        path = pathlib.Path(d).expanduser()
        for version in (path, *path.parents):
            if (version / "manifest.json").is_file():
                where = "one version" if version == path else "inside one version"
                raise ConfigError(
                    f"--datasets {d} is {where} of a build ({version} holds manifest.json); "
                    f"give its output_dir: --datasets {version.parent}"
                )
        if path.exists() and not path.is_dir():
            raise ConfigError(
                f"--datasets {d} is a file, not a 'data build' output_dir (the folder its "
                "config's output_dir: names, holding one folder per version)."
            )
        if not path.is_dir():
            notes.append(
                f"jaxcore ui: no folder {path.absolute()} yet; its versions show once a "
                "'data build' writes there (--datasets takes a build's output_dir)."
            )
    return notes


def listen(host: str, port: int) -> socket.socket:
    """The bound socket the server is handed (uvicorn's own bind, done first): a port in
    use printed the URL as if serving, then uvicorn's startup, an "[Errno 98]" ERROR and
    its shutdown; now it is one line before anything else, naming --port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is in use (another jaxcore ui or server); stop it "
                f"or pass another --port, e.g. --port {port + 1 if port < 65535 else 8765}."
            ) from None
        raise ConfigError(
            f"cannot listen on {host}:{port} ({e.strerror or e}); check --host (an address "
            "of this machine) and --port (below 1024 needs root)."
        ) from None
    return sock


def _serve(app: object, sock: socket.socket) -> None:
    """Serve ``app`` on the bound ``sock`` until Ctrl-C (as ``uvicorn.run`` does)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level="info"))  # type: ignore[arg-type]
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; returns the exit status."""
    import sqlalchemy as sa

    from jaxcore.experiments.store import safe_url

    args = _parser().parse_args(argv)
    try:
        db, token = resolve(args)
        notes = check_datasets(args.datasets)
        from jaxcore.ui.app import create_app

        try:
            app = create_app(db, datasets=args.datasets, token=token)
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as e:
            raise ConfigError(
                f"store {safe_url(db)}: not a database this dashboard can open ({e}); use "
                "sqlite:///PATH/jaxcore.db or postgresql://USER@HOST/DB."
            ) from None
        sock = listen(args.host, args.port)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(RedactTokenFilter())
    path = sqlite_path(db)
    if path is not None and not os.path.exists(path):
        print(
            f"jaxcore ui: no store at {path} yet; the pages fill in once an experiment "
            "starts there (or pass --workdir / --db).",
            file=sys.stderr,
        )
    env = next((v for v in ("JAXCORE_DB", "JAXCORE_DB_URL") if os.environ.get(v)), None)
    if args.workdir and not args.db and env:
        notes.append(
            f"jaxcore ui: --workdir {args.workdir} is not used: ${env} names the store (as for "
            f"'jaxcore experiment'); unset it to show {args.workdir}, or pass --db URL."
        )
    for note in [*notes, token_file_warning(args.token_file)]:
        if note:
            print(note, file=sys.stderr)
    where = "with its access token" if token else "no token (local bind)"
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"jaxcore ui: http://{host}:{args.port}/ ({where}); store {safe_url(db)}", flush=True)
    _serve(app, sock)
    return 0
