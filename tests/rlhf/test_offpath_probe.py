"""Off-path probes of `rlhf`: config values of the wrong type, malformed JSONL records and
non-finite rewards must stop with a `ConfigError` naming what is wrong, not a traceback
deep inside JAX or silent NaN training."""

import json
import pathlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from rlhf.config import load_config, parse_config

from .test_cli import PPO

CONFIGS = pathlib.Path(__file__).parents[2] / "configs" / "rlhf"


def ppo_raw(**sections):
    return {**PPO, "train": {**PPO["train"], "out": "x"}, **sections}


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        # YAML 1.1 reads 1e-3 (no dot) as a string: adam("1e-3") failed at the first step.
        (
            {"train": {"out": "x", "lr": "1e-3"}},
            r"train\.lr: expected a float, got '1e-3'.*1\.0e-3",
        ),
        ({"train": {"out": "x", "steps": 2.5}}, r"train\.steps: expected an int, got 2\.5"),
        ({"train": {"out": 5}}, r"train\.out: expected a str, got 5"),
        ({"rewards": [{"fn": 3}]}, r"rewards\[0\]\.fn: expected a str, got 3"),
        (
            {"rewards": [{"fn": "m:f", "weight": "heavy"}]},
            r"rewards\[0\]\.weight: expected a float",
        ),
        ({"rewards": [{"fn": "m:f", "kwargs": [1]}]}, r"rewards\[0\]\.kwargs: expected a mapping"),
        ({"prompts": {"count": "x"}}, r"prompts\.count: expected an int"),
        ({"ppo": {"kl_coef": "a"}}, r"ppo\.kl_coef: expected a float"),
        ({"ppo": {"whiten_rewards": "yes please"}}, r"ppo\.whiten_rewards: expected a bool"),
        ({"ppo": {"ppo_epochs": True}}, r"ppo\.ppo_epochs: expected an int, got True"),
    ],
)
def test_wrong_value_types_name_the_field(patch, match):
    with pytest.raises(jc.ConfigError, match=match):
        parse_config("ppo", ppo_raw(**patch))


def test_right_types_still_load():
    cfg = parse_config(
        "ppo",
        ppo_raw(
            train={"out": "x", "lr": 1, "critic_lr": None},  # an int is a fine float
            serving={"slots": 8, "max_len": 8, "prefill_buckets": [4, 8]},
            lora={"targets": "all-linear"},  # one name for a tuple of names
        ),
    )
    assert cfg.train.lr == 1 and cfg.serving.prefill_buckets == (4, 8)
    for path in sorted(CONFIGS.glob("*.yaml")):
        stage = path.stem.split("_")[0]
        assert load_config(stage, path).stage == stage


def _rollout(n=4):
    import numpy as np

    from rlhf.rollout import Rollout

    return Rollout(
        tokens=np.full((n, 6), 5, np.int32),
        mask=np.ones((n, 5), np.float32),
        sampler_logp=np.zeros((n, 5), np.float32),
        prompt_lengths=np.full((n,), 3, np.int32),
        completions=[[5, 5, 5]] * n,
        has_eos=np.zeros((n,), bool),
        generate_seconds=1.0,
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_reward_stops_with_the_function_and_sequence(bad):
    from rlhf.rewards import score_rollout

    calls = []

    def flaky(prompt, completion):  # the third sequence's reward is not finite
        calls.append(1)
        return bad if len(calls) == 3 else 0.5

    with pytest.raises(jc.JaxcoreError, match=r"reward flaky returned .* for sequence 2 "):
        score_rollout([(lambda p, c: 1.0, 1.0), (flaky, 0.0)], _rollout())


def test_grpo_with_a_nan_reward_raises_instead_of_training_on_nan():
    from inference import ServingConfig
    from rlhf import GRPOConfig, GRPOTrainer, Sampler, lm_factory

    from . import helpers as H

    engine = H.engine()
    state = engine.prepare(lm_factory(H.CFG), H.adam(1e-2))
    sampler = Sampler(H.CFG, state.params, ServingConfig(slots=8, max_len=16))
    trainer = GRPOTrainer(
        engine,
        state,
        sampler,
        lambda p, c: float("nan"),
        GRPOConfig(num_generations=2, max_tokens=4),
    )
    with pytest.raises(jc.JaxcoreError, match="not finite"):
        trainer.step(H.prompts(0))


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"prompt": [4, 5]', r"r\.jsonl:2: not valid JSON"),
        ('{"prompt": "hello world"}', r"r\.jsonl:2: prompt must be a list of token ids, got str"),
        ('{"prompt": 7}', r"r\.jsonl:2: prompt must be a list of token ids, got int"),
        ('{"prompt": [4, 5.7]}', r"r\.jsonl:2: prompt must be a list of token ids.*5\.7"),
        ('{"prompt": [4, true]}', r"r\.jsonl:2: prompt must be a list of token ids.*True"),
        ('["prompt"]', r"r\.jsonl:2: expected a JSON object"),
    ],
)
def test_malformed_jsonl_records_name_the_line_and_field(tmp_path, line, match):
    from rlhf.tasks import read_jsonl

    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt": [4, 5, 6], "extra": "ignored"}\n' + line + "\n")
    with pytest.raises(jc.ConfigError, match=match):
        read_jsonl(path, ("prompt",))


