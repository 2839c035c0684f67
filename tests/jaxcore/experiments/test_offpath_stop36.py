"""Off the tested path: odd search spaces, registry names and aliases, metrics that are
not numbers, and the progress of searches whose trials are all created up front."""

from __future__ import annotations

import json
import pathlib

import pytest

from jaxcore.errors import ConfigError
from jaxcore.experiments import Registry, parse_config, run_experiment
from jaxcore.experiments.cli import main
from jaxcore.experiments.searchers.simple import GridSearch, RandomSearch, SingleSearch

HERE = pathlib.Path(__file__)


def report_a_string(ctx) -> None:
    """A trial whose objective returns a label instead of a number."""
    ctx.report(1, {"loss": "abc"})


def _config(tmp_path, hparams: dict, **searcher) -> dict:
    return {
        "name": "offpath",
        "entrypoint": f"{HERE}:report_a_string",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": hparams,
        "searcher": {"name": "random", "metric": "loss", "max_trials": 2, "max_length": 1}
        | searcher,
    }


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"type": "categorical", "vals": 5}, "x.vals", "write a list"),
        ({"type": "categorical", "vals": "abc"}, "x.vals", "write a list"),  # not a, b, c
        ({"type": "log", "minval": -1, "maxval": 1, "base": 0}, "x.base", "positive"),
        ({"type": "log", "minval": 0.5, "maxval": 1, "base": -2}, "x.base", "positive"),
        ({"type": "log", "minval": 1, "maxval": 400}, "x.minval/maxval", "overflows"),
        ({"type": "double", "minval": 0.0, "maxval": float("inf")}, "x.maxval", "finite"),
        ({"type": "double", "minval": float("nan"), "maxval": 1.0}, "x.minval", "finite"),
    ],
)
def test_odd_search_spaces_are_config_errors_naming_the_field(tmp_path, spec, field, says):
    with pytest.raises(ConfigError, match=rf"hyperparameters\.{field}: .*{says}"):
        parse_config(_config(tmp_path, {"x": spec}))


def test_a_single_value_space_still_samples_it(tmp_path):
    cfg = parse_config(
        _config(
            tmp_path,
            {
                "c": {"type": "categorical", "vals": [0.3]},
                "d": {"type": "double", "minval": 0.5, "maxval": 0.5},
                "i": {"type": "int", "minval": 3, "maxval": 3, "log": True},
            },
        )
    )
    (create,) = SingleSearch(cfg).initial()
    assert create.hparams == {"c": 0.3, "d": 0.5, "i": 3}


@pytest.fixture
def registry(tmp_path) -> Registry:
    return Registry(f"sqlite:///{tmp_path}/store/jaxcore.db")


