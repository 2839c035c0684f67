"""Driving docs/experiments.md off its path (stop 44): the printed resume command run from
another folder, ``~`` and empty values in a config, two stores racing for one workdir."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import threading

import pytest

from jaxcore.errors import ConfigError
from jaxcore.experiments import Store, parse_config, run_experiment
from jaxcore.experiments.cli import main
from jaxcore.experiments.config import to_dict
from jaxcore.experiments.experiment import WORKDIR_MARK, bind_workdir, config_of

TRIAL = """
def quad(ctx):
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        ctx.report(step, {"loss": (ctx.hparams["x"] - 0.7) ** 2 + 1.0 / step})
"""


def _raw(**extra) -> dict:
    return {
        "name": "quad",
        "entrypoint": "obj.py:quad",
        "workdir": "experiments",
        "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        "searcher": {"name": "random", "metric": "loss", "max_length": 2, "max_trials": 1},
    } | extra


def _yaml(raw: dict) -> str:
    import yaml

    return yaml.safe_dump(raw)


def test_the_printed_resume_command_works_from_another_folder(tmp_path, monkeypatch, capsys):
    """The docs' ``file.py`` entrypoint is read from the folder ``create`` runs in; the
    Ctrl-C line then prints ``jaxcore experiment resume ID --db URL``, a command meant to
    run anywhere. The store kept the entrypoint relative (but the workdir absolute), so
    that resume failed from any other folder: "obj.py does not exist in /elsewhere"."""
    here, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    (here / "obj.py").write_text(TRIAL)
    monkeypatch.chdir(here)
    summary = run_experiment(_raw(), executor="inline", progress=False)
    db = f"sqlite:///{here}/experiments/jaxcore.db"
    store = Store(db)
    # As an interrupted loop leaves it: ACTIVE, owned by a loop that is gone (this
    # process's own pid reads as an abandoned loop object, not a live loop).
    owner = f"{socket.gethostname()} {os.getpid()}"
    store.update_experiment(summary.experiment_id, state="ACTIVE", owner=owner)
    store.close()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    resume = ["experiment", "resume", str(summary.experiment_id), "--db", db]
    assert main([*resume, "--executor", "inline", "--quiet"]) == 0, capsys.readouterr()
    assert "resuming it here" in capsys.readouterr().out
    store = Store(db)
    assert store.experiment(summary.experiment_id)["state"] == "COMPLETED"
    assert to_dict(config_of(store, summary.experiment_id))["entrypoint"] == (
        f"{here / 'obj.py'}:quad"
    )
    store.close()


def test_a_workdir_under_home_is_expanded(tmp_path, monkeypatch):
    """``workdir: ~/runs`` is the user's home folder, not a folder named ``~`` in the CWD
    (as ``entrypoint: ~/obj.py:fn`` is a file there)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "obj.py").write_text(TRIAL)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(_raw(workdir="~/runs", entrypoint="~/obj.py:quad"))
    assert cfg.workdir == str(home / "runs")
    assert cfg.database_url == f"sqlite:///{home / 'runs' / 'jaxcore.db'}"
    assert to_dict(cfg)["entrypoint"] == f"{home / 'obj.py'}:quad"
    summary = run_experiment(cfg, executor="inline", progress=False)
    assert summary.state == "COMPLETED"
    assert (home / "runs" / "jaxcore.db").exists()
    assert not (tmp_path / "~").exists()


def test_an_empty_workdir_is_refused_not_a_folder_named_none(tmp_path, monkeypatch):
    """YAML reads ``workdir:`` (nothing) and ``workdir: ~`` as null; that used to become
    a folder named ``None`` in the CWD, holding the store and every trial."""
    monkeypatch.chdir(tmp_path)
    for value in (None, "", "  "):
        with pytest.raises(ConfigError, match=r"workdir: .*empty.*~/"):
            parse_config(_raw(workdir=value))
    assert not (tmp_path / "None").exists()


def test_a_null_description_is_empty():
    assert parse_config(_raw(description=None)).description == ""