def test_jsonl_records_keep_ids_and_skip_blank_lines(tmp_path):
    from rlhf.tasks import read_jsonl

    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt": [4, 5], "note": "é"}\n\n{"prompt": []}\n')
    assert read_jsonl(path, ("prompt",)) == [{"prompt": [4, 5]}, {"prompt": []}]
    with pytest.raises(jc.ConfigError, match=r"prompts\.path .*missing\.jsonl: no such file"):
        read_jsonl(tmp_path / "missing.jsonl", ("prompt",), where="prompts.path")


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"prompts": {"count": 0}}, r"prompts: count and length must be >= 1"),
        ({"prompts": {"length": 0}}, r"prompts: count and length must be >= 1"),
        ({"data": {"held_out": 0}}, r"data: n and held_out must be >= 1"),
        ({"data": {"n": 0}}, r"data: n and held_out must be >= 1"),
    ],
)
def test_empty_prompt_and_data_sections_are_config_errors(section, match):
    # Before: max() of an empty sequence inside the sampler / the DPO pair padding.
    stage = "ppo" if "prompts" in section else "dpo"
    with pytest.raises(jc.ConfigError, match=match):
        parse_config(stage, ppo_raw(**section))


def test_empty_prompts_file_stops_before_compiling(tmp_path, capsys):
    from rlhf.cli import main

    (tmp_path / "p.jsonl").write_text("\n")
    config = tmp_path / "ppo.yaml"
    raw = ppo_raw(prompts={"path": str(tmp_path / "p.jsonl")})
    config.write_text(yaml.safe_dump({**raw, "train": {**raw["train"], "out": str(tmp_path)}}))
    assert main(["ppo", str(config)]) == 2
    err = capsys.readouterr().err
    assert "prompts.path" in err and "holds no prompts" in err and "Traceback" not in err


def test_sampler_rejects_an_empty_prompt_list():
    from inference import ServingConfig
    from rlhf import Sampler, lm_factory

    from . import helpers as H

    state = H.engine().prepare(lm_factory(H.CFG), H.adam())
    sampler = Sampler(H.CFG, state.params, ServingConfig(slots=8, max_len=16))
    with pytest.raises(jc.JaxcoreError, match="no prompts"):
        sampler.generate([], max_tokens=4)


@pytest.mark.parametrize("bad", [None, "0.5", [1.0]])
def test_a_reward_that_is_not_a_number_names_the_function(bad):
    from rlhf.rewards import score_rollout

    def sloppy(prompt, completion):
        return bad

    with pytest.raises(jc.JaxcoreError, match=r"reward sloppy returned .* not a float"):
        score_rollout([(sloppy, 1.0)], _rollout())


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from([1e-3, 0.1, 0.5, 10.0]),
    st.sampled_from([0.0, 0.2, 0.5]),
    st.sampled_from([1.0, 100.0, 1e4]),
)
def test_dpo_loss_matches_the_paper_formula_at_edge_betas_and_extreme_logits(
    seed, beta, smoothing, scale
):
    # Oracle: Rafailov et al. eq. 7 with cDPO smoothing, written with np.logaddexp
    # (-log sigmoid(z) = logaddexp(0, -z)), stable at any z.
    import jax.numpy as jnp
    import numpy as np

    from rlhf import losses as L

    pc, pr, rc, rr = np.random.default_rng(seed).normal(size=(4, 6)) * scale
    z = beta * ((pc - pr) - (rc - rr))
    want = np.mean((1 - smoothing) * np.logaddexp(0, -z) + smoothing * np.logaddexp(0, z))
    got, stats = L.dpo_loss(
        *(jnp.asarray(a, jnp.float32) for a in (pc, pr, rc, rr)),
        beta=beta,
        label_smoothing=smoothing,
    )
    assert np.isfinite(float(got))
    np.testing.assert_allclose(float(got), want, rtol=1e-4, atol=1e-4 * max(1.0, abs(want)))
    chosen_r, rejected_r = beta * (pc - rc), beta * (pr - rr)
    np.testing.assert_allclose(
        float(stats["reward_margin"]), np.mean(chosen_r - rejected_r), rtol=1e-3, atol=1e-3
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"beta": 0.0}, r"beta=0\.0: must be > 0"),
        ({"beta": -0.1}, r"beta=-0\.1: must be > 0"),
        ({"label_smoothing": 0.7}, r"label_smoothing=0\.7: must be in \[0, 0\.5\]"),
        ({"label_smoothing": -0.1}, r"label_smoothing=-0\.1"),
    ],
)
def test_dpo_settings_that_train_nothing_or_backwards_are_config_errors(kwargs, match):
    # beta <= 0 gives a zero (or reversed) gradient; smoothing > 0.5 prefers the rejected.
    from rlhf.dpo import dpo_objective

    with pytest.raises(jc.ConfigError, match=match):
        dpo_objective(**kwargs)


