"""``jaxcore experiment|trial|model|train ...``: the experiments command line.

``main(argv)`` takes the full argv starting with the group name, e.g.
``["experiment", "create", "x.yaml"]``. The store is, in this order: ``--db URL``;
``$JAXCORE_DB`` (or ``$JAXCORE_DB_URL``); the config's (``database:``, else
``<workdir>/jaxcore.db``) for commands given a config (``--config`` for the others);
else ``./experiments/jaxcore.db`` or ``./jaxcore.db`` if one exists. Every command says
which store it uses (on stderr); commands that only read never create a database.
Exit status: 0 done, 1 the experiment FAILED (or what was asked for does not exist),
2 a configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
from typing import Any

from jaxcore.errors import ConfigError, JaxcoreError

DISCOVERED = ("experiments/jaxcore.db", "jaxcore.db")


def _row_id(text: str) -> int:
    """An experiment, trial or checkpoint id as the store can hold it (argparse type)."""
    from jaxcore.experiments.store import MAX_ROW_ID

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a whole number)") from None
    if not 0 <= value <= MAX_ROW_ID:
        raise argparse.ArgumentTypeError(f"{text} is not an id (0 to {MAX_ROW_ID})")
    return value


def _env_db() -> str | None:
    return os.environ.get("JAXCORE_DB") or os.environ.get("JAXCORE_DB_URL")


def _db(args: argparse.Namespace, config: Any = None) -> str:
    """The store's URL (see the module docstring for the order)."""
    if getattr(args, "db", None):
        return args.db
    if _env_db():
        return _env_db()
    if config is None and getattr(args, "config_file", None):
        config = _load(args.config_file)
    if config is not None:
        return config.database_url
    for rel in DISCOVERED:
        if pathlib.Path(rel).is_file():
            return f"sqlite:///{pathlib.Path(rel).absolute()}"
    raise ConfigError(
        f"no experiment store found: {' or '.join(DISCOVERED)} do not exist in "
        f"{os.getcwd()}. Give --db URL, set JAXCORE_DB, pass --config x.yaml (its "
        "workdir's store), or run from the folder holding the experiments."
    )


def _store(args: argparse.Namespace, config: Any = None, *, create: bool = False) -> Any:
    """Open the store; a command that only reads refuses a SQLite file that is absent
    (opening it would silently create an empty database)."""
    from jaxcore.experiments.store import normalize_url, safe_url

    url = normalize_url(_db(args, config))
    if not create and url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        if path != ":memory:" and not pathlib.Path(path).is_file():
            raise ConfigError(
                f"store {safe_url(url)} does not exist (no file {path}); give the store of "
                "an existing experiment with --db or JAXCORE_DB."
            )
    print(f"jaxcore: store {safe_url(url)}", file=sys.stderr, flush=True)
    return _open_store(url)


def _new_sqlite_file(url: str) -> pathlib.Path | None:
    """The SQLite file ``url`` names when it does not exist yet (``create`` makes it)."""
    from jaxcore.experiments.store import normalize_url

    url = normalize_url(url)
    if not url.startswith("sqlite:///") or url.endswith(":memory:"):
        return None
    path = pathlib.Path(url.removeprefix("sqlite:///"))
    return None if path.exists() else path


def _forget_new_store(store: Any, path: pathlib.Path | None, workdir: str) -> None:
    """Undo what a refused ``create`` made: close ``store`` and, when this command created
    its SQLite file at ``path``, remove it and the workdir's binding to it (a binding to a
    removed store would refuse the next ``create`` over the same workdir)."""
    from jaxcore.experiments.experiment import WORKDIR_MARK

    try:
        uuid = store.uuid if path is not None else None
        # This command's refused loop recorded nothing (its first turn is one transaction),
        # so an experiment or model here is another command's that opened the same new
        # file meanwhile (two creates in a fresh folder): the store is theirs now.
        used = path is not None and bool(store.experiments() or store.models())
    except Exception:  # the store never got that far
        uuid, used = None, False
    store.close()
    if path is None or used:
        return
    mark = pathlib.Path(workdir) / WORKDIR_MARK
    with contextlib.suppress(OSError, ValueError):  # no binding was written
        if uuid is not None and json.loads(mark.read_text()).get("store_uuid") == uuid:
            mark.unlink()
    for suffix in ("", "-wal", "-shm", "-journal"):
        pathlib.Path(f"{path}{suffix}").unlink(missing_ok=True)


