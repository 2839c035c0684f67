"""jaxcore.hf and jaxcore.compression driven as a user would, off the tested path.

HF: config variants (rope scaling, head_dim != hidden/heads, tied/untied, Mistral's window,
Qwen2's biases), half-precision and sharded checkpoints, against `transformers` on tiny
random models; refused variants; damaged checkpoints; a save or export that fails midway.
Compression: odd shapes against plain numpy, NaN weights, qkv-bias teachers, a teacher
that rules tokens out (-inf logits), two parameter groups.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx
from safetensors.torch import load_file, save_file

import jaxcore as jc
from jaxcore import compression as cz
from jaxcore import hf
from jaxcore.cli import main as cli
from jaxcore.errors import ConfigError
from jaxcore.hf import writer
from jaxcore.models import Transformer, TransformerConfig, lm_loss
from tests.jaxcore import hf_models as H

TOKENS = H.tokens(2, 12)
CFG = TransformerConfig(
    vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=37, max_seq_len=32
)


def _model(cls, dtype=torch.float32, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = cls(**{**H.COMMON, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return H.randomize(model, 0).eval().to(dtype)


def _torch_logits(directory) -> np.ndarray:
    back = transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", dtype=torch.float32
    )
    return H.torch_logits(back.eval(), TOKENS)


def _our_logits(cfg: TransformerConfig, params: dict) -> np.ndarray:
    net = hf.build_model(cfg, params)
    return np.asarray(jax.jit(lambda t: net(t))(TOKENS))


VARIANTS = {
    "llama-linear-rope-untied": (
        transformers.LlamaConfig,
        dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}),
        {},
    ),
    "llama-head-dim-24-mha": (
        transformers.LlamaConfig,
        dict(head_dim=24, num_key_value_heads=4, tie_word_embeddings=True),
        {},
    ),
    "mistral-window-head-dim-8": (
        transformers.MistralConfig,
        dict(sliding_window=4, head_dim=8),
        {},
    ),
    "qwen2-tied-sharded": (
        transformers.Qwen2Config,
        dict(tie_word_embeddings=True),
        dict(max_shard_size="40KB"),
    ),
    "llama-bfloat16": (transformers.LlamaConfig, dict(dtype_=torch.bfloat16), {}),
    "qwen2-float16": (transformers.Qwen2Config, dict(dtype_=torch.float16), {}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_logits_match_transformers_and_save_round_trips(tmp_path, variant):
    cls, overrides, save_kwargs = VARIANTS[variant]
    overrides = dict(overrides)
    dtype = overrides.pop("dtype_", torch.float32)
    _model(cls, dtype, **overrides).save_pretrained(tmp_path / "in", **save_kwargs)
    if save_kwargs:
        assert (tmp_path / "in" / "model.safetensors.index.json").is_file()
    ref = _torch_logits(tmp_path / "in")  # the checkpoint's weights, computed in float32

    cfg, params = hf.load(tmp_path / "in")
    np.testing.assert_allclose(_our_logits(cfg, params), ref, atol=1e-4, rtol=0)

    _, kept = hf.load(tmp_path / "in", dtype="auto")  # the checkpoint's own dtype back out
    hf.save(kept, cfg, tmp_path / "out", max_shard_bytes=60_000)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == str(
        dtype
    ).removeprefix("torch.")
    np.testing.assert_array_equal(_torch_logits(tmp_path / "out"), ref)


DYNAMIC = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}


@pytest.mark.parametrize(
    "cls, overrides, field",
    [
        (transformers.LlamaConfig, dict(rope_parameters=DYNAMIC), "rope_type"),
        (transformers.LlamaConfig, dict(rope_parameters=YARN), "rope_type"),
        (transformers.LlamaConfig, dict(attention_bias=True), "attention_bias"),
        (transformers.LlamaConfig, dict(mlp_bias=True), "mlp_bias"),
        (transformers.Qwen3Config, dict(head_dim=16), "model_type"),
        (transformers.GemmaConfig, dict(head_dim=16), "model_type"),
    ],
)  # fmt: skip
def test_unsupported_variants_are_refused_naming_the_field(tmp_path, cls, overrides, field):
    _model(cls, **overrides).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=field):
        hf.load(tmp_path)


def test_pytorch_bin_only_checkpoint_is_refused_with_the_fix(tmp_path):
    model = _model(transformers.LlamaConfig)
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="safetensors"):
        hf.load(tmp_path)


def test_index_naming_a_shard_that_lacks_the_tensor_is_a_config_error(tmp_path):
    """An index from another download next to these shards: the error names the file and
    the tensor (before: safetensors' bare ``SafetensorError``)."""
    _model(transformers.LlamaConfig).save_pretrained(tmp_path, max_shard_size="40KB")
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    name = "model.layers.1.mlp.up_proj.weight"
    other = sorted(set(index["weight_map"].values()) - {index["weight_map"][name]})[0]
    index["weight_map"][name] = other
    index_file.write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=f"{other}: has no tensor {name}"):
        hf.load(tmp_path)


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path):
    _model(transformers.Qwen2Config).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.1.self_attn.k_proj.bias"] = torch.zeros(16)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"k_proj.bias \(16,\) \(expected \(32,\)\)"):
        hf.load(tmp_path)