def test_two_stores_binding_one_workdir_at_once_one_is_refused(tmp_path, monkeypatch):
    """The README's "a workdir belongs to the first store that used it: another store is
    refused" held only one after the other: two commands with different stores that both
    found no binding yet each wrote theirs, and both ran over the same workdir. A barrier
    right after each one's first look makes them look at the same moment."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    stores = [Store(f"sqlite:///{tmp_path}/{n}.db") for n in ("a", "b")]
    mark = workdir / WORKDIR_MARK
    barrier = threading.Barrier(2, timeout=10)
    exists = pathlib.Path.exists

    first_look: set[int] = set()

    def looked(self, *a, **k):
        found = exists(self, *a, **k)
        if self == mark and threading.get_ident() not in first_look:
            first_look.add(threading.get_ident())
            barrier.wait()  # both have had their first look before either writes
        return found

    monkeypatch.setattr(pathlib.Path, "exists", looked)
    outcomes: dict[int, BaseException | None] = {}

    def bind(i: int) -> None:
        try:
            bind_workdir(str(workdir), stores[i])
            outcomes[i] = None
        except BaseException as e:  # recorded for the assertion below
            outcomes[i] = e

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    monkeypatch.setattr(pathlib.Path, "exists", exists)
    refused = [e for e in outcomes.values() if e is not None]
    assert len(outcomes) == 2 and len(refused) == 1, outcomes
    assert isinstance(refused[0], ConfigError) and "belongs to the store" in str(refused[0])
    winner = next(i for i, e in outcomes.items() if e is None)
    assert stores[winner].uuid in mark.read_text()
    # The winner binds again (its next command); the loser stays refused.
    bind_workdir(str(workdir), stores[winner])
    with pytest.raises(ConfigError, match="belongs to the store"):
        bind_workdir(str(workdir), stores[1 - winner])
    assert [p.name for p in workdir.iterdir()] == [WORKDIR_MARK]  # no temp files left
    for s in stores:
        s.close()


@pytest.mark.parametrize("db", [False, True])
@pytest.mark.parametrize("workdir", ["afile", "afile/sub"])
def test_a_workdir_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys, workdir, db):
    """``workdir:`` naming a file that already exists (or a folder under one) was a
    FileExistsError / NotADirectoryError traceback from ``os.makedirs``, whether the store
    lives there or ``--db`` puts it elsewhere."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JAXCORE_DB", raising=False)
    monkeypatch.delenv("JAXCORE_DB_URL", raising=False)
    (tmp_path / "obj.py").write_text(TRIAL)
    (tmp_path / "afile").write_text("notes\n")
    (tmp_path / "x.yaml").write_text(
        "name: q\nentrypoint: obj.py:quad\n"
        f"workdir: {workdir}\n"
        "hyperparameters: {x: {type: double, minval: 0.0, maxval: 1.0}}\n"
        "searcher: {name: random, metric: loss, max_length: 2, max_trials: 1}\n"
    )
    extra = ["--db", f"sqlite:///{tmp_path}/store.db"] if db else []
    capsys.readouterr()
    assert main(["experiment", "create", "x.yaml", "--executor", "inline", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "workdir" in err and "afile" in err and "not a folder" in err, err
    assert (tmp_path / "afile").read_text() == "notes\n"
    assert not (tmp_path / "store.db").exists()  # a refused create leaves no store


def test_an_early_stopping_metric_no_trial_reports_says_so(tmp_path, monkeypatch, caplog):
    """``early_stopping: {metric: los, patience: 1}`` (a typo of the reported ``loss``)
    never stopped anything and said nothing: the search ran as if early stopping were off.
    Like Keras' EarlyStopping ("conditioned on metric ... which is not available"), the
    loop now says which metric it waited for, what the trial reported and the close match,
    on stderr and in the trial's log."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "obj.py").write_text(TRIAL)
    raw = _raw(early_stopping={"metric": "los", "patience": 1})
    with caplog.at_level("WARNING", logger="jaxcore.experiments.experiment"):
        summary = run_experiment(raw, executor="inline", progress=False)
    assert summary.state == "COMPLETED"
    said = [r.getMessage() for r in caplog.records if "early_stopping.metric" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "'los'" in said[0] and "'loss'" in said[0] and "early_stopping.metric: loss" in said[0]
    store = Store(parse_config(raw).database_url)
    exp = store.experiment(summary.experiment_id)
    (trial,) = store.trials(summary.experiment_id)
    log_file = tmp_path / "experiments" / exp["uuid"] / f"trial-{trial['id']}" / "logs.txt"
    assert "early_stopping.metric 'los'" in log_file.read_text()
    store.close()
    # A metric the trials do report is not warned about.
    caplog.clear()
    with caplog.at_level("WARNING", logger="jaxcore.experiments.experiment"):
        run_experiment(
            _raw(early_stopping={"metric": "loss", "patience": 1}),
            executor="inline",
            progress=False,
        )
    assert "early_stopping.metric" not in caplog.text


def test_output_into_a_closed_pipe_is_not_a_traceback(tmp_path):
    """``jaxcore model describe NAME | head -1`` (or ``experiment describe 1 | head``): the
    reader goes away and the command printed a BrokenPipeError traceback. It now ends
    quietly with status 1, as the commands that print through rich (``experiment list``)
    already did. The read end is closed before the command writes, so its first write
    meets no reader."""
    import subprocess
    import sys

    db = f"sqlite:///{tmp_path}/jaxcore.db"
    store = Store(db)
    store.create_model("tiny-lm", "a model to describe")
    store.close()
    read, write = os.pipe()
    os.close(read)
    command = ["model", "describe", "tiny-lm", "--db", db]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "jaxcore.experiments.cli", *command],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stderr)


@pytest.mark.parametrize(
    ("searcher", "says"),
    [
        ({"name": "grid", "max_length": 2}, "one trial per grid point .*3"),
        ({"name": "single", "max_length": 2}, "runs one trial"),
        (
            {"name": "pbt", "population_size": 2, "num_rounds": 2, "length_per_round": 1},
            "population_size",
        ),
    ],
)
def test_max_trials_on_a_searcher_that_does_not_read_it_is_refused(tmp_path, searcher, says):
    """``max_trials: 2`` on a grid of 3 points ran 3 trials without a word (single: 1, PBT:
    its population); Determined refuses the field there. The YAML a user writes is refused
    naming what sets the count; a config already in a store still reads (its resume)."""
    from jaxcore.experiments.config import load_config

    raw = _raw(searcher={"metric": "loss", "max_trials": 2, **searcher})
    raw["hyperparameters"]["x"]["count"] = 3
    path = tmp_path / "x.yaml"
    path.write_text(_yaml(raw))
    with pytest.raises(ConfigError, match=rf"searcher\.max_trials: .*{says}"):
        load_config(path)
    assert parse_config(raw).searcher.max_trials == 2  # a stored config parses as before
    del raw["searcher"]["max_trials"]
    path.write_text(_yaml(raw))
    assert load_config(path).searcher.max_trials is None


def test_a_sqlite_url_under_home_is_expanded(tmp_path, monkeypatch, capsys):
    """``--db sqlite:///~/runs/jaxcore.db``: the shell leaves a ``~`` inside a word alone,
    and the store was made in a folder named ``~`` under the CWD (a read said there was no
    such file). As the workdir's ``~``, it is the home folder."""
    from jaxcore.experiments.store import normalize_url

    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert normalize_url("sqlite:///~/runs/jaxcore.db") == f"sqlite:///{home}/runs/jaxcore.db"
    Store(f"sqlite:///{home}/runs/jaxcore.db").close()
    capsys.readouterr()
    assert main(["experiment", "list", "--db", "sqlite:///~/runs/jaxcore.db"]) == 0
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (["A", "B"], r"environment: a mapping"),
        ("A=1", r"environment: a mapping"),
        ({"FOO": None}, r"environment\.FOO: .*null.*''"),
        ({"FOO": True}, r"environment\.FOO: .*'true'"),
        ({"FOO": [1]}, r"environment\.FOO: .*string"),
    ],
)
def test_environment_values_that_are_no_strings_are_config_errors(env, says):
    """``environment: [A, B]`` was an AttributeError traceback, ``{FOO: }`` set FOO to the
    string "None" and ``{FOO: true}`` to "True" in every trial process. As Docker Compose
    does, a value that is no string or number is refused, saying how to quote it."""
    with pytest.raises(ConfigError, match=says):
        parse_config(_raw(environment=env))
    assert parse_config(_raw(environment={"N": 2, "S": "x", "F": 0.5})).environment == {
        "N": "2",
        "S": "x",
        "F": "0.5",
    }


