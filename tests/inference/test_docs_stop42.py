"""README "Inference and serving" driven as a user would (stop 42): the first steps off
the documented model sources must stop with a `ConfigError` that says what to pass."""

from __future__ import annotations

import dataclasses
import json

import pytest

import jaxcore as jc
from inference import LLM
from jaxcore.models import TransformerConfig

TINY = TransformerConfig(
    vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16
)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    # what routes a folder to the Hugging Face loader: a config.json naming a model_type
    # (no transformers import: the loader is never reached)
    from inference.weights import init_params

    folder = tmp_path_factory.mktemp("hf") / "tiny_llama"
    folder.mkdir()
    jc.save_params(init_params(TINY, 0), folder / "model.safetensors")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_file_inside_hf_folder_names_the_folder(hf_folder):
    # A user points at the weights file of a save_pretrained folder: it was a TypeError
    # ("TransformerConfig.__init__() got an unexpected keyword argument 'architectures'").
    with pytest.raises(jc.ConfigError) as err:
        LLM(str(hf_folder / "model.safetensors"))
    message = str(err.value)
    assert "Hugging Face" in message and str(hf_folder) in message
    assert "pass the folder" in message


def test_config_json_with_unknown_key_is_config_error(tmp_path):
    # "put a config.json of TransformerConfig fields beside it": a typo in a field was a
    # TypeError; it must name the key and the allowed fields.
    from inference.weights import init_params

    path = tmp_path / "model.safetensors"
    jc.save_params(init_params(TINY, 0), path)
    fields = dataclasses.asdict(TINY)
    fields["d_modle"] = fields.pop("d_model")
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with pytest.raises(jc.ConfigError) as err:
        LLM(str(path))
    message = str(err.value)
    assert "d_modle" in message and "d_model" in message and "config.json" in message


def test_missing_hub_name_says_how_to_fetch_it(tmp_path, monkeypatch):
    # The README: a Hub name is never downloaded and the error says to fetch it with
    # huggingface_hub.snapshot_download first; the model error did not (only the
    # tokenizer's did), nor that a save_pretrained folder is accepted.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(jc.ConfigError) as err:
        LLM("meta-llama/Llama-3.2-1B")
    message = str(err.value)
    assert "snapshot_download('meta-llama/Llama-3.2-1B')" in message
    assert "folder" in message


def test_serve_user_mistakes_are_one_line_exit_2(hf_folder, tmp_path, capsys, monkeypatch):
    # `jaxcore serve --model org/model` (or a file of a save_pretrained folder, or a typo in
    # --config's JSON) printed a 20-line traceback; like `jaxcore rlhf` it now prints one
    # line naming the mistake and exits 2.
    from inference.server import main

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.json"
    fields = dataclasses.asdict(TINY)
    fields["n_layer"] = fields.pop("n_layers")
    config.write_text(json.dumps(fields))
    cases = [
        (["--model", "org/model"], "snapshot_download('org/model')"),
        (["--model", str(hf_folder / "model.safetensors")], "pass the folder"),
        (["--model", "tiny", "--config", str(config)], "n_layer"),
        (["--model", "tiny", "--config", "missing.json"], "missing.json"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("jaxcore serve: "), err
        assert needle in err[0], err
