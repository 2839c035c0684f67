"""`jaxcore run` stop 39: a config changed between runs of one run_dir never reuses what
the old settings made (an interrupted experiment, a tokenizer retrained by another run,
a dataset whose source files changed), and the YAML is read strictly."""

from __future__ import annotations

import compileall
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import data as data_pkg
from jaxcore.errors import ConfigError
from jaxcore.run import phases as ph
from jaxcore.run import pipeline, run_pipeline, trial
from jaxcore.run.config import load_run_config, parse_run_config
from tests.jaxcore.test_run import DEMO
from tests.jaxcore.test_run_stop37 import TINY


class Killed(BaseException):
    """Stands for kill -9 at the injected point."""


def _config(root: pathlib.Path, *extra: str):
    return parse_run_config(yaml.safe_load(DEMO.read_text()), root, [*TINY, *extra])


def _stop_before(monkeypatch, phase: str) -> None:
    def hook(name: str) -> None:
        if name == phase:
            raise Killed

    monkeypatch.setattr(pipeline, "before_phase", hook)


def _sha(path: str | pathlib.Path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def test_an_interrupted_train_phase_is_not_resumed_with_the_old_learning_rate(
    tmp_path, monkeypatch, compile_cache, capsys
):
    config = _config(tmp_path, "train.steps=4", "train.lr=3.0e-3")

    def die(ctx, step):
        if step == 3:  # the step-2 checkpoint is saved
            raise Killed

    monkeypatch.setattr(trial, "after_step", die)
    with pytest.raises(Killed):
        run_pipeline(config)
    monkeypatch.setattr(trial, "after_step", None)

    changed = _config(tmp_path, "train.steps=4", "train.lr=1.0e-3")
    capsys.readouterr()
    result = run_pipeline(changed)

    said = " ".join(capsys.readouterr().out.split())
    assert "experiment 1 (interrupted) was started with other settings (lr: 0.003 -> 0.001)" in said
    assert "not resumed; starting a new one" in said

    out = result.outputs["train"]
    assert not out["resumed"]
    assert [t["lr"] for t in out["trials"]] == [1.0e-3]
    assert out["trials"][0]["resumed_from_step"] is None


def test_an_interrupted_train_phase_with_the_same_config_still_resumes(
    tmp_path, monkeypatch, compile_cache
):
    config = _config(tmp_path, "train.steps=4")

    def die(ctx, step):
        if step == 3:
            raise Killed

    monkeypatch.setattr(trial, "after_step", die)
    with pytest.raises(Killed):
        run_pipeline(config)
    monkeypatch.setattr(trial, "after_step", None)

    out = run_pipeline(config).outputs["train"]
    assert out["resumed"]
    assert out["trials"][0]["resumed_from_step"] == 2


def test_a_tokenizer_retrained_by_another_run_is_not_reused(tmp_path, monkeypatch):
    # Two run dirs share data.output_dir (as the demo's runs do): run b's vocabulary
    # retrains the shared version's tokenizer; run a's next run must not read it as its own.
    a = _config(tmp_path, "run_dir=a", "tokenizer.vocab_size=512")
    b = _config(tmp_path, "run_dir=b", "tokenizer.vocab_size=300")
    _stop_before(monkeypatch, "train")
    with pytest.raises(Killed):
        run_pipeline(a)
    with pytest.raises(Killed):
        run_pipeline(b)
    first = json.loads((a.path / "phases" / "tokenizer.json").read_text())["output"]

    with pytest.raises(Killed):
        run_pipeline(a)

    out = json.loads((a.path / "phases" / "tokenizer.json").read_text())["output"]
    assert json.loads(pathlib.Path(out["tokens_index"]).read_text())["vocab_size"] == 512
    assert _sha(out["tokenizer"]) == out["tokenizer_sha256"] == first["tokenizer_sha256"]


def test_a_kill_while_retraining_the_tokenizer_leaves_no_marker_to_trust(tmp_path, monkeypatch):
    a = _config(tmp_path, "tokenizer.vocab_size=512")
    _stop_before(monkeypatch, "train")
    with pytest.raises(Killed):
        run_pipeline(a)
    first = json.loads((a.path / "phases" / "tokenizer.json").read_text())["output"]

    real = data_pkg.tokenize_snapshot

    def killed_after_writing(version_dir, cfg, *args, **kwargs):
        real(version_dir, cfg, *args, **kwargs)
        raise Killed  # the shards are rewritten; the run dies before its marker

    monkeypatch.setattr(data_pkg, "tokenize_snapshot", killed_after_writing)
    with pytest.raises(Killed):
        run_pipeline(_config(tmp_path, "tokenizer.vocab_size=300"))
    monkeypatch.setattr(data_pkg, "tokenize_snapshot", real)

    with pytest.raises(Killed):
        run_pipeline(a)
    out = json.loads((a.path / "phases" / "tokenizer.json").read_text())["output"]
    index = json.loads(pathlib.Path(out["tokens_index"]).read_text())
    assert index["vocab_size"] == 512
    assert _sha(out["tokenizer"]) == first["tokenizer_sha256"]


def test_a_changed_source_file_reruns_the_data_phase(tmp_path, monkeypatch):
    src = tmp_path / "mycode"
    src.mkdir()
    for i in range(6):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 20)
    sources = f"data.sources=[{{type: dir, path: {src}, name: mycode}}]"
    config = _config(tmp_path, "data.packages=[]", sources)
    _stop_before(monkeypatch, "tokenizer")
    with pytest.raises(Killed):
        run_pipeline(config)
    first = json.loads((config.path / "phases" / "data.json").read_text())["output"]

    (src / "m6.py").write_text("def added(y):\n    return y - 1\n" * 20)
    with pytest.raises(Killed):
        run_pipeline(config)

    out = json.loads((config.path / "phases" / "data.json").read_text())["output"]
    assert out["input_hash"] != first["input_hash"]
    assert out["summary"]["files_in"] == first["summary"]["files_in"] + 1