def _disk_full_at(monkeypatch, file_name: str) -> None:
    """Opening ``file_name`` for writing in jaxcore.hf.writer fails as a full disk does."""

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).endswith(file_name):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(writer, "open", fake_open, raising=False)


def test_a_save_that_fails_midway_never_loads_old_and_new_weights_mixed(tmp_path, monkeypatch):
    """Saving over an earlier export, the disk fills at the third shard: the directory must
    not load (before: the old index and config loaded new shards 1-2 with old shards 3-10)."""
    _model(transformers.LlamaConfig).save_pretrained(tmp_path / "in")
    cfg, old = hf.load(tmp_path / "in")
    out = tmp_path / "out"
    hf.save(old, cfg, out, max_shard_bytes=40_000)
    shards = sorted(p.name for p in out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 3

    new = {k: v + 1.0 for k, v in old.items()}
    _disk_full_at(monkeypatch, shards[2])
    with pytest.raises(OSError, match="No space left"):
        hf.save(new, cfg, out, max_shard_bytes=40_000)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="failed midway"):
        hf.load(out)
    with pytest.raises((OSError, ValueError), match=r"config\.json"):
        transformers.AutoModelForCausalLM.from_pretrained(out)

    hf.save(new, cfg, out, max_shard_bytes=40_000)  # run again: the new weights, whole
    _, back = hf.load(out)
    for name in new:
        np.testing.assert_array_equal(back[name], new[name])
    assert not list(out.glob("*.partial"))


def test_export_to_a_dir_it_cannot_write_says_so(tmp_path, capsys):
    """``jaxcore export --hf`` into a path under a regular file: exit 1 and one line, not a
    traceback (before: ``FileExistsError`` raised out of the CLI)."""
    (tmp_path / "run" / "7" / "state").mkdir(parents=True)
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "cfg.json").write_text(json.dumps(hf.config_to_hf(CFG)))
    argv = ["export", "--hf", str(tmp_path / "run" / "7"), str(tmp_path / "afile" / "out")]
    assert cli([*argv, "--config", str(tmp_path / "cfg.json")]) == 1
    err = capsys.readouterr().err
    assert "jaxcore export:" in err and "pick a DIR you can write" in err


# --- compression -----------------------------------------------------------------------


def _params(cfg: TransformerConfig) -> dict:
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_student_from_a_qkv_bias_teacher_takes_its_layers_biases():
    """Qwen2-style teacher: bq/bk/bv are stacked per layer too (before: the student kept all
    4 teacher layers of biases and failed to build: 'scan got values with different
    leading axis sizes')."""
    cfg = dataclasses.replace(CFG, qkv_bias=True)
    teacher = _params(cfg)
    student = cz.student_from_teacher(teacher, range(0, 4, 2))
    for name in ("bq", "bk", "bv", "wq"):
        np.testing.assert_array_equal(student[name], np.asarray(teacher[name])[[0, 2]])
    logits = hf.build_model(dataclasses.replace(cfg, n_layers=2), student)(TOKENS % 64)
    assert logits.shape == (2, 12, 64)


def test_mask_structure_zeroes_pruned_units_that_hold_nan():
    """A pruned head holding NaN/inf must be zero, as `shrink` drops it (before: NaN * 0
    left NaN in the masked model, so it no longer computed what the shrunk one does)."""
    params = _params(CFG)
    wq = np.array(params["wq"])
    wq[:, :, 1] = np.nan
    w_up = np.array(params["w_up"])
    w_up[:, :, 36] = np.inf
    params |= {"wq": jnp.asarray(wq), "w_up": jnp.asarray(w_up)}
    keep_neurons = np.tile(np.arange(0, 36, 2), (4, 1))
    structure = cz.Structure(
        heads=np.tile([0, 2], (4, 1)), kv_heads=np.tile([0, 1], (4, 1)), neurons=keep_neurons
    )
    masked = cz.mask_structure(params, CFG, structure)
    assert all(np.isfinite(np.asarray(v)).all() for v in masked.values())
    assert not np.asarray(masked["wq"])[:, :, 1].any()
    small_cfg, small = cz.shrink(params, CFG, structure)
    tokens = TOKENS % 64
    np.testing.assert_allclose(
        np.asarray(hf.build_model(CFG, masked)(tokens)),
        np.asarray(hf.build_model(small_cfg, small)(tokens)),
        atol=1e-5,
    )


