"""A rerun of `jaxcore rlhf` into the same ``--out`` with other settings is refused.

The rerun resumed from (PPO/GRPO) or kept (SFT/reward/DPO: "step already saved") the
checkpoints of the earlier settings, so the output folder silently held a model of the
old run, or one trained partly under each. Settings that do not change the result (the
step count, which extends a run; the checkpoint cadence; the device layout) may change.
"""

from __future__ import annotations

import json

import yaml

from rlhf.cli import main

SFT = {
    "model": {
        "vocab_size": 16,
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "d_ff": 64,
        "max_seq_len": 32,
    },
    "parallel": {"fsdp": 8},
    "train": {"steps": 2, "lr": 3.0e-3, "batch_size": 8},
    "loss": {"packing": True, "length": 24},
    "data": {"n": 64, "held_out": 32, "prompt_len": 4, "completion_len": 8, "token": 3},
}


def _write(tmp_path, name, **train):
    cfg = json.loads(json.dumps(SFT))
    cfg["train"].update(train, out=str(tmp_path / "unused"))
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_rerun_with_other_settings_into_the_same_out_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sft", str(_write(tmp_path, "a.yaml")), "--out", str(out)]) == 0
    before = (out / "metrics.jsonl").read_text()
    assert main(["sft", str(_write(tmp_path, "b.yaml", lr=1e-2)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "train.lr" in err and "0.003" in err and "0.01" in err and "--out" in err
    assert (out / "metrics.jsonl").read_text() == before  # nothing was touched
    # More steps, another layout or checkpoint cadence: the same run, continued.
    more = _write(tmp_path, "c.yaml", steps=3, checkpoint_every=2)
    assert main(["sft", str(more), "--out", str(out)]) == 0
