"""The ``lora`` and ``split`` config sections: validated with fixes in the errors, the
examples in configs/rlhf/ load, and the CLI runs GRPO with a LoRA actor."""

import json
import pathlib

import pytest
import yaml

import jaxcore as jc
from rlhf import lora
from rlhf.cli import main
from rlhf.config import load_config, parse_config
from rlhf.layout import build_roles
from rlhf.split import SplitConfig, device_ids

CONFIGS = pathlib.Path(__file__).parents[2] / "configs" / "rlhf"


def raw(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text())


def test_examples_load_into_the_layout_sections():
    split = load_config("ppo", CONFIGS / "ppo_split.yaml")
    assert split.split == SplitConfig(actor=4, critic=2, reference=2) and split.lora is None
    assert split.ppo.offload_optimizer
    tuned = load_config("grpo", CONFIGS / "grpo_lora.yaml")
    assert tuned.lora == lora.LoRAConfig(rank=4, alpha=8.0, targets=(*lora.PROJECTIONS, "lm_head"))
    assert tuned.grpo.offload_optimizer and tuned.split is None


@pytest.mark.parametrize(
    ("stage", "name", "patch", "match"),
    [
        ("ppo", "ppo_split.yaml", {"split": {"actor": 8}}, r"need 12 devices .* but 8 exist"),
        ("ppo", "ppo_split.yaml", {"split": {"critic": 0}}, r"split\.critic=0"),
        ("ppo", "ppo_split.yaml", {"split": {"actors": 4}}, r"split\.actors: unknown key"),
        ("ppo", "ppo_split.yaml", {"parallel": {"fsdp": 8}}, "remove the parallel section"),
        ("grpo", "grpo_lora.yaml", {"split": {}}, "remove it for grpo"),
        ("grpo", "grpo_lora.yaml", {"lora": {"rank": 0}}, r"lora: LoRAConfig\.rank=0"),
        ("grpo", "grpo_lora.yaml", {"lora": {"targets": ["q"]}}, "unknown projection 'q'"),
        ("grpo", "grpo_lora.yaml", {"grpo": {"offload_optimiser": True}}, "offload_optimiser"),
    ],
)
def test_bad_layout_values_raise_config_errors_with_the_fix(stage, name, patch, match):
    config = raw(name)
    for section, fields in patch.items():
        config[section] = {**config.get(section, {}), **fields}
    with pytest.raises(jc.ConfigError, match=match):
        parse_config(stage, config)


def test_lora_is_rejected_for_stages_that_do_not_use_it():
    config = {"model": raw("grpo_lora.yaml")["model"], "train": {"out": "x"}, "lora": {}}
    with pytest.raises(jc.ConfigError, match="remove it for sft"):
        parse_config("sft", config)


def test_build_roles_places_the_split_config_on_its_sub_meshes():
    roles = build_roles(load_config("ppo", CONFIGS / "ppo_split.yaml"), lambda lr: _adam(lr))
    (_, actor), (_, critic) = roles.actor, roles.critic
    assert device_ids(actor) == {0, 1, 2, 3} and device_ids(critic) == {4, 5}
    assert device_ids(roles.reference["reference"]) == {6, 7}
    assert {d.id for d in roles.reward_engine.mesh.devices.flat} == {6, 7}


def test_cli_grpo_with_lora_trains_adapters_only(tmp_path):
    config = raw("grpo_lora.yaml")
    config["train"] = {**config["train"], "out": str(tmp_path), "steps": 2}
    path = tmp_path / "grpo_lora.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["grpo", str(path)]) == 0
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert all(m["logprob_diff_max"] < 1e-4 for m in lines)  # merged weights in the sampler
    # One role checkpointed: the actor (base + adapters); the reference is its base.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()) == ["actor"]


def _adam(lr):
    import optax

    return optax.adam(lr)
