"""``jaxcore experiment|trial|model|train ...``: the experiments command line.

``main(argv)`` takes the full argv starting with the group name, e.g.
``["experiment", "create", "x.yaml"]``. The database is ``--db URL``, else
``$JAXCORE_DB_URL``, else (for commands given a config) the config's, else
``sqlite:///experiments/jaxcore.db``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from jaxcore.errors import JaxcoreError

STALE_S = 10.0  # an experiment loop that has not beaten for this long is gone


def _db(args: argparse.Namespace, config: Any = None) -> str:
    from jaxcore.experiments.registry import DEFAULT_DB

    if getattr(args, "db", None):
        return args.db
    if os.environ.get("JAXCORE_DB_URL"):
        return os.environ["JAXCORE_DB_URL"]
    return config.database_url if config is not None else DEFAULT_DB


def _store(args: argparse.Namespace, config: Any = None) -> Any:
    from jaxcore.experiments.store import Store

    return Store(_db(args, config))


def _print_table(rows: list[dict], cols: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*("" if r.get(c) is None else str(r.get(c)) for c in cols))
    Console().print(table)


def _config(args: argparse.Namespace) -> Any:
    from jaxcore.experiments.config import load_config

    url = getattr(args, "db", None) or os.environ.get("JAXCORE_DB_URL")
    return load_config(args.config, {"database": url} if url else None)


# --------------------------------------------------------------------- experiment
def _create(args: argparse.Namespace) -> int:
    from jaxcore.experiments.experiment import ExperimentLoop

    config = _config(args)  # validated before anything starts
    loop = ExperimentLoop(
        config, executor=args.executor, progress=not args.quiet, ray_address=args.ray_address
    )
    print(
        f"experiment {loop.exp_id} created ({config.searcher.name}); store {loop.store.url}",
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
    return 0


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
        f"experiment {exp['id']} {exp['name']!r}: {exp['state']}, best {metric} "
        f"{exp['best_metric']}"
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
    store = _store(args)
    exp = store.experiment(args.id)
    if exp is None:
        print(f"no experiment {args.id} in {store.url}", file=sys.stderr)
        return 1
    if exp["state"] in ("COMPLETED", "KILLED"):
        print(f"experiment {args.id} is {exp['state']}; nothing to change", file=sys.stderr)
        return 1
    store.update_experiment(args.id, state=state)
    alive = exp["heartbeat"] is not None and time.time() - exp["heartbeat"] < STALE_S
    print(f"experiment {args.id}: {state}" + ("" if alive else " (its loop is not running)"))
    if state == "ACTIVE" and not alive:
        from jaxcore.experiments.experiment import ExperimentLoop, config_of

        print("starting its loop here", flush=True)
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
    return 0


def _preview(args: argparse.Namespace) -> int:
    from jaxcore.experiments.preview import preview

    out = preview(_config(args))
    print(json.dumps(out, indent=1))
    return 0


# --------------------------------------------------------------------- trial / model / train
def _trial_logs(args: argparse.Namespace) -> int:
    from jaxcore.experiments.context import trial_dir

    store = _store(args)
    row = store.trial(args.id)
    if row is None:
        print(f"no trial {args.id} in {store.url}", file=sys.stderr)
        return 1
    exp = store.experiment(row["experiment_id"])
    path = trial_dir(exp["workdir"], exp["id"], args.id) / "logs.txt"
    if not path.exists():
        print(f"trial {args.id} has no logs yet ({path})", file=sys.stderr)
        return 1
    sys.stdout.write(path.read_text(errors="replace"))
    return 0


def _model(args: argparse.Namespace) -> int:
    from jaxcore.experiments.registry import Registry

    reg = Registry(_db(args))
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
    return 0


def _train(args: argparse.Namespace) -> int:
    """One trial of the config's code, alone, in this process (searcher ``single``)."""
    import dataclasses

    from jaxcore.experiments.experiment import ExperimentLoop

    config = _config(args)
    s = config.searcher
    single = dataclasses.replace(s, name="single")
    config = dataclasses.replace(config, searcher=single)
    summary = ExperimentLoop(config, executor="inline").run()
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
        sp.add_argument("--db", help="database URL (default: $JAXCORE_DB_URL or the config's)")
        return sp

    exp = groups.add_parser("experiment", help="create and manage searches")
    es = exp.add_subparsers(dest="action", required=True)
    c = common(es.add_parser("create", help="run a search from a YAML config"))
    c.add_argument("config")
    c.add_argument("--executor", choices=("local", "inline", "ray"), default="local")
    c.add_argument("--ray-address", default=None, help="Ray cluster (default: start one)")
    c.add_argument("--quiet", action="store_true", help="no live progress table")
    c.set_defaults(fn=_create)
    common(es.add_parser("list")).set_defaults(fn=_list)
    for name, fn in (
        ("describe", _describe),
        ("pause", lambda a: _set_state(a, "PAUSED")),
        ("resume", lambda a: _set_state(a, "ACTIVE")),
        ("kill", lambda a: _set_state(a, "KILLED")),
    ):
        sp = common(es.add_parser(name))
        sp.add_argument("id", type=int)
        if name == "resume":
            sp.add_argument("--executor", choices=("local", "inline", "ray"), default="local")
            sp.add_argument("--quiet", action="store_true")
        sp.set_defaults(fn=fn)
    pv = common(es.add_parser("preview", help="trials and steps a searcher will run"))
    pv.add_argument("config")
    pv.set_defaults(fn=_preview)

    trial = groups.add_parser("trial", help="inspect trials")
    ts = trial.add_subparsers(dest="action", required=True)
    lg = common(ts.add_parser("logs"))
    lg.add_argument("id", type=int)
    lg.set_defaults(fn=_trial_logs)

    model = groups.add_parser("model", help="the model registry")
    ms = model.add_subparsers(dest="action", required=True)
    for name in ("create", "register", "list", "describe"):
        sp = common(ms.add_parser(name))
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
    except JaxcoreError as e:
        print(f"jaxcore {args.group}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