def test_bytecode_written_into_a_source_does_not_rerun_the_data_phase(tmp_path, monkeypatch):
    # A guard for the input-hash check above: importing a source package (the serve
    # phase's client imports h11, a demo input) writes __pycache__ into it.
    src = tmp_path / "mycode"
    src.mkdir()
    for i in range(6):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 20)
    sources = f"data.sources=[{{type: dir, path: {src}, name: mycode}}]"
    config = _config(tmp_path, "data.packages=[]", sources)
    _stop_before(monkeypatch, "tokenizer")
    with pytest.raises(Killed):
        run_pipeline(config)
    record = (config.path / "phases" / "data.json").read_text()
    monkeypatch.setattr(sys, "pycache_prefix", None)  # tests/conftest.py may set one
    compileall.compile_dir(src, quiet=1, legacy=False)
    compileall.compile_dir(src, quiet=1, legacy=True)
    assert list(src.glob("__pycache__/*.pyc")) and list(src.glob("*.pyc"))

    with pytest.raises(Killed):
        run_pipeline(config)
    assert (config.path / "phases" / "data.json").read_text() == record


def _write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_a_duplicate_key_is_refused_naming_it(tmp_path):
    p = _write(tmp_path, "name: a\nrun_dir: r\ntrain:\n  lr: 1.0e-3\n  steps: 4\n  lr: 3.0e-3\n")
    with pytest.raises(ConfigError, match=r"'lr' appears twice.*lines 4 and 6"):
        load_run_config(p)
    p = _write(tmp_path, "name: a\nrun_dir: r\ntrain: {steps: 4}\ntrain: {steps: 8}\n")
    with pytest.raises(ConfigError, match=r"'train' appears twice.*lines 3 and 4"):
        load_run_config(p)
    with pytest.raises(ConfigError, match=r"'steps' appears twice"):
        load_run_config(_write(tmp_path, "name: a\nrun_dir: r\n"), ["train={steps: 1, steps: 2}"])


