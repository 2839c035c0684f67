"""rlhf off its tested path, round 40: a reward model started from a Hugging Face checkpoint
and exported as TRL's RewardTrainer saves it (``AutoModelForSequenceClassification``,
``num_labels=1``, a ``score`` Linear without bias, ``pad_token_id`` set), checked against
transformers' own forward on left- and right-padded batches."""

import json

import numpy as np
import pytest


def _pairs(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(1, 256, 3).tolist()  # 0 is the pad id: never in a sequence
        chosen = rng.integers(1, 256, rng.integers(1, 6)).tolist()
        rejected = rng.integers(1, 256, rng.integers(1, 6)).tolist()
        out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return out


def _padded(seqs, side):
    width = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), width), np.int64)
    mask = np.zeros((len(seqs), width), np.int64)
    for i, s in enumerate(seqs):
        span = slice(0, len(s)) if side == "right" else slice(width - len(s), width)
        ids[i, span], mask[i, span] = s, 1
    return ids, mask


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    """A 2-step reward run started from a ``save_pretrained`` Qwen2: (qwen2 dir, train.out)."""
    from rlhf.cli import main
    from tests.jaxcore.hf_models import save_model
    from tests.rlhf.helpers import read_metrics, write_config

    tmp = tmp_path_factory.mktemp("reward")
    _, folder = save_model("qwen2", tmp / "qwen2")
    data = tmp / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _pairs(24, 0)))
    raw = {
        "model": {"hf": str(folder)},
        "parallel": {"fsdp": 8},
        "train": {"steps": 2, "lr": 1e-2, "batch_size": 8},
        "data": {"path": str(data), "held_out": 8},
    }
    out = tmp / "out"
    assert main(["reward", str(write_config(tmp, "r.yaml", raw)), "--out", str(out)]) == 0
    assert "held_out_accuracy" in read_metrics(out)[-1]
    return folder, out


def test_a_reward_model_from_a_hf_checkpoint_exports_as_sequence_classification(
    tmp_path, reward_run
):
    """``model: {hf: DIR}`` starts the reward stage from a ``save_pretrained`` Qwen2 (the
    head fresh, no bias as TRL's); `rlhf.export_reward_model` writes a directory that
    ``AutoModelForSequenceClassification`` loads, whose scores on held-out sequences,
    batched with right or left padding, are the run's own to 1e-5."""
    import torch
    import transformers

    import jaxcore as jc
    from jaxcore import ConfigError
    from rlhf import export_reward_model
    from rlhf.rewards import load_reward_model

    _, out = reward_run
    with pytest.raises(ConfigError, match=r"sets neither pad_token_id nor eos_token_id; pass"):
        export_reward_model(out, tmp_path / "rm")  # this Qwen2's config.json has neither
    hf_dir = export_reward_model(out, tmp_path / "rm", pad_token_id=0)

    config = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForSequenceClassification"]
    assert config["pad_token_id"] == 0
    model = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
    assert model.config.num_labels == 1 and model.score.bias is None

    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    policy = jc.models.TransformerConfig(vocab_size=256)  # only the vocabulary is checked
    reward = load_reward_model(out, engine, policy)
    seqs = [r["prompt"] + r[k] for r in _pairs(8, 1) for k in ("chosen", "rejected")]
    ids, _ = _padded(seqs, "right")
    lengths = np.array([len(s) for s in seqs], np.int32)
    ours = np.asarray(
        reward._score(reward.state, {"tokens": ids.astype(np.int32), "lengths": lengths})["score"]
    )
    assert np.ptp(ours) > 1e-3  # distinct sequences, distinct scores

    # stop 42: relative paths, as a user types them from the run's folder (it stopped in
    # Orbax's "Checkpoint path should be absolute")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(out.parent)
        rel = export_reward_model(out.name, "rm_relative", pad_token_id=0)
    relative = out.parent / "rm_relative"
    assert json.loads((relative / "config.json").read_text()) == config, rel
    for side in ("right", "left"):
        ids, mask = _padded(seqs, side)
        with torch.no_grad():
            theirs = model(
                input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)
            ).logits[:, 0]
        np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-5, rtol=1e-5, err_msg=side)


def test_exporting_a_reward_model_trained_from_scratch_is_a_config_error(tmp_path):
    """A from-scratch reward model's head has a bias transformers' score layer lacks:
    export refuses it in one line saying to start from ``model: {hf: DIR}``."""
    from jaxcore import ConfigError
    from rlhf import export_reward_model
    from rlhf.cli import main
    from tests.rlhf.helpers import write_config

    raw = {
        "model": {
            "vocab_size": 16,
            "d_model": 16,
            "n_layers": 1,
            "n_heads": 2,
            "d_ff": 32,
            "max_seq_len": 16,
        },
        "parallel": {"fsdp": 8},
        "train": {"steps": 1, "batch_size": 8},
        "data": {"n": 16, "held_out": 8, "prompt_len": 2, "completion_len": 4},
    }
    out = tmp_path / "out"
    assert main(["reward", str(write_config(tmp_path, "r.yaml", raw)), "--out", str(out)]) == 0
    with pytest.raises(ConfigError, match=r"trained a reward model from scratch"):
        export_reward_model(out, tmp_path / "rm", pad_token_id=0)
    with pytest.raises(ConfigError, match=r"holds no checkpoints/"):
        export_reward_model(tmp_path, tmp_path / "rm")