def _open_store(url: str) -> Any:
    """`Store(url)`, with a URL that names no database, a database without its driver
    or a server that does not answer as one-line `ConfigError`s (they were tracebacks)."""
    import sqlalchemy as sa

    from jaxcore.experiments.store import Store, safe_url

    kinds = "sqlite:///PATH/jaxcore.db or postgresql://USER@HOST/DB"
    try:
        return Store(url)
    except sa.exc.ArgumentError:
        raise ConfigError(
            f"store {url!r} is not a database URL; write {kinds} (--db or $JAXCORE_DB)."
        ) from None
    except (sa.exc.NoSuchModuleError, ImportError) as e:
        raise ConfigError(
            f"store {safe_url(url)}: this database is not supported here ({e}); use {kinds}."
        ) from None
    except sa.exc.OperationalError as e:
        cause = (str(e.orig).strip().splitlines() or [type(e.orig).__name__])[0]
        check = (
            "check the file's path and permissions"
            if url.startswith("sqlite")
            else "check that its server is up and the URL's host, port and credentials"
        )
        raise ConfigError(
            f"store {safe_url(url)} cannot be opened: {cause}; {check}, or give another with --db."
        ) from None


def _print_table(rows: list[dict], cols: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*("" if r.get(c) is None else str(r.get(c)) for c in cols))
    Console().print(table)


def _load(path: str) -> Any:
    from jaxcore.experiments.config import load_config

    url = _env_db()
    return load_config(path, {"database": url} if url else None)


def _config(args: argparse.Namespace) -> Any:
    from jaxcore.experiments.config import load_config

    url = getattr(args, "db", None) or _env_db()
    return load_config(args.config, {"database": url} if url else None)


def _exit_code(state: str) -> int:
    return 1 if state == "FAILED" else 0


# --------------------------------------------------------------------- experiment
def _create(args: argparse.Namespace) -> int:
    from jaxcore.experiments.experiment import ExperimentLoop
    from jaxcore.experiments.runner import check_entrypoint

    config = _config(args)  # validated before anything starts
    check_entrypoint(config.entrypoint)  # importable and callable, before any store
    new_file = _new_sqlite_file(config.database_url)
    store = _store(args, config, create=True)
    try:
        loop = ExperimentLoop(
            config,
            store=store,
            executor=args.executor,
            progress=not args.quiet,
            ray_address=args.ray_address,
        )
    except BaseException:  # refused (no Ray cluster, ...): leave no empty store behind
        _forget_new_store(store, new_file, config.workdir)
        raise
    args.experiment_id, args.store_url = loop.exp_id, store.url  # for an interrupt's advice
    print(
        f"experiment {loop.exp_id} created ({config.searcher.name}, "
        f"{loop.experiment['uuid']}); workdir {loop.workdir}",
        flush=True,
    )
    summary = loop.run()
    print(
        json.dumps(
            {
                "experiment": summary.experiment_id,
                "state": summary.state,
                "trials": len(summary.trials),
                "best_trial": summary.best_trial,
                "best_metric": summary.best_metric,
                "steps": summary.steps_trained,
            }
        )
    )
    return _exit_code(summary.state)


def _list(args: argparse.Namespace) -> int:
    store = _store(args)
    rows = []
    for e in store.experiments():
        trials = store.trials(e["id"])
        rows.append(
            {
                "id": e["id"],
                "name": e["name"],
                "state": e["state"],
                "searcher": e["config"]["searcher"]["name"],
                "trials": len(trials),
                "best": e["best_metric"],
                "created": e["created"],
            }
        )
    _print_table(rows, ["id", "name", "state", "searcher", "trials", "best", "created"])
    return 0


