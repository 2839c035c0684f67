"""Stop 43: README "Train a model" / "Parallelism is configuration", driven off the path.

- An eval batch had to be a multiple of ``grad_accum`` x the data shards, although the
  eval step runs the batch in one piece (no accumulation): a validation batch of one row
  per shard was refused with a BatchError about ``grad_accum``.
- ``jc.Engine(precison="bf16")`` (a typo in a keyword) was a bare TypeError naming
  ``EngineConfig.__init__``, with no hint of the setting meant.
- ``jaxcore run configs/demo.yaml --set train.batch=12`` on 8 devices: the dry run ended
  in XLA's ``IndivisibleError`` traceback, the real run only after the data phase.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.models import Transformer, TransformerConfig, lm_loss

CFG = TransformerConfig.tiny(vocab_size=64, d_model=32, n_layers=1, d_ff=64, max_seq_len=16)


def factory(rngs):
    return Transformer(CFG, rngs=rngs)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CFG.vocab_size, (8, 9)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[:3, 4:] = 0
    return {"tokens": tokens, "mask": mask}


def test_eval_batch_needs_no_grad_accum_multiple(batch):
    # 8 rows on 8 fsdp shards: one row each. grad_accum=2 cuts a *train* batch in two per
    # shard, so the train step refuses 8 rows; the eval step does not accumulate.
    plain = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3)
    accum = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3, grad_accum=2)
    p1, p2 = plain.plan(factory, optax.sgd(0.1)), accum.plan(factory, optax.sgd(0.1))
    s1, s2 = p1.init(0), p2.init(0)
    want = p1.eval_step(lm_loss)(s1, batch)
    got = p2.eval_step(lm_loss)(s2, batch)
    for key in ("loss", "accuracy", "weight"):
        np.testing.assert_allclose(float(got[key]), float(want[key]), rtol=1e-6)
    with pytest.raises(
        jc.BatchError, match=r"grad_accum\. Use a batch size that is a multiple of 16"
    ):
        p2.train_step(lm_loss)(s2, batch)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (
            {"precison": "bf16"},
            r"Engine: 'precison' is not a setting of jaxcore.Engine; did you mean 'precision'",
        ),
        ({"grad_acum": 2}, r"did you mean 'grad_accum'"),
        ({"fsdp": 8}, r"'fsdp' is not a setting.*parallel=jc.ParallelConfig\(fsdp=8\)"),
        ({"colour": 1}, r"'colour' is not a setting of jaxcore.Engine; the settings are"),
    ],
)
def test_engine_keyword_typo_names_the_setting(kwargs, says):
    with pytest.raises(jc.ConfigError, match=says):
        jc.Engine(**kwargs)
    with pytest.raises(jc.ConfigError, match=says):
        jc.Engine(jc.EngineConfig(), **kwargs)


def test_config_dataclass_keyword_typos_name_the_setting():
    with pytest.raises(jc.ConfigError, match=r"ParallelConfig: 'tensr' is not a setting.*'tensor'"):
        jc.ParallelConfig(fsdp=-1, tensr=2)
    with pytest.raises(jc.ConfigError, match=r"EngineConfig: 'zer' is not a setting.*'zero'"):
        jc.EngineConfig(zer=3)
    # dataclasses.replace and pickling still work
    import pickle

    cfg = jc.ParallelConfig(fsdp=4, tensor=2)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert dataclasses.replace(cfg, tensor=1, fsdp=-1) == jc.ParallelConfig()


@pytest.mark.parametrize(
    "overrides", [["train.batch=12"], ["train.batch=16", "train.grad_accum=4"]]
)
def test_run_batch_that_does_not_split_over_the_devices_is_a_config_error(tmp_path, overrides):
    # `jaxcore run configs/demo.yaml --set train.batch=12` on 8 devices: the dry run died in
    # XLA's IndivisibleError (a traceback), the real run only after the data phase.
    from jaxcore.run import dry_run, load_run_config, run_pipeline

    repo = pathlib.Path(__file__).resolve().parents[2]
    sets = [f"run_dir={tmp_path / 'run'}", f"data.output_dir={tmp_path / 'data'}", *overrides]
    cfg = load_run_config(str(repo / "configs" / "demo.yaml"), sets)
    says = r"train.batch=\d+ does not split over this run's 8 devices.*multiple of (8|32)"
    with pytest.raises(jc.ConfigError, match=says):
        dry_run(cfg)
    with pytest.raises(jc.ConfigError, match=says):
        run_pipeline(cfg)
    assert not (tmp_path / "data").exists(), "no phase may run before the check"


def test_demo_takes_a_config_path_and_lists_the_run_options(tmp_path, capsys, monkeypatch):
    # README: "`python -m jaxcore.demo` is the same command" as `jaxcore run CONFIG`. A
    # config given as a path (as to `jaxcore run`) was "jaxcore run: error: unrecognized
    # arguments: demo.yaml", and --help listed neither --set nor --dry-run.
    from jaxcore import demo

    with pytest.raises(SystemExit):
        demo.main(["--help"])
    shown = capsys.readouterr().out
    assert "--set KEY=VALUE" in shown and "--dry-run" in shown and "config" in shown
    repo = pathlib.Path(__file__).resolve().parents[2]
    sets = ["--set", f"run_dir={tmp_path / 'run'}", "--set", f"data.output_dir={tmp_path}"]
    argv = [str(repo / "configs" / "demo.yaml"), "--dry-run", *sets, "--set", "train.batch=12"]
    assert demo.main(argv) == 2
    err = capsys.readouterr().err
    assert "train.batch=12 does not split" in err and "unrecognized" not in err, err
    # A path both ways must agree; --steps, --set, --json reach `jaxcore run` as given.
    assert demo.main([*argv, "--config", str(tmp_path / "other.yaml")]) == 2
    assert "two configs" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr("jaxcore.run.cli.main", lambda a: seen.append(a) or 0)
    assert demo.main(["--steps", "3", "--set", "serve.enabled=false", "--json"]) == 0
    assert seen == [
        [str(demo.CONFIG), "--set", "serve.enabled=false", "--set", "train.steps=3", "--json"]
    ]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        # token_keys="tokens" iterated to ('t', 'o', ...): the id checks went off silently
        # and out-of-vocabulary ids trained to a NaN loss.
        ({"token_keys": "tokens"}, r"token_keys='tokens': pass a tuple of batch keys"),
        ({"token_keys": ("tokens", 3)}, r"token_keys=\('tokens', 3\): pass a tuple of batch"),
        ({"microbatches": "4"}, r"microbatches='4': must be an integer >= 1"),
        ({"microbatches": 4.0}, r"microbatches=4.0: must be an integer >= 1"),
        (
            {"pipeline_schedule": "circular", "pipeline_repeats": 2.0},
            r"pipeline_repeats=2.0: must be an integer",
        ),
        ({"seed": "0"}, r"seed='0': must be an integer"),
        ({"clip_grad_norm": "1.0"}, r"clip_grad_norm='1.0': must be a positive number"),
        ({"unroll_layers": "yes"}, r"unroll_layers='yes': use True, False or None"),
        ({"check_batches": "no"}, r"check_batches='no': use True or False"),
    ],
)
def test_engine_config_values_of_the_wrong_type_are_config_errors(kwargs, says):
    with pytest.raises(jc.ConfigError, match=says):
        jc.EngineConfig(**kwargs)
