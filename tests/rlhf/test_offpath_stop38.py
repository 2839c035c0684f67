"""PPO/GRPO prompts from a file as a TRL user brings them: a file far larger than one
iteration's batch is walked ``count`` prompts at a time (it was sent whole every
iteration), prompts may be text or chat messages with ``prompts.tokenizer``, and a bad
prompt is refused at start naming its line, before anything compiles."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rlhf.helpers import write_config

MODEL = dict(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
GRPO = {
    "model": {**MODEL, "max_seq_len": 16},
    "parallel": {"fsdp": 8},
    "serving": {"slots": 8, "max_len": 8},
    "train": {"steps": 3, "lr": 1e-2},
    "grpo": {"num_generations": 2, "max_tokens": 4},
    "prompts": {"count": 4},
    "rewards": [{"fn": "rlhf.tasks:token_share", "kwargs": {"token": 3, "length": 4}}],
}


def _lines(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


@settings(deadline=None)  # the first example imports rlhf (jax)
@given(
    n=st.integers(1, 40),
    count=st.integers(1, 40),
    iteration=st.integers(0, 200),
)
def test_each_iteration_takes_the_next_count_prompts_wrapping(n, count, iteration):
    from rlhf.tasks import prompt_batch

    file = [[i] for i in range(n)]
    k = min(count, n)
    oracle = list(itertools.islice(itertools.cycle(file), iteration * k, (iteration + 1) * k))
    assert prompt_batch(file, iteration, count) == oracle


def _record_steps(monkeypatch):
    """Replace the GRPO step by one that records its prompts (nothing compiles)."""
    from rlhf.grpo import GRPOTrainer

    seen = []

    def step(self, prompts):
        seen.append([list(p) for p in prompts])
        return {"loss": 0.0}

    monkeypatch.setattr(GRPOTrainer, "step", step)
    return seen


def test_a_large_prompt_file_is_walked_count_at_a_time(tmp_path, monkeypatch):
    from rlhf.cli import main

    seen = _record_steps(monkeypatch)
    file = [[4 + i % 12, 4 + (i * 5) % 12, 5] for i in range(10)]
    raw = {**GRPO, "prompts": {"count": 4, "path": str(_lines(tmp_path / "p.jsonl", file))}}
    config = write_config(tmp_path, "grpo.yaml", raw)
    assert main(["grpo", str(config), "--out", str(tmp_path / "out")]) == 0
    assert seen == [file[0:4], file[4:8], file[8:10] + file[0:2]]


def test_text_and_chat_prompts_with_prompts_tokenizer(tmp_path, monkeypatch, capsys):
    from rlhf.cli import main
    from tests.inference.helpers import byte_level_tokenizer
    from tests.rlhf.test_offpath_stop37 import TEMPLATE

    folder = byte_level_tokenizer(tmp_path / "tok", chat_template=TEMPLATE)
    path = tmp_path / "p.jsonl"
    chat = [{"role": "user", "content": "hi"}]
    path.write_text(json.dumps({"prompt": "ab"}) + "\n" + json.dumps({"prompt": chat}) + "\n")
    raw = {
        **GRPO,
        "model": {**GRPO["model"], "vocab_size": 256, "max_seq_len": 64},
        "serving": {"slots": 8, "max_len": 48},
        # 2 prompts x 4 generations: rollouts the 8 fsdp shards split (checked at start)
        "grpo": {**GRPO["grpo"], "num_generations": 4},
        "prompts": {"count": 2, "path": str(path)},
    }
    bare = write_config(tmp_path, "bare.yaml", raw)
    assert main(["grpo", str(bare), "--out", str(tmp_path / "bare")]) == 2
    err = capsys.readouterr().err
    assert "p.jsonl:1: prompt must be a list of token ids" in err
    assert "set prompts.tokenizer to a tokenizer.json file or its folder" in err

    seen = _record_steps(monkeypatch)
    raw["prompts"]["tokenizer"] = str(folder)
    config = write_config(tmp_path, "grpo.yaml", raw)
    assert main(["grpo", str(config), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr()
    from jaxcore import load_tokenizer

    tok = load_tokenizer(str(folder))
    expected = [tok.encode("ab"), tok.encode(tok.apply_chat_template(chat))]
    assert seen[0] == expected and len(seen) == 3


@pytest.mark.parametrize(
    ("prompts", "match"),
    [
        ([[4, 99, 5]], r"p\.jsonl: record 1: prompt holds id 99, outside \[0, 16\)"),
        ([[4, 5], []], r"p\.jsonl: record 2: the prompt is empty"),
    ],
)
def test_a_bad_prompt_is_refused_at_start_naming_its_record(
    tmp_path, monkeypatch, capsys, prompts, match
):
    import re

    from rlhf.cli import main

    seen = _record_steps(monkeypatch)
    raw = {**GRPO, "prompts": {"count": 4, "path": str(_lines(tmp_path / "p.jsonl", prompts))}}
    config = write_config(tmp_path, "grpo.yaml", raw)
    assert main(["grpo", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert seen == []