def test_environment_with_inline_trials_says_it_does_not_apply(tmp_path, monkeypatch, caplog):
    """``environment:`` goes to trial processes; ``jaxcore train`` and ``--executor inline``
    run the trial in the command's own process, which silently did without it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "obj.py").write_text(TRIAL)
    with caplog.at_level("WARNING", logger="jaxcore.experiments.experiment"):
        run_experiment(_raw(environment={"MY_FLAG": 1}), executor="inline", progress=False)
    said = [r.getMessage() for r in caplog.records if "MY_FLAG" in r.getMessage()]
    assert len(said) == 1 and "inline" in said[0] and "export" in said[0], caplog.text


def test_train_runs_a_pbt_config_as_one_trial(tmp_path, monkeypatch, capsys):
    """ "The same function runs alone (``jaxcore train``) or as one trial of a search":
    ``jaxcore train`` of a PBT config (configs/experiments/pbt_tiny_lm.yaml) said
    ``searcher.max_length: missing``, a key PBT configs do not have. One trial of PBT
    trains ``num_rounds x length_per_round`` steps, as a member that survives every round."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JAXCORE_DB", raising=False)
    monkeypatch.delenv("JAXCORE_DB_URL", raising=False)
    (tmp_path / "obj.py").write_text(TRIAL)
    searcher = {"name": "pbt", "metric": "loss", "population_size": 2}
    raw = _raw(searcher=searcher | {"num_rounds": 3, "length_per_round": 2})
    (tmp_path / "pbt.yaml").write_text(_yaml(raw))
    capsys.readouterr()
    assert main(["train", "pbt.yaml"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["state"] == "COMPLETED" and out["steps"] == 6, out


@pytest.mark.parametrize("text", ["", "\n# only a comment\n", "---\n"])
def test_an_empty_config_file_says_it_is_empty(tmp_path, monkeypatch, capsys, text):
    """An empty YAML file (a save that did not happen, the wrong file) said ``name:
    missing`` as if one key were left out; it now says the file is empty and what to write."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.yaml").write_text(text)
    capsys.readouterr()
    assert main(["experiment", "create", "x.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "x.yaml" in err and "empty" in err and "entrypoint:" in err, err


def test_a_refused_create_keeps_a_store_another_command_created_meanwhile(
    tmp_path, monkeypatch, capsys
):
    """Two ``experiment create`` in a fresh folder at once: both find no
    experiments/jaxcore.db, so both take the file for their own. One is refused at the
    loop's start (here trial_timeout with inline trials) and, cleaning up "its" new store,
    deleted the file and workdir binding the other command had meanwhile filled. The
    other command runs (a complete experiment) right after the refused one has looked."""
    from jaxcore.experiments import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JAXCORE_DB", raising=False)
    monkeypatch.delenv("JAXCORE_DB_URL", raising=False)
    (tmp_path / "obj.py").write_text(TRIAL)
    (tmp_path / "refused.yaml").write_text(_yaml(_raw(trial_timeout=10)))
    looked = cli._new_sqlite_file
    other: list = []

    def then_the_other_command_runs(url):
        found = looked(url)
        assert found is not None  # no store yet: this command takes it for new
        other.append(run_experiment(_raw(), executor="inline", progress=False))
        return found

    monkeypatch.setattr(cli, "_new_sqlite_file", then_the_other_command_runs)
    capsys.readouterr()
    assert main(["experiment", "create", "refused.yaml", "--executor", "inline"]) == 2
    assert "trial_timeout" in capsys.readouterr().err
    db = tmp_path / "experiments" / "jaxcore.db"
    assert db.is_file()
    store = Store(f"sqlite:///{db}")
    assert store.experiment(other[0].experiment_id)["state"] == "COMPLETED"
    assert (tmp_path / "experiments" / WORKDIR_MARK).is_file()
    store.close()


def test_a_relative_optuna_storage_resumes_from_another_folder(tmp_path, monkeypatch, capsys):
    """``optuna_storage: sqlite:///optuna.db`` is read from the CWD, like the workdir; the
    store kept it relative, so the printed ``experiment resume ID --db URL`` run from another
    folder made an empty optuna.db there (with a trial still to tell, Optuna's ``KeyError:
    'Record does not exist.'`` traceback). The store now keeps the file absolute (and
    ``~`` expanded)."""
    here, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    (here / "obj.py").write_text(TRIAL)
    monkeypatch.chdir(here)
    searcher = {"name": "bayesian", "metric": "loss", "max_length": 2, "max_trials": 1}
    raw = _raw(
        entrypoint=f"{here / 'obj.py'}:quad",  # absolute: only the study's file is relative
        searcher=searcher | {"optuna_storage": "sqlite:///optuna.db"},
    )
    summary = run_experiment(raw, executor="inline", progress=False)
    db = f"sqlite:///{here}/experiments/jaxcore.db"
    store = Store(db)
    owner = f"{socket.gethostname()} {os.getpid()}"
    store.update_experiment(summary.experiment_id, state="ACTIVE", owner=owner)
    store.close()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    resume = ["experiment", "resume", str(summary.experiment_id), "--db", db]
    assert main([*resume, "--executor", "inline", "--quiet"]) == 0, capsys.readouterr()
    assert not (elsewhere / "optuna.db").exists()
    store = Store(db)
    stored = store.experiment(summary.experiment_id)["config"]["searcher"]["optuna_storage"]
    assert stored == f"sqlite:///{here / 'optuna.db'}"
    store.close()
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    searcher = parse_config(_raw(searcher=searcher | {"optuna_storage": "sqlite:///~/o.db"}))
    assert searcher.searcher.optuna_storage == f"sqlite:///{home / 'o.db'}"
