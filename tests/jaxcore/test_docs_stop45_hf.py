"""The README's "Hugging Face models" section driven off its path (stop 45).

``jaxcore export --hf CKPT DIR --config C`` (and ``hf.save(params, cfg, DIR)``) with a
config that is not the checkpoint's (another width, fewer layers than were trained), and
the tokenizer of the model a run fine-tuned, which the exported folder used to lack.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import optax
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import jaxcore as jc
from jaxcore import hf
from jaxcore.cli import main as cli
from jaxcore.errors import ConfigError
from tests.jaxcore import hf_models as H

TEXT = "the quick brown fox jumps over the lazy dog"


def _tokens():
    return np.random.default_rng(1).integers(0, 64, (2, 9))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-layer Llama (tied embeddings, 4 query / 2 kv heads) with a word-level
    tokenizer, one checkpoint step of it, and that step exported by the README's command."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **{**H.COMMON, "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64},
        tie_word_embeddings=True,
    )
    model = H.randomize(transformers.LlamaForCausalLM(config), 0).eval()
    root = tmp_path_factory.mktemp("stop45hf")
    model.save_pretrained(root / "base")
    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator([TEXT], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(root / "base")
    engine = jc.Engine()
    state = engine.prepare(hf.model_factory(root / "base", engine), optax.sgd(0.0))
    with jc.Checkpointer(jc.CheckpointConfig(directory=root / "run", save_every_steps=1)) as ck:
        ck.save(state, force=True)
    argv = ["export", "--hf", str(root / "run" / "0"), str(root / "exported")]
    assert cli([*argv, "--config", str(root / "base")]) == 0
    return model, root


def test_export_brings_the_config_folders_tokenizer_along(run):
    """Before: DIR held config.json and weights only; transformers 5 then builds an empty
    tokenizer for it (``AutoTokenizer.from_pretrained(DIR)("the quick")`` -> ``[]``)."""
    model, root = run
    out = root / "exported"
    ids = transformers.AutoTokenizer.from_pretrained(out)(TEXT)["input_ids"]
    assert ids == transformers.AutoTokenizer.from_pretrained(root / "base")(TEXT)["input_ids"]
    assert len(ids) == len(TEXT.split())
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    np.testing.assert_allclose(
        H.torch_logits(back, _tokens()), H.torch_logits(model, _tokens()), atol=1e-6, rtol=0
    )


def test_save_takes_a_tokenizer_json_path_and_refuses_a_path_without_one(run, tmp_path):
    _, root = run
    cfg, params = hf.load(root / "base")
    hf.save(params, cfg, tmp_path / "a", tokenizer=root / "base" / "tokenizer.json")
    assert {"tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (tmp_path / "a").iterdir()
    }
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "a")(TEXT)["input_ids"]
    for bad in (root / "run", root / "base" / "config.json", root / "nothere"):
        with pytest.raises(ConfigError, match=r"tokenizer=.*not a tokenizer"):
            hf.save(params, cfg, tmp_path / "b", tokenizer=bad)
    assert not (tmp_path / "b").exists()


def _other(root, name, **changes):
    fields = {**json.loads((root / "base" / "config.json").read_text()), **changes}
    (root / name).write_text(json.dumps(fields))
    return root / name


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"num_hidden_layers": 1}, "wq"),  # before: wrote a 1-layer model, rc 0
        ({"hidden_size": 64, "intermediate_size": 128}, "embed"),  # before: ValueError
    ],
)
def test_export_with_a_config_of_another_size_is_refused_naming_the_shapes(
    run, tmp_path, capsys, changes, named
):
    """Before: a config with fewer layers exported silently (the checkpoint's other layers
    dropped, rc 0); another width stopped in ``ValueError: cannot reshape array`` from
    `layout.to_hf` with a traceback, after deleting DIR's earlier export's config."""
    model, root = run
    out = tmp_path / "out"
    shutil.copytree(root / "exported", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = _other(root, f"cfg_{named}.json", **changes)
    rc = cli(["export", "--hf", str(root / "run" / "0"), str(out), "--config", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert named in err and "--config" in err, err
    # The earlier export in DIR is untouched and still loads in transformers.
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    np.testing.assert_allclose(
        H.torch_logits(back, _tokens()), H.torch_logits(model, _tokens()), atol=1e-6, rtol=0
    )


def test_save_refuses_params_that_do_not_fit_the_config_before_writing(run, tmp_path):
    _, root = run
    _, params = hf.load(root / "base")
    fewer = hf.config_from_hf(
        {**json.loads((root / "base" / "config.json").read_text()), "num_hidden_layers": 1}
    )
    with pytest.raises(ConfigError, match=r"wq .*\(2, 32, 4, 8\).*\(1, 32, 4, 8\)"):
        hf.save(params, fewer, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_export_of_a_step_that_is_gone_names_the_steps_there(run, capsys):
    """Before: ``runs/x/7 is not a checkpoint step directory (no state/)`` for a step that
    keep_last removed, as if the path were of the wrong kind; now the steps there."""
    _, root = run
    argv = ["export", "--hf", str(root / "run" / "7"), str(root / "o7"), "--config"]
    assert cli([*argv, str(root / "base")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "[0]" in err and "keep_last" in err, err
    assert not (root / "o7").exists()


def test_save_to_a_path_that_is_a_file_says_it_is_not_a_folder(run, tmp_path):
    """Before: mkdir's bare ``FileExistsError: [Errno 17] File exists``."""
    _, root = run
    cfg, params = hf.load(root / "base")
    (tmp_path / "model").write_text("mine")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        hf.save(params, cfg, tmp_path / "model")
    assert (tmp_path / "model").read_text() == "mine"
