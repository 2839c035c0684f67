"""`jaxcore rlhf` as 2 processes x 4 CPU devices under `jaxcore launch`, as a user starts a
multi-host job: SFT and DPO end as the 1 x 8 run does (float tolerance); a SIGTERM to
every rank, or to the launcher, stops both at one step, saves one checkpoint and exits 75,
and the rerun ends as the uninterrupted run; a SIGKILLed rank stops the launcher, and the
rerun starts over to the same end. GRPO refuses several processes at start. Faults fire
at named points (`rlhf.faults`, ``@<rank>`` / ``@parent``), so the moment is exact.

Also what a TRL user writes: chat ``messages`` and text records with ``data.tokenizer``,
and ``ppo.kl_coef`` values that could not penalize the KL."""

import json
import os
import subprocess
import sys

import pytest

from jaxcore import PREEMPTION_EXIT_CODE, ConfigError
from rlhf.cli import KILL_ENV, TERM_ENV
from tests.rlhf.helpers import read_metrics, write_config

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
MODEL = dict(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
STEPS = 12  # room after the SIGTERM: JAX's sync point lands a few steps after the notice
SFT = {
    "model": {**MODEL, "max_seq_len": 32},
    "parallel": {"fsdp": 8},
    "train": {"steps": STEPS, "lr": 3e-3, "batch_size": 8},
    "loss": {"packing": True, "length": 24},
    "data": {"n": 48, "held_out": 16, "prompt_len": 4, "completion_len": 8},
}
DPO = {
    "model": {**MODEL, "max_seq_len": 32},
    "parallel": {"fsdp": 8},
    "train": {"steps": 3, "lr": 3e-3, "batch_size": 16},
    "data": {"n": 64, "held_out": 16, "prompt_len": 4, "completion_len": 8},
}
GRPO = {
    "model": {**MODEL, "max_seq_len": 16},
    "parallel": {"fsdp": 8},
    "serving": {"slots": 8, "max_len": 8},
    "train": {"steps": 2, "lr": 1e-2},
    "grpo": {"num_generations": 2, "max_tokens": 4},
    "prompts": {"count": 4, "length": 3, "low": 4},
    "rewards": [{"fn": "rlhf.tasks:token_share", "kwargs": {"token": 3, "length": 4}}],
}
TIMINGS = {"generate_s", "train_s", "rollout_tokens_per_s"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("xla-cache")


def run(stage, config, out, cache, *, procs, env=None):
    """``jaxcore rlhf`` as one process of 8 devices, or under ``jaxcore launch``."""
    rlhf = ["-m", "jaxcore.cli", "rlhf", stage, str(config), "--out", str(out)]
    base = {k: v for k, v in os.environ.items() if k not in (KILL_ENV, TERM_ENV)}
    base.update(
        JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"
    )
    if procs == 1:
        cmd = [sys.executable, *rlhf]
    else:
        launch = ["-m", "jaxcore.cli", "launch", "-n", str(procs), "--devices-per-process"]
        cmd = [sys.executable, *launch, str(8 // procs), "--grace", "2", *rlhf]
    proc = subprocess.run(
        cmd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr


def assert_close(want, got):
    """The same steps and values within float tolerance (2 x 4 devices sum in another
    order than 1 x 8)."""
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for a, b in zip(want, got, strict=True):
        for key in set(a) - TIMINGS:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)


@pytest.fixture(scope="module")
def sft_single(tmp_path_factory, cache):
    """The uninterrupted SFT run in one process of 8 devices."""
    t = tmp_path_factory.mktemp("sft-single")
    rc, log = run("sft", write_config(t, "sft.yaml", SFT), t / "out", cache, procs=1)
    assert rc == 0, log
    return read_metrics(t / "out")


def stopped_at(log):
    """``rank -> step`` from each rank's "SIGTERM: stopped after N of" line."""
    found = {}
    for line in log.splitlines():
        if line.startswith("[rank ") and "SIGTERM: stopped after " in line:
            rank = int(line[len("[rank ") : line.index("]")])
            found[rank] = int(line.split("stopped after ")[1].split()[0])
    return found


@pytest.mark.parametrize("target", ["every-rank", "launcher"])
def test_sft_two_processes_sigterm_stop_at_one_step_and_resume_to_the_one_process_run(
    tmp_path, cache, sft_single, target
):
    config, out = write_config(tmp_path, "sft.yaml", SFT), tmp_path / "out"
    where = "1:step" if target == "every-rank" else "1:step@parent"
    rc, log = run("sft", config, out, cache, procs=2, env={TERM_ENV: where})
    assert rc == PREEMPTION_EXIT_CODE, log[-4000:]
    assert "jaxcore launch: preempted: every rank saved" in log
    steps = stopped_at(log)
    assert set(steps) == {0, 1} and steps[0] == steps[1] < STEPS, log[-4000:]
    saved = [p.name for p in (out / "resume").iterdir() if p.name.isdigit()]
    assert saved == [str(steps[0])]  # one checkpoint, of the step both stopped at
    assert [m["step"] for m in read_metrics(out)] == list(range(steps[0]))  # one writer

    rc, log = run("sft", config, out, cache, procs=2)
    assert rc == 0, log[-4000:]
    assert not (out / "resume").exists()
    assert_close(sft_single, read_metrics(out))


def test_sft_sigkill_of_one_rank_stops_the_launcher_and_the_rerun_ends_as_one_process(
    tmp_path, cache, sft_single
):
    config, out = write_config(tmp_path, "sft.yaml", SFT), tmp_path / "out"
    rc, log = run("sft", config, out, cache, procs=2, env={KILL_ENV: "2:step@1"})
    assert rc == 137, log[-4000:]
    assert "rank 1 was killed by SIGKILL; the other ranks were stopped" in log

    rc, log = run("sft", config, out, cache, procs=2)
    assert rc == 0, log[-4000:]
    assert_close(sft_single, read_metrics(out))


def test_an_error_on_one_rank_stops_the_launcher_at_once(tmp_path, cache):
    # metrics.jsonl is a folder: process 0 (the metrics writer) fails as training starts,
    # while process 1 waits in the first collective for it.
    config, out = write_config(tmp_path, "sft.yaml", SFT), tmp_path / "out"
    (out / "metrics.jsonl").mkdir(parents=True)
    rc, log = run("sft", config, out, cache, procs=2)
    assert rc == 1, log[-4000:]
    assert "rank 0 exited with code 1; the other ranks were stopped" in log
    assert "IsADirectoryError" in log and "process 0 failed (traceback above)" in log
    # Process 0 left at once, so process 1 was stopped, not timed out in its collective.
    assert "DEADLINE_EXCEEDED" not in log, log[-4000:]


def test_dpo_two_processes_match_one_process(tmp_path, cache):
    config = write_config(tmp_path, "dpo.yaml", DPO)
    rc, log = run("dpo", config, tmp_path / "one", cache, procs=1)
    assert rc == 0, log[-4000:]
    rc, log = run("dpo", config, tmp_path / "two", cache, procs=2)
    assert rc == 0, log[-4000:]
    assert_close(read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two"))


def test_grpo_under_two_processes_says_to_run_one(tmp_path, cache):
    rc, log = run(
        "grpo", write_config(tmp_path, "grpo.yaml", GRPO), tmp_path / "out", cache, procs=2
    )
    assert rc == 2, log[-4000:]
    assert "grpo runs in one process (2 were started, from JAXCORE_*)" in log
    assert "jaxcore launch -n 1 --devices-per-process 8" in log
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------- TRL-style text and chat records
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def chat_lines(path, n):
    """``n`` SFT records, alternately chat ``messages`` and text prompt/completion."""
    rows = []
    for i in range(n):
        q, a = f"q{i % 7}", f"a{i % 5}"
        if i % 2:
            rows.append({"prompt": q, "completion": a})
        else:
            rows.append(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_trains_on_chat_messages_and_text_with_data_tokenizer(tmp_path, capsys):
    from rlhf.cli import main
    from tests.inference.helpers import byte_level_tokenizer

    folder = byte_level_tokenizer(tmp_path / "tok", chat_template=TEMPLATE)
    raw = {
        "model": {**MODEL, "vocab_size": 256, "max_seq_len": 32},
        "parallel": {"fsdp": 8},
        "train": {"steps": 2, "lr": 3e-3, "batch_size": 8},
        "loss": {"packing": False, "length": 24},
        "data": {"path": str(chat_lines(tmp_path / "chat.jsonl", 24)), "held_out": 8},
    }
    bare = write_config(tmp_path, "bare.yaml", raw)
    assert main(["sft", str(bare), "--out", str(tmp_path / "bare")]) == 2
    err = capsys.readouterr().err
    assert "chat.jsonl:1: the record holds chat 'messages'; write prompt and completion" in err
    assert "set data.tokenizer to a tokenizer.json file or its folder" in err

    raw["data"]["tokenizer"] = str(folder)
    config = write_config(tmp_path, "sft.yaml", raw)
    assert main(["sft", str(config), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr()
    assert [m["step"] for m in read_metrics(tmp_path / "out")] == [0, 1, 2]


def test_preference_records_as_text_and_conversations_read_as_trl_writes_them(tmp_path):
    from rlhf.tasks import read_jsonl
    from tests.inference.helpers import byte_level_tokenizer

    folder = byte_level_tokenizer(tmp_path / "tok", chat_template=TEMPLATE)
    path = tmp_path / "pairs.jsonl"
    lines = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
        {
            "prompt": [{"role": "user", "content": "hi"}],
            "chosen": [{"role": "assistant", "content": "yo"}],
            "rejected": [{"role": "assistant", "content": "no"}],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    got = read_jsonl(path, ("prompt", "chosen", "rejected"), tokenizer=str(folder))
    assert got == [
        {"prompt": list(b"2+2="), "chosen": list(b"4"), "rejected": list(b"5")},
        {"prompt": list(b"<user>hi<assistant>"), "chosen": list(b"yo"), "rejected": list(b"no")},
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**lines[1], "chosen": [{"role": "user", "content": "x"}]}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: chosen: an answer's messages must all be"):
        read_jsonl(bad, ("prompt", "chosen", "rejected"), tokenizer=str(folder))


@pytest.mark.parametrize(
    "ppo, match",
    [
        ({"kl_coef": -0.1}, r"kl_coef=-0\.1: must be >= 0"),
        ({"kl_coef": 0.0, "kl_target": 6.0}, r"kl_coef=0 with kl_target=6\.0: .* stay 0"),
    ],
    ids=["negative", "adaptive-from-zero"],
)
def test_ppo_kl_coef_that_cannot_penalize_kl_is_a_config_error(tmp_path, ppo, match):
    from rlhf.config import load_config

    raw = {
        "model": {**MODEL, "max_seq_len": 16},
        "train": {"steps": 1},
        "ppo": ppo,
        "rewards": [{"fn": "rlhf.tasks:token_share"}],
    }
    with pytest.raises(ConfigError, match=match):
        load_config("ppo", write_config(tmp_path, "ppo.yaml", raw))
    ok = write_config(tmp_path, "ok.yaml", {**raw, "ppo": {"kl_coef": 0.0}})  # 0, fixed: no penalty
    assert load_config("ppo", ok).ppo.kl_coef == 0.0
