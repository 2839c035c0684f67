"""The README's "Hugging Face models" section driven as a user would (stop 42).

Off the documented path: the dtype spelled as jaxcore spells precisions (``"bf16"``), a
non-float dtype, ``max_shard_bytes`` given as save_pretrained's ``"5GB"``, and the
documented ``jaxcore export --hf runs/x/1000 out_dir`` with relative paths.
"""

from __future__ import annotations

import json

import numpy as np
import optax
import pytest
import torch
import transformers

import jaxcore as jc
from jaxcore import hf
from jaxcore.cli import main as cli
from jaxcore.errors import ConfigError
from tests.jaxcore import hf_models as H


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        **{**H.COMMON, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64}
    )
    model = H.randomize(transformers.Qwen2ForCausalLM(config), 0).eval()
    directory = tmp_path_factory.mktemp("hf") / "Qwen2-tiny"
    model.save_pretrained(directory)
    cfg, params = hf.load(directory)
    return model, directory, cfg, params


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "int8", "bfloat"])
def test_load_and_save_refuse_a_dtype_they_cannot_write_naming_the_spelling(qwen, tmp_path, dtype):
    """Before: ``TypeError: data type 'bf16' not understood`` out of NumPy for "bf16", and
    ``hf.load(dtype="int8")`` cast every weight to integers silently."""
    _, directory, cfg, params = qwen
    with pytest.raises(ConfigError, match=r"dtype=.*'bfloat16'"):
        hf.load(directory, dtype=dtype)
    out = tmp_path / "out"
    hf.save(params, cfg, out)  # an earlier save: a refused one must leave it whole
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError, match=r"jaxcore.hf.save\(dtype="):
        hf.save(params, cfg, out, dtype=dtype)
    assert sorted(p.name for p in out.iterdir()) == before
    hf.load(out)  # still loads


def test_the_documented_dtypes_still_load_and_save(qwen, tmp_path):
    _, directory, cfg, params = qwen
    _, half = hf.load(directory, dtype="bfloat16")
    assert {str(v.dtype) for v in half.values()} == {"bfloat16"}
    _, same = hf.load(directory, dtype=np.float32)
    np.testing.assert_array_equal(same["wq"], params["wq"])
    hf.save(params, cfg, tmp_path / "o", dtype="auto")  # "auto" keeps each tensor's own
    assert json.loads((tmp_path / "o" / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize("bad", ["5GB", 0, -1, 2.5e9, True])
def test_save_refuses_a_shard_size_that_is_not_a_byte_count(qwen, tmp_path, bad):
    """Before: ``"5GB"`` (what save_pretrained takes) was a bare ``TypeError: '>' not
    supported``; 0 and negatives wrote one file per tensor."""
    _, _, cfg, params = qwen
    with pytest.raises(ConfigError, match="max_shard_bytes"):
        hf.save(params, cfg, tmp_path / "out", max_shard_bytes=bad)


def test_export_with_the_readmes_relative_paths(qwen, tmp_path, monkeypatch, capsys):
    """``jaxcore export --hf runs/x/1 out_dir --config Qwen2/`` as the README writes it,
    from the run's directory. Before: Orbax's ``ValueError: Checkpoint path should be
    absolute`` with a traceback."""
    model, directory, _, _ = qwen
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = engine.prepare(hf.model_factory(directory, engine), optax.sgd(0.0))
    monkeypatch.chdir(tmp_path)
    with jc.Checkpointer(jc.CheckpointConfig(directory="runs/x", save_every_steps=1)) as ckpt:
        ckpt.save(state, force=True)
    rc = cli(["export", "--hf", "runs/x/0", "out_dir", "--config", str(directory)])
    assert rc == 0, capsys.readouterr().err
    back = transformers.AutoModelForCausalLM.from_pretrained("out_dir", attn_implementation="eager")
    tokens = np.random.default_rng(1).integers(0, 64, (2, 9))
    np.testing.assert_allclose(
        H.torch_logits(back, tokens), H.torch_logits(model, tokens), atol=1e-6, rtol=0
    )


# --- compression on the README's Hugging Face model -------------------------------------


def test_perplexity_of_a_qwen2_checkpoint_equals_transformers_loss(qwen):
    """``cz.perplexity`` of ``hf.load("Qwen2…/")`` (q/k/v biases). Before: ``KeyError:
    'bq'`` (the decoding weights left the biases out; the int8 path through
    ``inference.quantize`` the same). The oracle is ``exp`` of transformers' own loss."""
    from jaxcore import compression as cz

    model, _, cfg, params = qwen
    tokens = np.random.default_rng(3).integers(0, 64, (2, 9))
    with torch.no_grad():
        t = torch.as_tensor(tokens, dtype=torch.long)
        want = float(torch.exp(model(t, labels=t).loss))
    got = cz.perplexity(cfg, params, [tokens])
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize(
    "batches, match",
    [
        ([], "no batches"),
        ([{"tokens": H.tokens(2, 9), "mask": np.ones((2, 9), np.int32)}], r"batch\['tokens'\]"),
        ([H.tokens(2, 9)[0]], r"shape \(9,\)"),
    ],
)
def test_perplexity_refuses_batches_it_cannot_score_saying_what_to_pass(qwen, batches, match):
    """Before: ``ZeroDivisionError`` for no batches and ``ValueError: entry not a 2- or 3-
    tuple`` for the Loader's dict batches."""
    from jaxcore import compression as cz

    _, _, cfg, params = qwen
    with pytest.raises(ConfigError, match=match):
        cz.perplexity(cfg, params, batches)