# GRPO numerics against float64 formulas: advantages as TRL's grpo_trainer.py computes them
# (group mean, unbiased std + 1e-4 when scale_rewards), the clipped surrogate
# -min(r A, clip(r, 1 - eps, 1 + eps_high) A) plus beta * k3 KL, and the three loss_type
# aggregations jaxcore supports (grpo, dapo, dr_grpo; TRL's bnpo is dapo's token mean
# over a batch, as here with one process).
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _adv64(rewards, g, scale):
    grouped = np.asarray(rewards, np.float64).reshape(-1, g)
    adv = grouped - grouped.mean(1, keepdims=True)
    if scale:
        adv = adv / (grouped.std(1, ddof=1, keepdims=True) + 1e-4)
    return adv.reshape(-1)


def _loss64(logp, old, ref, adv, mask, kind, beta, eps, eps_high):
    logp, old, ref, mask = (np.asarray(x, np.float64) for x in (logp, old, ref, mask))
    ratio = np.exp(logp - old)
    a = adv[:, None]
    per = -np.minimum(ratio * a, np.clip(ratio, 1 - eps, 1 + eps_high) * a)
    per = per + beta * (np.exp(ref - logp) - (ref - logp) - 1)
    if kind == "grpo":
        return np.mean((per * mask).sum(1) / np.maximum(mask.sum(1), 1))
    if kind == "dapo":
        return (per * mask).sum() / max(mask.sum(), 1)
    return (per * mask).sum() / (per.shape[0] * per.shape[1])