@pytest.mark.parametrize(
    ("record", "match"),
    [
        # Before: exit 0 with held_out_loss=nan (the embedding gather of id 99 is NaN).
        ({"prompt": [4, 5, 99], "chosen": [3], "rejected": [5]}, r"record 3: prompt holds id 99"),
        ({"prompt": [4], "chosen": [3], "rejected": [5, -1]}, r"record 3: rejected holds id -1"),
        (
            {"prompt": [4] * 30, "chosen": [3] * 3, "rejected": [5]},
            r"record 3: prompt \+ chosen is 33 tokens; model\.max_seq_len is 32",
        ),
    ],
)
def test_dpo_records_outside_the_model_are_config_errors(tmp_path, capsys, record, match):
    import json
    import re

    from rlhf.cli import main

    good = {"prompt": [4, 5], "chosen": [3, 3], "rejected": [5, 6]}
    lines = [good, good, record] + [good] * 13
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    config = tmp_path / "dpo.yaml"
    raw = {
        "model": {**PPO["model"], "max_seq_len": 32},
        "train": {"out": str(tmp_path / "out"), "steps": 1, "batch_size": 8},
        "data": {"path": str(tmp_path / "d.jsonl"), "held_out": 8},
    }
    config.write_text(yaml.safe_dump(raw))
    assert main(["dpo", str(config)]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err) and "d.jsonl" in err, err


def test_cli_steps_zero_is_rejected_not_ignored(tmp_path, capsys):
    # Before: `--steps 0` was dropped as falsy and the config's train.steps ran instead.
    from rlhf.cli import main

    (tmp_path / "p.jsonl").write_text("\n")  # would stop the run early if --steps passed
    config = tmp_path / "ppo.yaml"
    config.write_text(yaml.safe_dump(ppo_raw(prompts={"path": str(tmp_path / "p.jsonl")})))
    assert main(["ppo", str(config), "--steps", "0", "--out", str(tmp_path)]) == 2
    assert "steps and batch_size must be >= 1" in capsys.readouterr().err


def test_a_kill_while_writing_the_host_file_leaves_no_torn_checkpoint(tmp_path, monkeypatch):
    # The host file marks a checkpoint complete; a kill after it is opened but before its
    # bytes land must not leave an empty trainer-N.json (resume then died on JSON parsing).
    import io
    import pathlib
    import types

    from rlhf.checkpoint import restore_trainer, save_trainer, saved_iterations

    class Killed(BaseException):
        """The kill: not an Exception, so no handler in the code under test catches it."""

    trainer = types.SimpleNamespace(
        iteration=1,
        roles=dict,
        set_roles=lambda roles: None,
        parity=types.SimpleNamespace(in_tolerance=True),
    )
    save_trainer(trainer, tmp_path)  # a complete checkpoint at iteration 1
    real_open = io.open

    def dying_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "w" in mode and pathlib.Path(file).parent == tmp_path:

            def write(data):
                raise Killed

            f.write = write
        return f

    monkeypatch.setattr(io, "open", dying_open)
    monkeypatch.setattr("builtins.open", dying_open)
    trainer.iteration = 2
    with pytest.raises(Killed):
        save_trainer(trainer, tmp_path)
    monkeypatch.undo()
    assert saved_iterations(tmp_path) == [1]
    trainer.iteration = 0
    assert restore_trainer(trainer, tmp_path) == 1 and trainer.iteration == 1


@pytest.mark.parametrize(
    ("stage", "section", "match"),
    [
        # Before: numpy's "low >= high" traceback once the run drew its first prompts.
        ("ppo", {"prompts": {"low": 16}}, r"prompts\.low=16: .* model\.vocab_size=16"),
        ("dpo", {"data": {"low": 20}}, r"data\.low=20: .* model\.vocab_size=16"),
        ("sft", {"data": {"token": 16}}, r"data\.token=16: .* model\.vocab_size=16"),
    ],
)
def test_synthetic_ids_outside_the_vocabulary_are_config_errors(stage, section, match):
    with pytest.raises(jc.ConfigError, match=match):
        parse_config(stage, ppo_raw(**section))


def test_a_resume_keeps_metrics_whole_when_a_line_was_torn_or_the_rewrite_fails(
    tmp_path, monkeypatch
):
    """A kill in the middle of a line's write leaves a torn last line: a resume used to
    die parsing it. The trimmed file now replaces the old one atomically: a failure
    before the rename leaves every earlier line."""
    import os

    from rlhf.cli import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    log = MetricsLog(path, start=3)
    log.write(3, {"loss": 1.25})
    log.close()
    steps = [json.loads(x)["step"] for x in path.read_text().splitlines()]
    assert steps == [1, 2, 3]

    before = path.read_text()

    def crash(*a):
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="before the rename"):
        MetricsLog(path, start=2)
    assert path.read_text() == before