def _describe(args: argparse.Namespace) -> int:
    store = _store(args)
    exp = store.experiment(args.id)
    if exp is None:
        print(f"no experiment {args.id} in {store.url}", file=sys.stderr)
        return 1
    metric = exp["config"]["searcher"]["metric"]
    print(
        f"experiment {exp['id']} {exp['name']!r} ({exp.get('uuid')}): {exp['state']}, best "
        f"{metric} {exp['best_metric']}, workdir {exp['workdir']}"
    )
    rows = []
    for t in store.trials(args.id):
        vals = [m["values"][metric] for m in store.metrics(t["id"], kind="validation")]
        ckpts = store.checkpoints(trial_id=t["id"], state="COMPLETED")
        rows.append(
            {
                "trial": t["id"],
                "state": t["state"],
                "steps": t["steps_done"],
                "restarts": t["restarts"],
                "hparams": json.dumps(t["hparams"]),
                f"last {metric}": f"{vals[-1]:.4g}" if vals else None,
                "checkpoints": ",".join(f"{c['id']}@{c['step']}" for c in ckpts),
            }
        )
    _print_table(rows, list(rows[0]) if rows else ["trial"])
    return 0


def _set_state(args: argparse.Namespace, state: str) -> int:
    from jaxcore.experiments.experiment import owner_alive
    from jaxcore.experiments.store import EXPERIMENT_DONE

    store = _store(args)
    exp = store.experiment(args.id)
    if exp is None:
        print(f"no experiment {args.id} in this store", file=sys.stderr)
        return 1
    if exp["state"] in EXPERIMENT_DONE:
        print(f"experiment {args.id} is {exp['state']}; nothing to change", file=sys.stderr)
        return 1
    alive = owner_alive(exp)
    if state != "ACTIVE" or alive:
        store.update_experiment(args.id, state=state)
        where = f"its loop ({exp['owner']}) acts on it" if alive else "its loop is not running"
        print(f"experiment {args.id}: {state} ({where})")
        if alive or state != "CANCELED":
            return 0
        # Nobody will act on the cancel: record it (its trials died with their loop).
        from jaxcore.experiments.store import TERMINAL, now

        for t in store.trials(args.id):
            if t["state"] not in TERMINAL:
                store.update_trial(t["id"], state="CANCELED", ended=now())
        store.update_experiment(args.id, ended=now(), owner=None)
        return 0
    from jaxcore.experiments.experiment import ExperimentLoop, config_of

    print(f"experiment {args.id}: its loop ({exp['owner']}) is gone; resuming it here", flush=True)
    args.experiment_id, args.store_url = args.id, store.url
    loop = ExperimentLoop(
        config_of(store, args.id),
        store=store,
        experiment_id=args.id,
        executor=args.executor,
        progress=not args.quiet,
    )
    summary = loop.run()
    print(
        json.dumps(
            {"experiment": args.id, "state": summary.state, "best_metric": summary.best_metric}
        )
    )
    return _exit_code(summary.state)


def _preview(args: argparse.Namespace) -> int:
    from jaxcore.experiments.preview import preview

    out = preview(_config(args))
    print(json.dumps(out, indent=1))
    return 0


# --------------------------------------------------------------------- trial / model / train
def _trial_describe(args: argparse.Namespace) -> int:
    store = _store(args)
    row = store.trial(args.id)
    if row is None:
        print(f"no trial {args.id} in this store", file=sys.stderr)
        return 1
    ckpts = store.checkpoints(trial_id=args.id)
    print(
        f"trial {row['id']} of experiment {row['experiment_id']}: {row['state']}, "
        f"{row['steps_done']}/{row['max_length']} steps, restarts {row['restarts']}, "
        f"hparams {json.dumps(row['hparams'])}"
    )
    _print_table(
        [{**c, "metrics": json.dumps(c["metrics"])} for c in ckpts],
        ["id", "step", "state", "metrics", "path"],
    )
    if args.metrics:
        metrics = store.metrics(args.id)
        keys = sorted({k for m in metrics for k in m["values"]})
        rows = [
            {"step": m["step"], "kind": m["kind"], **{k: m["values"].get(k) for k in keys}}
            for m in metrics
        ]
        _print_table(rows, ["step", "kind", *keys])
    return 0