@st.composite
def _grpo_batches(draw):
    g, groups, t = draw(st.integers(2, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    n = g * groups
    value = st.floats(-10, 10, allow_nan=False, width=32)
    rewards = draw(st.lists(value, min_size=n, max_size=n))
    if draw(st.booleans()):  # a group whose rewards are all equal: std 0
        rewards[:g] = [rewards[0]] * g
    small = st.floats(-1, 1, allow_nan=False, width=32)
    arr = lambda: np.array(draw(st.lists(small, min_size=n * t, max_size=n * t))).reshape(n, t)
    old = -np.abs(arr()) - 0.1
    logp, ref = old + arr() * 0.5, old + arr() * 0.5
    mask = np.array(draw(st.lists(st.booleans(), min_size=n * t, max_size=n * t)), np.float32)
    return g, rewards, logp, old, ref, mask.reshape(n, t)


@settings(deadline=None, max_examples=60)
@given(
    batch=_grpo_batches(),
    scale=st.booleans(),
    kind=st.sampled_from(["grpo", "dapo", "dr_grpo"]),
    beta=st.sampled_from([0.0, 0.04]),
    eps_high=st.sampled_from([None, 0.28]),
)
def test_grpo_advantages_and_clipped_loss_equal_the_float64_formulas(
    batch, scale, kind, beta, eps_high
):
    import jax.numpy as jnp

    from rlhf import losses as L

    g, rewards, logp, old, ref, mask = batch
    adv = np.asarray(L.group_advantages(jnp.asarray(rewards, jnp.float32), g, scale=scale))
    want_adv = _adv64(rewards, g, scale)
    assert np.all(np.isfinite(adv))
    np.testing.assert_allclose(adv, want_adv, rtol=2e-4, atol=2e-4 * (1 + np.abs(want_adv).max()))
    per = L.grpo_token_loss(
        *(jnp.asarray(x, jnp.float32) for x in (logp, old, ref, want_adv)),
        beta=beta,
        clip_eps=0.2,
        clip_eps_high=eps_high,
    )
    got = float(L.aggregate_loss(per, jnp.asarray(mask), kind))
    want = _loss64(logp, old, ref, want_adv, mask, kind, beta, 0.2, eps_high or 0.2)
    assert np.isfinite(got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * (1 + np.abs(want_adv).max()))


@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_a_prompt_too_long_for_the_sampler_is_refused_at_start_naming_its_record(
    tmp_path, monkeypatch, capsys, stage
):
    """A prompt that leaves no room for ``max_tokens`` in the sampler's context
    (``serving.max_len``) stops the run before anything compiles, naming its record and
    the settings to change, as an empty prompt does: not at the iteration that first draws
    it (record 3 here, never drawn by a 1-step run of 2 prompts)."""
    from rlhf.cli import main
    from tests.rlhf.helpers import write_config
    from tests.rlhf.test_offpath_stop38 import GRPO, _lines, _record_steps

    seen = _record_steps(monkeypatch)
    prompts = _lines(tmp_path / "p.jsonl", [[4, 5], [6], [4] * 5])  # 5 + 4 > max_len 8
    raw = {**GRPO, "train": {"steps": 1}, "prompts": {"count": 2, "path": str(prompts)}}
    if stage == "ppo":
        raw["ppo"] = {"max_tokens": raw.pop("grpo")["max_tokens"]}
    code = main([stage, str(write_config(tmp_path, "c.yaml", raw)), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"p.jsonl: record 3: the prompt has 5 tokens and {stage}.max_tokens is 4" in err
    assert "serving.max_len" in err and "Traceback" not in err
    assert seen == []


def test_grpo_from_a_hf_checkpoint_with_its_reward_model_exports_the_trained_policy(
    tmp_path, reward_run, capsys
):
    """GRPO from ``model: {hf: DIR}`` (the actor and reference start from the checkpoint)
    scored by a reward model that itself started from it plus a reward function given as a
    Python path; ``jaxcore export --hf`` of the actor's checkpoint loads in transformers,
    whose greedy ``generate`` continues a prompt as the run's own sampler does on the
    saved weights. A bad reward path is a one-line ConfigError; LoRA with model.hf too."""
    import torch
    import transformers

    from inference import ServingConfig
    from jaxcore.checkpointing.portable import export_checkpoint, read_params
    from jaxcore.hf.export import main as export
    from rlhf.cli import main
    from rlhf.config import load_config
    from rlhf.rollout import Sampler
    from tests.rlhf.helpers import read_metrics, write_config

    folder, reward_out = reward_run
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p["prompt"]}) + "\n" for p in _pairs(4, 2)))
    raw = {
        "model": {"hf": str(folder)},
        "parallel": {"fsdp": 8},
        "serving": {"slots": 8, "max_len": 16},
        "train": {"steps": 1, "lr": 1e-2},
        "grpo": {"num_generations": 2, "max_tokens": 4, "beta": 0.04},
        "prompts": {"count": 4, "path": str(prompts)},
        "rewards": [{"fn": "rlhf.tasks:token_share", "kwargs": {"token": 3, "length": 4}}],
        "reward": {"model": str(reward_out)},
    }
    out = tmp_path / "out"
    code = main(["grpo", str(write_config(tmp_path, "g.yaml", raw)), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    (line,) = read_metrics(out)
    assert np.isfinite(line["loss"]) and np.isfinite(line["reward_model_mean"])
    assert line["logprob_diff_max"] < 1e-3  # the sampler serves the checkpoint's weights
    (step,) = sorted((out / "checkpoints" / "actor").glob("[0-9]*"))
    hf = tmp_path / "policy"
    assert export(["--hf", str(step), str(hf), "--config", str(folder)]) == 0

    params, _ = read_params(export_checkpoint(step, tmp_path / "actor.safetensors"))
    cfg = load_config("grpo", write_config(tmp_path, "again.yaml", raw)).model
    sampler = Sampler(cfg, params, ServingConfig(slots=8, max_len=16))
    prompt = _pairs(1, 3)[0]["prompt"]
    ours = sampler.generate([prompt], max_tokens=8, temperature=0.0).completions[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    with torch.no_grad():
        ids = model.generate(
            torch.as_tensor([prompt]),
            do_sample=False,
            max_new_tokens=8,
            min_new_tokens=8,
            pad_token_id=0,
        )
    assert ids[0, len(prompt) :].tolist() == ours
    before = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        moved = model(torch.as_tensor([prompt])).logits - before(torch.as_tensor([prompt])).logits
    assert float(moved.abs().max()) > 1e-4  # the exported policy is the trained one

    capsys.readouterr()
    for key, value, match in (
        ("rewards", [{"fn": "rlhf.tasks:no_such_reward"}], "no_such_reward"),
        ("lora", {"rank": 2}, "model.hf with lora"),
    ):
        bad = write_config(tmp_path, "bad.yaml", {**raw, key: value})
        assert main(["grpo", str(bad), "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and match in err.strip().splitlines()[-1], err


def test_a_group_of_equal_rewards_gets_exactly_zero_advantages():
    """Hypothesis' find: three equal float32 rewards have a float32 mean one ulp off, and
    dividing that by (std 0 + 1e-4) gave every completion an advantage of -0.0047 where the
    formula gives 0: the policy was pushed on a group that carries no signal."""
    import jax.numpy as jnp

    from rlhf import losses as L

    r = np.float32(4.778351306915283)
    rewards = jnp.asarray([r, r, r, 1.0, 2.0, 4.0], jnp.float32)
    for scale in (True, False):
        adv = np.asarray(L.group_advantages(rewards, 3, scale=scale))
        assert np.all(adv[:3] == 0.0), adv
        np.testing.assert_allclose(adv[3:], _adv64([1, 2, 4], 3, scale), rtol=1e-5)