def _np_kd(s, t, y, mask, temperature, alpha) -> float:
    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    log_t, log_s = log_softmax(t / temperature), log_softmax(s / temperature)
    p_t = np.exp(log_t)
    with np.errstate(invalid="ignore"):  # 0 log 0 = 0
        kl = np.where(p_t > 0, p_t * (log_t - log_s), 0.0).sum(-1)
    ce = -np.take_along_axis(log_softmax(s), y[..., None], -1)[..., 0]
    n = mask.sum()
    return alpha * temperature**2 * (kl * mask).sum() / n + (1 - alpha) * (ce * mask).sum() / n


def test_kd_loss_with_a_teacher_that_rules_tokens_out_matches_numpy():
    """Teacher logits of -inf (a masked or padded vocabulary entry) add nothing to the KL
    (before: 0 * (-inf - x) made the loss NaN)."""
    rng = np.random.default_rng(0)
    s = rng.standard_normal((2, 5, 7)) * 3
    t = rng.standard_normal((2, 5, 7)) * 3
    t[..., -2:] = -np.inf
    y = rng.integers(0, 5, (2, 5))
    mask = (rng.random((2, 5)) > 0.3).astype(np.float64)

    def loss(student):
        return cz.kd_loss(
            student, jnp.asarray(t, jnp.float32), jnp.asarray(y), jnp.asarray(mask, jnp.float32),
            temperature=1.7, alpha=0.3,
        )[0]  # fmt: skip

    got, grad = jax.value_and_grad(loss)(jnp.asarray(s, jnp.float32))
    np.testing.assert_allclose(float(got), _np_kd(s, t, y, mask, 1.7, 0.3), rtol=1e-5)
    assert np.isfinite(np.asarray(grad)).all()


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.99])
def test_magnitude_mask_on_odd_layers_matches_numpy(sparsity):
    w = np.random.default_rng(1).standard_normal((3, 7, 5)).astype(np.float32)
    w[1, 2, 3] = np.nan  # NaN sorts as the largest magnitude, as numpy's argsort does
    got = np.asarray(cz.magnitude_mask(jnp.asarray(w), jnp.float32(sparsity), stacked=True))
    want = np.ones((3, 35), bool)
    k = int(np.floor(sparsity * 35 + 1e-4))
    for layer in range(3):
        want[layer, np.argsort(np.abs(w[layer].ravel()), kind="stable")[:k]] = False
    np.testing.assert_array_equal(got.reshape(3, 35), want)


@pytest.mark.parametrize("sparsity", [1.0, -0.1])
def test_sparsity_outside_zero_to_one_is_refused(sparsity):
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        cz.SparsitySchedule.one_shot(sparsity)


def test_int8_and_fake_quant_on_odd_shapes_match_numpy():
    w = np.random.default_rng(2).standard_normal((3, 7, 5, 3)).astype(np.float32)
    w[0, :, 1, 2] = 0.0  # an all-zero channel: scale 1, q 0
    q, scale = cz.int8_quantize(jnp.asarray(w), (1,))
    absmax = np.abs(w).max(axis=1, keepdims=True)
    want_scale = np.where(absmax > 0, absmax / np.float32(127), np.float32(1))
    # XLA divides by 127 through its reciprocal: one ulp from numpy's quotient at most.
    np.testing.assert_array_max_ulp(np.asarray(scale), want_scale, maxulp=1)
    want_q = np.clip(np.round(w / np.asarray(scale)), -127, 127).astype(np.int8)
    np.testing.assert_array_equal(np.asarray(q), want_q)
    np.testing.assert_array_equal(
        np.asarray(cz.fake_quant(jnp.asarray(w), (1,))), want_q * np.asarray(scale)
    )


def test_pruning_two_parameter_groups_prunes_each_layer_of_both():
    labels = lambda params: {k: "head" if k in ("lm_head", "w_up") else "body" for k in params}
    inner = optax.multi_transform({"head": optax.adamw(1e-3), "body": optax.sgd(1e-2)}, labels)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    cfg = dataclasses.replace(CFG, n_layers=2)
    plan = engine.plan(
        lambda r: Transformer(cfg, rngs=r),
        cz.magnitude_pruning(inner, cz.SparsitySchedule.one_shot(0.5)),
    )
    state, step = plan.init(0), plan.train_step(lm_loss)
    batch = {"tokens": np.random.default_rng(0).integers(0, 64, (8, 9)).astype(np.int32)}
    for _ in range(2):
        state, _ = step(state, batch)
    report = cz.sparsity_report(state.params)
    assert report == {name: [0.5, 0.5] for name in report} and "w_up" in report


def test_tensors_the_config_does_not_use_are_named_in_a_warning(tmp_path, caplog):
    """A Llama checkpoint holding q_proj biases its config does not declare loads without
    them (as transformers does) but says so, instead of dropping them silently; the
    tensors every loader skips (rotary inv_freq) are not named."""
    _model(transformers.LlamaConfig).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.ones(32)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level("WARNING", logger="jaxcore.hf.reader"):
        hf.load(tmp_path)
    text = caplog.text
    assert "not used by this config" in text and "q_proj.bias" in text, text
    assert "inv_freq" not in text