@pytest.mark.parametrize("text", ["1e-3", "1E-3", "5e-4", "1.0e-3", "0.001"])
def test_a_float_in_exponent_notation_is_a_float(tmp_path, text):
    # PyYAML (YAML 1.1) reads 1e-3 as a string; Python, JSON and YAML 1.2 read a float.
    p = _write(tmp_path, f"name: a\nrun_dir: r\ntrain: {{lr: {text}}}\n")
    assert load_run_config(p).train.lr == float(text)
    assert load_run_config(p, [f"search.lr_min={text}"]).search.lr_min == float(text)


def test_an_empty_config_file_says_what_to_write(tmp_path):
    with pytest.raises(ConfigError, match=r"empty.*name.*run_dir"):
        load_run_config(_write(tmp_path, "# nothing yet\n"))


def test_a_float_string_that_is_not_a_number_is_still_refused(tmp_path):
    p = _write(tmp_path, "name: a\nrun_dir: r\ntrain: {lr: fast}\n")
    with pytest.raises(ConfigError, match=r"train\.lr: expected float"):
        load_run_config(p)


def test_a_kill_after_the_train_experiment_finished_reuses_it(tmp_path, monkeypatch, compile_cache):
    config = _config(tmp_path)
    real = ph.write_record

    def die_at_train(run_dir, phase, record):
        if phase == "train":
            raise Killed  # the experiment is COMPLETED in the store; no phase record
        real(run_dir, phase, record)

    monkeypatch.setattr(ph, "write_record", die_at_train)
    with pytest.raises(Killed):
        run_pipeline(config)
    monkeypatch.setattr(ph, "write_record", real)

    out = run_pipeline(config).outputs["train"]

    assert out["experiment_id"] == 1  # not trained again as experiment 2
    assert out["best"]["checkpoint_id"] is not None


def test_an_interrupted_train_phase_is_not_resumed_on_other_tokens(
    tmp_path, monkeypatch, compile_cache
):
    # tokenizer.num_shards rewrites the tokens (another shard layout, another order) with
    # the same tokenizer, vocabulary size and index path.
    config = _config(tmp_path, "train.steps=4", "tokenizer.num_shards=2")

    def die(ctx, step):
        if step == 3:
            raise Killed

    monkeypatch.setattr(trial, "after_step", die)
    with pytest.raises(Killed):
        run_pipeline(config)
    monkeypatch.setattr(trial, "after_step", None)
    before = json.loads((config.path / "phases" / "tokenizer.json").read_text())["output"]

    result = run_pipeline(_config(tmp_path, "train.steps=4", "tokenizer.num_shards=1"))

    assert result.outputs["tokenizer"]["tokenizer_sha256"] == before["tokenizer_sha256"]
    assert result.outputs["tokenizer"]["vocab_size"] == before["vocab_size"]
    assert not result.outputs["train"]["resumed"]
    assert result.outputs["train"]["trials"][0]["resumed_from_step"] is None


