"""`jaxcore rlhf` stopped by SIGTERM (a preemption notice) through the real CLI: the step
in progress finishes, its checkpoint is saved, the process exits 75, and a rerun ends
with the uninterrupted run's metrics and weights. SIGTERMs are sent by the process itself
at named points (`rlhf.faults`), so the moment is exact."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

import jaxcore as jc
from jaxcore import PREEMPTION_EXIT_CODE
from rlhf.cli import KILL_ENV
from tests.rlhf.helpers import read_metrics, write_config

TERM_ENV = "JAXCORE_RLHF_TERM_AT"  # rlhf.faults: SIGTERM at <iteration>:<point>, ...

MODEL = dict(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
SFT = {
    "model": {**MODEL, "max_seq_len": 32},
    "parallel": {"fsdp": 8},
    "train": {"steps": 5, "lr": 3e-3, "batch_size": 8},
    "loss": {"packing": True, "length": 24},
    "data": {"n": 48, "held_out": 16, "prompt_len": 4, "completion_len": 8},
}
GRPO = {
    "model": {**MODEL, "max_seq_len": 16},
    "parallel": {"fsdp": 8},
    "serving": {"slots": 8, "max_len": 8},
    "train": {"steps": 4, "lr": 1e-2, "checkpoint_every": 3},
    "grpo": {"num_generations": 2, "max_tokens": 4, "beta": 0.04},
    "prompts": {"count": 4, "length": 3, "low": 4},
    "rewards": [{"fn": "rlhf.tasks:token_share", "kwargs": {"token": 3, "length": 4}}],
}
TIMINGS = {"generate_s", "train_s", "rollout_tokens_per_s"}


def run(stage, config, out, tmp_path, env=None):
    """One ``jaxcore rlhf`` process; all share a compilation cache (one compile)."""
    cache = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "jaxcore.cli", "rlhf", stage, str(config), "--out", str(out)],
        env={**os.environ, **cache, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def assert_same_metrics(want, got):
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for a, b in zip(want, got, strict=True):
        for key in set(a) - TIMINGS:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), (a["step"], key)


def params(step_dir):
    """The saved weights of a checkpoint step, as host arrays."""
    with ocp.StandardCheckpointer() as ckpt:
        state = ckpt.restore(step_dir / "state")
    return state["params"]


def assert_same_params(want, got):
    flat_want = dict(_flatten(want))
    flat_got = dict(_flatten(got))
    assert flat_want.keys() == flat_got.keys()
    for key, value in flat_want.items():
        np.testing.assert_allclose(
            np.asarray(flat_got[key]), np.asarray(value), rtol=1e-6, err_msg=key
        )


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}/{k}")
    else:
        yield prefix, tree


def test_sft_sigterm_twice_and_during_the_save_then_kill_resumes_to_the_same_run(tmp_path):
    config = write_config(tmp_path, "sft.yaml", SFT)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    rc, log = run("sft", config, whole, tmp_path)
    assert rc == 0, log

    # SIGTERM while batch 2 runs, and again inside the save of its checkpoint (step 3).
    rc, log = run("sft", config, cut, tmp_path, {TERM_ENV: "2:step,3:saving"})
    assert rc == PREEMPTION_EXIT_CODE, log
    assert "SIGTERM: stopped after 3 of 5 steps" in log and "Traceback" not in log
    assert [m["step"] for m in read_metrics(cut)] == [0, 1, 2]
    assert sorted(p.name for p in (cut / "resume").iterdir() if p.name.isdigit()) == ["3"]
    assert not (cut / "checkpoints").exists()  # a reward.model path never sees a partial run

    # Resumed at 3, then SIGKILLed as batch 4 starts: the next rerun resumes at 3 again.
    rc, log = run("sft", config, cut, tmp_path, {KILL_ENV: "4:step"})
    assert rc == -signal.SIGKILL, log
    assert [m["step"] for m in read_metrics(cut)] == [0, 1, 2, 3]

    rc, log = run("sft", config, cut, tmp_path)
    assert rc == 0, log
    assert_same_metrics(read_metrics(whole), read_metrics(cut))
    assert not (cut / "resume").exists()
    assert_same_params(params(whole / "checkpoints" / "5"), params(cut / "checkpoints" / "5"))


def test_grpo_sigterm_mid_step_and_during_a_scheduled_save_resumes_to_the_same_run(tmp_path):
    # checkpoint_every: 0 means "only at the end": the uninterrupted run still saves.
    whole_config = write_config(
        tmp_path, "whole.yaml", {**GRPO, "train": {**GRPO["train"], "checkpoint_every": 0}}
    )
    config = write_config(tmp_path, "grpo.yaml", GRPO)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    rc, log = run("grpo", whole_config, whole, tmp_path)
    assert rc == 0, log
    assert sorted(p.name for p in (whole / "checkpoints").glob("trainer-*.json")) == [
        "trainer-4.json"
    ]

    # SIGTERM during iteration 0: not a checkpoint iteration, so one is saved for it.
    rc, log = run("grpo", config, cut, tmp_path, {TERM_ENV: "0:step"})
    assert rc == PREEMPTION_EXIT_CODE, log
    assert [m["step"] for m in read_metrics(cut)] == [0]
    assert (cut / "checkpoints" / "trainer-1.json").is_file()

    # SIGTERM inside the scheduled save of iteration 3: the save completes, then it stops.
    rc, log = run("grpo", config, cut, tmp_path, {TERM_ENV: "3:saving"})
    assert rc == PREEMPTION_EXIT_CODE, log
    assert "SIGTERM: stopped after 3 of 4 steps" in log
    assert (cut / "checkpoints" / "trainer-3.json").is_file()

    # SIGKILL between the roles' save and the step's host file: that step is incomplete.
    rc, log = run("grpo", config, cut, tmp_path, {KILL_ENV: "4:saving"})
    assert rc == -signal.SIGKILL, log
    assert not (cut / "checkpoints" / "trainer-4.json").exists()

    rc, log = run("grpo", config, cut, tmp_path)
    assert rc == 0, log
    assert_same_metrics(read_metrics(whole), read_metrics(cut))
    assert_same_params(
        params(whole / "checkpoints" / "actor" / "4"), params(cut / "checkpoints" / "actor" / "4")
    )


def test_chat_example_takes_a_tokenizer_path_or_a_transformers_tokenizer(tmp_path):
    from transformers import PreTrainedTokenizerFast

    from rlhf.sft import chat_example
    from tests.inference.helpers import byte_level_tokenizer

    template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    folder = byte_level_tokenizer(tmp_path / "tok", chat_template=template)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    want = (list(b"<user>hi<assistant>"), list(b"yo"))  # byte-level: id == byte
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    hf.chat_template = template
    for tokenizer in (str(folder), folder, folder / "tokenizer.json", hf):
        assert chat_example(tokenizer, messages) == want, tokenizer
    with pytest.raises(jc.ConfigError, match="does not exist"):
        chat_example(str(tmp_path / "missing"), messages)


def test_a_reward_that_raises_names_the_reward_and_the_sequence():
    from rlhf.rewards import RewardError, score_rollout
    from rlhf.rollout import Rollout

    def picky(prompt, completion):
        return {4: 1.0}[completion[0]]

    rollout = Rollout(
        tokens=np.array([[1, 2, 3, 4, 5], [1, 2, 3, 6, 7]]),
        mask=np.ones((2, 4)),
        sampler_logp=np.zeros((2, 4)),
        prompt_lengths=np.array([3, 3]),
        completions=[[4, 5], [6, 7]],
        has_eos=np.zeros(2, bool),
        generate_seconds=0.0,
    )
    with pytest.raises(
        RewardError, match=r"reward picky raised KeyError: 6 \(at .*test_offpath"
    ) as e:
        score_rollout([(picky, 1.0)], rollout)
    assert "sequence 1 (prompt [1, 2, 3], completion [6, 7])" in str(e.value)


@pytest.mark.parametrize(
    "reward, match",
    [
        (
            {"fn": "rlhf.tasks:token_share", "kwargs": {"tokn": 3, "length": 4}},
            r"rewards: rlhf\.tasks:token_share\(\*\*\{.*\}\) failed \(TypeError: .*'tokn'\)",
        ),
        ({"fn": "rlhf.tasks:__doc__"}, r"'rlhf\.tasks:__doc__' is a str, not a function"),
    ],
    ids=["kwargs-typo", "not-callable"],
)
def test_a_reward_that_cannot_be_built_is_a_config_error(tmp_path, capsys, reward, match):
    from rlhf.cli import main

    config = write_config(tmp_path, "grpo.yaml", {**GRPO, "rewards": [reward]})
    assert main(["grpo", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert not (tmp_path / "out").exists()  # stopped before building anything