@pytest.fixture
def state_ckpt(tmp_path) -> pathlib.Path:
    """A plain-Python checkpoint step directory (what ``ctx.checkpoint({...})`` writes)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "state.json").write_text(json.dumps({"state": {"a": 1}}))
    return ckpt


@pytest.mark.parametrize("name", ["a/b", "../../escaped", "x" * 300, "", " ", "tiny@lm", "."])
def test_model_names_that_are_not_one_folder_are_refused(registry, tmp_path, name):
    with pytest.raises(ConfigError, match=r"model name .* use one folder name"):
        registry.create_model(name)
    assert registry.list() == []
    assert not (tmp_path / "escaped").exists()


def test_unicode_model_name_registers_and_loads(registry, state_ckpt):
    registry.create_model("小模型-ü")
    v = registry.register("小模型-ü", checkpoint=str(state_ckpt), aliases=["production"])
    assert registry.load("小模型-ü", "production") == {"a": 1}
    assert pathlib.Path(registry.version("小模型-ü", v)["path"]).parent.parent.name == "小模型-ü"


@pytest.mark.parametrize("alias", ["3", "latest", "", "a@b"])
def test_alias_that_reads_as_a_version_is_refused(registry, state_ckpt, alias):
    registry.create_model("m")
    for _ in range(3):
        registry.register("m", checkpoint=str(state_ckpt))
    with pytest.raises(ConfigError, match="alias"):
        registry.set_alias("m", alias, 1)
    with pytest.raises(ConfigError, match="alias"):
        registry.register("m", checkpoint=str(state_ckpt), aliases=[alias])
    assert registry.describe("m")["aliases"] == {}
    assert len(registry.describe("m")["versions"]) == 3  # the refused register added none


def test_a_version_whose_files_fail_is_not_left_in_the_store(registry, tmp_path):
    registry.create_model("m")
    broken = tmp_path / "not-a-checkpoint"
    broken.mkdir()
    with pytest.raises(ConfigError, match="not a checkpoint step directory"):
        registry.register("m", checkpoint=str(broken))
    assert registry.describe("m")["versions"] == []


@pytest.mark.parametrize(
    ("cls", "searcher", "hparams", "planned"),
    [
        (RandomSearch, {"max_trials": 3}, {"x": {"type": "double", "minval": 0, "maxval": 1}}, 3),
        (
            GridSearch,
            {"name": "grid"},
            {"x": {"type": "double", "minval": 0, "maxval": 1, "count": 4}},
            4,
        ),
        (SingleSearch, {"name": "single"}, {"x": 1}, 1),
    ],
)
def test_fixed_searches_report_their_progress(tmp_path, cls, searcher, hparams, planned):
    search = cls(parse_config(_config(tmp_path, hparams, **searcher)))
    assert len(search.initial()) == planned and search.progress() == 0.0
    search.exited(1)
    assert search.progress() == pytest.approx(1 / planned)
    for trial_id in range(2, planned + 1):
        search.errored(trial_id)  # an errored trial is done too
    assert search.progress() == 1.0


@pytest.fixture(scope="module")
def string_metric_run(tmp_path_factory):
    """One search whose only trial reports a string: its summary and the trial's log."""
    tmp_path = tmp_path_factory.mktemp("string-metric")
    raw = _config(tmp_path, {}) | {"max_restarts": 0}
    raw["searcher"]["max_trials"] = 1
    summary = run_experiment(raw, executor="local")
    return summary, next((tmp_path / "work").rglob("logs.txt")).read_text()


@pytest.mark.multiprocess
def test_a_metric_that_is_not_a_number_names_the_metric(string_metric_run):
    summary, log = string_metric_run
    assert summary.state == "FAILED"
    assert [t["state"] for t in summary.trials] == ["ERRORED"]
    assert "metric 'loss' is 'abc' (str); report numbers" in log, log[-2000:]


@pytest.mark.multiprocess
def test_trial_logs_carry_no_runpy_warning(string_metric_run):
    _summary, log = string_metric_run
    assert "RuntimeWarning" not in log, log[:2000]  # the runner was imported before it ran


@pytest.mark.parametrize(
    "argv",
    [
        ["experiment", "describe", "99999999999999999999999"],
        ["experiment", "kill", "-1"],
        ["trial", "describe", "1e3"],
        ["trial", "logs", "18446744073709551616"],
    ],
)
def test_cli_ids_the_store_cannot_hold_are_usage_errors(registry, capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--db", registry.store.url])
    assert exit_.value.code == 2
    assert "is not an id" in capsys.readouterr().err


def test_registering_a_checkpoint_id_past_the_store_range(registry):
    registry.create_model("m")
    with pytest.raises(ConfigError, match="checkpoint 99999999999999999999999 does not exist"):
        registry.register("m", checkpoint="99999999999999999999999")


@pytest.mark.parametrize("port", ["99999", "-5", "0", "http"])
def test_ui_port_outside_tcp_range_is_a_usage_error(capsys, port):
    from jaxcore.ui.cli import _parser

    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["--port", port])
    assert exit_.value.code == 2
    assert "--port" in capsys.readouterr().err