def _trial_logs(args: argparse.Namespace) -> int:
    from jaxcore.experiments.store import TERMINAL
    from jaxcore.experiments.trial_context import trial_dir

    store = _store(args)
    row = store.trial(args.id)
    if row is None:
        print(f"no trial {args.id} in this store", file=sys.stderr)
        return 1
    exp = store.experiment(row["experiment_id"])
    path = trial_dir(exp, args.id) / "logs.txt"
    if not path.exists():
        if row["state"] in TERMINAL:
            # An inline trial (`jaxcore train`, `--executor inline`) wrote to the terminal
            # of the command that ran it; only its failure is appended to this file.
            print(
                f"trial {args.id} is {row['state']} and wrote no log file ({path}): it ran "
                "inside the command that launched it ('jaxcore train' or --executor inline), "
                "whose terminal got its output",
                file=sys.stderr,
            )
        else:
            print(f"trial {args.id} has no logs yet ({path})", file=sys.stderr)
        return 1
    sys.stdout.write(path.read_text(errors="replace"))
    return 0


def _model(args: argparse.Namespace) -> int:
    from jaxcore.experiments.registry import Registry

    reg = Registry(_store(args, create=args.action == "create"))
    if args.action == "create":
        reg.create_model(args.name, description=args.description, tags=args.tag or [])
        print(f"model {args.name!r} created")
    elif args.action == "register":
        v = reg.register(
            args.name,
            checkpoint=args.checkpoint,
            description=args.description,
            aliases=args.alias or [],
            tags=args.tag or [],
        )
        print(f"model {args.name!r} version {v} registered")
    elif args.action == "list":
        rows = [{**m, "aliases": json.dumps(m["aliases"])} for m in reg.list()]
        _print_table(rows, ["id", "name", "versions", "aliases", "description"])
    else:
        info = reg.describe(args.name)
        print(f"model {info['name']!r}: {info['description']} aliases {info['aliases']}")
        _print_table(
            info["versions"],
            ["version", "checkpoint_id", "metrics", "path", "description", "created"],
        )
        from jaxcore.run.lineage import format_chain  # the chain back to the data

        for v in info["versions"]:
            print("\n".join(format_chain(info["name"], v)))
    return 0


def _train(args: argparse.Namespace) -> int:
    """One trial of the config's code, alone, in this process (searcher ``single``)."""
    import dataclasses

    from jaxcore.experiments.experiment import ExperimentLoop

    config = _config(args)
    s = config.searcher
    length = {}
    if s.name == "pbt" and s.length is None:
        # PBT has no max_length: one trial trains what a member that survives every
        # round does (the example pbt_tiny_lm.yaml was refused for a key it need not have).
        length = {"max_length": s.num_rounds * s.length_per_round}
    single = dataclasses.replace(s, name="single", **length)
    config = dataclasses.replace(config, searcher=single)
    from jaxcore.experiments.runner import check_entrypoint

    check_entrypoint(config.entrypoint)
    store = _store(args, config, create=True)
    loop = ExperimentLoop(config, store=store, executor="inline")
    args.experiment_id, args.store_url = loop.exp_id, store.url
    summary = loop.run()
    trial = summary.trials[0]
    print(
        json.dumps(
            {
                "experiment": summary.experiment_id,
                "trial": trial["id"],
                "state": trial["state"],
                "steps": trial["steps_done"],
                "best_metric": summary.best_metric,
            }
        )
    )
    return 0 if trial["state"] in ("COMPLETED", "STOPPED") else 1