# `jaxcore run` in a child process that SIGKILLs itself at STOP39_KILL_AT: "step:N" (the
# train phase, after step N), "record:PHASE" (the phase finished, its record unwritten);
# "data:POINT" is the data package's own crash point (DATA_TEST_CRASH_AT).
_KILLING_CLI = """
import os, signal, sys
from jaxcore.run import phases as ph, trial
point = os.environ.get("STOP39_KILL_AT", "")
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if point.startswith("step:"):
    trial.after_step = lambda ctx, step: die() if step == int(point[5:]) else None
elif point.startswith("record:"):
    write = ph.write_record
    def write_record(run_dir, phase, record):
        if phase == point[7:]:
            die()
        write(run_dir, phase, record)
    ph.write_record = write_record
from jaxcore.run.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(root: pathlib.Path, cache: pathlib.Path, kill_at: str = "") -> int:
    cfg = root / "run.yaml"
    cfg.write_text(DEMO.read_text())
    args = [a for s in [*TINY, "train.steps=4"] for a in ("--set", s)]
    env = {
        **os.environ,
        "STOP39_KILL_AT": kill_at,
        "DATA_TEST_CRASH_AT": kill_at.removeprefix("data:") if kill_at[:5] == "data:" else "",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _KILLING_CLI, str(cfg), *args],
        cwd=root,  # run_dir and data.output_dir are relative: from the working directory
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # a data crash point kills its whole process group
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr[-3000:])
    return proc.returncode


def _lineage(summary: dict) -> dict:
    d, r = summary["data"], summary["registry"]
    return {
        "data": {k: d[k] for k in ("version", "manifest_sha256", "tokenizer_vocab", "tokens")},
        "registry": {
            "model": r["model"],
            "version": r["version"],
            **{
                k: r["lineage"].get(k)
                for k in ("dataset_version", "manifest_sha256", "tokenizer_sha256")
            },
        },
        "best": {k: summary["best_trial"][k] for k in ("lr", "steps", "val_loss")},
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory, compile_cache) -> dict:
    root = tmp_path_factory.mktemp("reference")
    assert _cli(root, compile_cache) == 0
    return json.loads((root / "run" / "summary.json").read_text())


@pytest.mark.parametrize(
    "kill_at",
    [
        "data:stage1-0-unmarked",
        "data:manifest-renamed",
        "record:data",
        "data:tokens-unindexed",
        "record:tokenizer",
        "step:3",
        "record:train",
        "record:register",
    ],
)
def test_kill_9_then_rerun_ends_as_an_uninterrupted_run(
    tmp_path, compile_cache, reference, kill_at
):
    assert _cli(tmp_path, compile_cache, kill_at) == -signal.SIGKILL
    assert not (tmp_path / "run" / "summary.json").exists()
    assert _cli(tmp_path, compile_cache) == 0

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert _lineage(summary) == _lineage(reference)
    # Every path the summary prints exists.
    assert pathlib.Path(summary["loss"]["png"]).is_file()
    assert pathlib.Path(summary["registry"]["weights"]).exists()


def test_registered_weights_deleted_since_are_registered_again(tmp_path, compile_cache):
    import shutil

    config = _config(tmp_path)
    first = run_pipeline(config).outputs["register"]
    weights = pathlib.Path(first["weights"])
    if weights.is_dir():
        shutil.rmtree(weights)
    else:
        weights.unlink()

    result = run_pipeline(config)

    assert "register" not in result.skipped
    assert pathlib.Path(result.summary["registry"]["weights"]).exists()


def test_a_data_setting_that_keeps_the_dataset_retrains_nothing(tmp_path, compile_cache):
    # data.workers is not part of the dataset's input hash: the same version is found and
    # reused, so nothing after the data phase has another input.
    run_pipeline(_config(tmp_path, "data.workers=1"))

    result = run_pipeline(_config(tmp_path, "data.workers=2"))

    assert result.outputs["data"]["reused"]
    assert result.skipped == ("tokenizer", "train", "search", "register", "serve")


@settings(max_examples=60, deadline=None)
@given(
    mantissa=st.one_of(
        st.integers(0, 10**6).map(str), st.floats(0, 1e6).map(lambda x: f"{x:.6f}"), st.just(".5")
    ),
    exponent=st.integers(-30, 30),
    e=st.sampled_from(["e", "E"]),
)
def test_exponent_floats_are_read_as_python_reads_them(mantissa, exponent, e):
    text = f"{mantissa}{e}{exponent}"
    config = parse_run_config(
        {"name": "a", "run_dir": "r", "search": {"lr_max": 1e300}},
        ".",
        [f"train.weight_decay={text}"],
    )
    assert config.train.weight_decay == float(text)  # Python's float() is the oracle