# --------------------------------------------------------------------- parser
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxcore", description=__doc__.splitlines()[0])
    groups = p.add_subparsers(dest="group", required=True)

    def common(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--db", help="store URL (default: $JAXCORE_DB, else the config's)")
        return sp

    def located(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        common(sp).add_argument(
            "--config", dest="config_file", help="use this experiment config's store"
        )
        return sp

    exp = groups.add_parser("experiment", help="create and manage searches")
    es = exp.add_subparsers(dest="action", required=True)
    c = common(es.add_parser("create", help="run a search from a YAML config"))
    c.add_argument("config")
    c.add_argument("--executor", choices=("local", "inline", "ray"), default="local")
    c.add_argument("--ray-address", default=None, help="Ray cluster (default: start one)")
    c.add_argument("--quiet", action="store_true", help="no live progress table")
    c.set_defaults(fn=_create)
    located(es.add_parser("list")).set_defaults(fn=_list)
    for name, fn in (
        ("describe", _describe),
        ("pause", lambda a: _set_state(a, "PAUSED")),
        ("resume", lambda a: _set_state(a, "ACTIVE")),
        ("kill", lambda a: _set_state(a, "CANCELED")),
    ):
        sp = located(es.add_parser(name))
        sp.add_argument("id", type=_row_id)
        if name == "resume":
            sp.add_argument("--executor", choices=("local", "inline", "ray"), default="local")
            sp.add_argument("--quiet", action="store_true")
        sp.set_defaults(fn=fn)
    pv = common(es.add_parser("preview", help="trials and steps a searcher will run"))
    pv.add_argument("config")
    pv.set_defaults(fn=_preview)

    trial = groups.add_parser("trial", help="inspect trials")
    ts = trial.add_subparsers(dest="action", required=True)
    lg = located(ts.add_parser("logs"))
    lg.add_argument("id", type=_row_id)
    lg.set_defaults(fn=_trial_logs)
    td = located(ts.add_parser("describe", help="a trial's state, checkpoints, metrics"))
    td.add_argument("id", type=_row_id)
    td.add_argument("--metrics", action="store_true", help="print its metric history")
    td.set_defaults(fn=_trial_describe)

    model = groups.add_parser("model", help="the model registry")
    ms = model.add_subparsers(dest="action", required=True)
    for name in ("create", "register", "list", "describe"):
        sp = located(ms.add_parser(name))
        if name != "list":
            sp.add_argument("name")
        if name == "register":
            sp.add_argument("checkpoint", help="checkpoint id (experiment describe) or dir")
            sp.add_argument("--alias", action="append", help="e.g. production (repeatable)")
        if name in ("create", "register"):
            sp.add_argument("--description", default="")
            sp.add_argument("--tag", action="append")
        sp.set_defaults(fn=_model)

    tr = common(groups.add_parser("train", help="run a config's code as one trial"))
    tr.add_argument("config")
    tr.set_defaults(fn=_train)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``argv`` starts with the group (``experiment``, ``trial``, ...)."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:
        # `jaxcore model describe NAME | head`: the reader left. End quietly, as rich does
        # for the tables (status 1); stdout goes to /dev/null so the exit's flush of what
        # is still buffered cannot raise again (Python's docs, "Note on SIGPIPE").
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1
    except JaxcoreError as e:
        print(f"jaxcore {args.group}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: one line saying what is left and how to go on (it was a traceback from
        # the loop's sleep). The loop's turns are store transactions and its trials die
        # with it, so `experiment resume` continues from the trials' latest checkpoints.
        exp_id = getattr(args, "experiment_id", None)
        if exp_id is None:
            print(f"jaxcore {args.group}: interrupted", file=sys.stderr)
        else:
            from jaxcore.experiments.store import safe_url

            print(
                f"jaxcore {args.group}: interrupted; experiment {exp_id} stays ACTIVE with "
                f"its checkpoints: 'jaxcore experiment resume {exp_id} --db "
                f"{safe_url(args.store_url)}' continues it, 'jaxcore experiment kill "
                f"{exp_id}' ends it.",
                file=sys.stderr,
            )
        return 130


if __name__ == "__main__":
    sys.exit(main())
