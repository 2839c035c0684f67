"""Stop 45: the RLHF guide driven from the README as a user would, then one step off it.

Each test is a defect the drive found: a chat record that is not a conversation, a
``train.out`` that is a file, a PPO/GRPO rerun asking for fewer iterations than the run
holds, a misleading YAML hint and an empty data file. None compiles a model.
"""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
import rlhf.cli
from rlhf.config import _checked
from rlhf.sft import chat_example
from rlhf.tasks import read_jsonl
from tests.inference.helpers import byte_level_tokenizer

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
OK = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
MODEL = {
    "vocab_size": 16,
    "d_model": 32,
    "n_layers": 1,
    "n_heads": 4,
    "n_kv_heads": 2,
    "d_ff": 64,
    "max_seq_len": 32,
}
GRPO = {
    "model": MODEL,
    "parallel": {"fsdp": 8},
    "serving": {"slots": 8, "max_len": 16},
    "train": {"out": "unused", "steps": 4, "lr": 1.0e-2},
    "grpo": {"num_generations": 2, "max_tokens": 4},
    "prompts": {"count": 4, "length": 3, "low": 4},
    "rewards": [{"fn": "rlhf.tasks:token_share", "kwargs": {"token": 3, "length": 4}}],
}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return byte_level_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=TEMPLATE)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "bad, match",
    [
        # the last message not the assistant's: the error named neither file nor line
        ([{"role": "user", "content": "hi"}, {"role": "user", "content": "x"}], "last message"),
        # a message without a role rendered as "<>hi" and trained silently
        ([{"content": "hi"}, {"role": "assistant", "content": "yo"}], "message 0 has no role"),
    ],
)
def test_a_chat_record_that_is_not_a_conversation_is_refused_naming_its_line(
    tmp_path, tok, bad, match
):
    path = _jsonl(tmp_path / "sft.jsonl", [OK, OK, {"messages": bad}, OK])
    with pytest.raises(jc.ConfigError, match=match) as e:
        read_jsonl(path, ("prompt", "completion"), tokenizer=str(tok))
    assert str(e.value).startswith(f"{path}:3: ")


def test_a_prompt_message_without_a_role_is_refused_naming_its_line(tmp_path, tok):
    """Prompts as messages (DPO, PPO/GRPO ``prompts.path``) are rendered by the template
    too: a message without a role rendered as ``<>`` and was trained on."""
    answer = [{"role": "assistant", "content": "a"}]
    rec = {"prompt": [{"content": "hi"}], "chosen": answer, "rejected": answer}
    path = _jsonl(tmp_path / "dpo.jsonl", [rec])
    with pytest.raises(jc.ConfigError, match=r"dpo.jsonl:1: prompt: message 0 has no role"):
        read_jsonl(path, ("prompt", "chosen", "rejected"), tokenizer=str(tok))


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"content": "hi"}, {"role": "assistant", "content": "yo"}], "message 0 has no role"),
        (["hi", "yo"], "message 0 is a str"),  # was AttributeError: 'str' ... 'get'
        ([{"role": "user", "content": "hi"}, None], "message 1 is a NoneType"),
        # was ([...], []): an example with nothing to train on, which the CLI refuses
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], "no content"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant"}], "no content"),
    ],
)
def test_chat_example_refuses_messages_that_are_not_role_objects(tok, messages, match):
    with pytest.raises(jc.ConfigError, match=match):
        chat_example(str(tok), messages)
    assert chat_example(str(tok), OK["messages"]) == (list(b"<user>hi<assistant>"), list(b"yo"))


def _config(tmp_path, raw, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_a_train_out_that_is_a_file_is_refused_before_anything_compiles(tmp_path, capsys, stage):
    """``--out`` naming an existing file (or a path below one) ended, after compiling,
    in a FileExistsError traceback."""
    sft = {"model": MODEL, "train": {"out": "unused", "steps": 1, "batch_size": 4}}
    raw = GRPO if stage == "grpo" else sft
    config = _config(tmp_path, raw)
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    for out in (afile, afile / "run"):
        assert rlhf.cli.main([stage, config, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"jaxcore rlhf {stage}: train.out {out}: {afile} is a file, not a folder; pass "
            "another --out (or train.out)."
        )
    assert afile.read_text() == "mine\n"


def test_fewer_rl_steps_than_the_run_holds_is_refused_as_sft_does(tmp_path, capsys):
    """GRPO/PPO with ``--steps`` below the iterations saved in ``train.out`` printed
    "nothing to do: ... already holds all 2 steps" (it held 3, and nothing was said of
    them); SFT, reward and DPO refuse it naming the count."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    # The host file of iteration 3 is what marks a complete PPO/GRPO checkpoint.
    (out / "checkpoints" / "trainer-3.json").write_text("{}")
    config = _config(tmp_path, GRPO)
    assert rlhf.cli.main(["grpo", config, "--out", str(out), "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"jaxcore rlhf grpo: train.out {out} holds a run trained for 3 steps, more than "
        "train.steps=2; pass --steps 3 or more, or another --out."
    )


@settings(max_examples=25, deadline=None)
@given(
    st.one_of(st.integers(-5, 5), st.floats(-1e3, 1e3, allow_nan=False)),
    st.sampled_from(["true", "~", "abc", "[", "a: b", "1e-3x", ""]),
)
def test_the_1e3_hint_only_for_what_yaml_misreads(number, word):
    """``weight: "1"`` said "YAML reads 1e-3 as a string: write 1.0e-3"; the hint now
    fits the mistake: scientific notation without a dot, or a quoted number."""
    sci = f"{float(number):e}".replace(".000000", "")  # 1e+00: no dot, a string to YAML
    for text in (str(number), sci, word):
        with pytest.raises(jc.ConfigError) as e:
            _checked(text, float, "rewards[0].weight")
        msg = str(e.value)
        assert msg.startswith(f"rewards[0].weight: expected a float, got {text!r}")
        read = yaml.safe_load(text) if text not in ("[", "a: b") else None
        if isinstance(read, int | float) and not isinstance(read, bool):  # quoted number
            assert msg.endswith("(a quoted number is a string: write it without the quotes).")
        elif text == sci and read == text:  # what YAML itself reads as a string
            assert msg.endswith("(YAML reads 1e-3 as a string: write 1.0e-3).")
        else:
            assert msg == f"rewards[0].weight: expected a float, got {text!r}.", msg


def test_an_empty_data_file_names_the_file(tmp_path, capsys):
    """An empty ``data.path`` said "data: 0 records but held_out=16", naming no file."""
    empty = tmp_path / "pairs.jsonl"
    empty.write_text("\n")
    raw = {"model": MODEL, "train": {"out": "unused"}, "data": {"path": str(empty)}}
    config = _config(tmp_path, raw)
    assert rlhf.cli.main(["dpo", config, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"jaxcore rlhf dpo: data.path {empty} holds no records; write one JSON object a "
        "line (see configs/rlhf/ and the RLHF section of README.md)."
    )


@pytest.mark.parametrize("serving", [{"slots": 8, "max_len": 16}, {"slots": 8}])
def test_random_prompts_too_long_for_the_sampler_are_refused_at_start(tmp_path, capsys, serving):
    """``prompts.length`` + ``max_tokens`` over the sampler's context was refused only at
    the first rollout, after compiling, naming neither setting ("this model's context is
    16 tokens, but the prompt has 12 tokens"); a prompts file was already checked."""
    raw = {**GRPO, "serving": serving, "grpo": {"num_generations": 2, "max_tokens": 8}}
    limit = serving.get("max_len", MODEL["max_seq_len"])
    raw["prompts"] = {**GRPO["prompts"], "length": limit - 7}
    config = _config(tmp_path, raw)
    assert rlhf.cli.main(["grpo", config, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"jaxcore rlhf grpo: prompts.length has {limit - 7} tokens and grpo.max_tokens is 8 "
        f"({limit + 1} in all), over the sampler's context of {limit} tokens "
        "(serving.max_len); lower it, lower grpo.max_tokens, or raise serving.max_len (up "
        "to model.max_seq_len)."
    )


@pytest.mark.parametrize(
    "stage, section, count, want",
    [
        # 2 prompts x 2 generations = 4 rollouts on 8 fsdp shards
        (
            "grpo",
            {"num_generations": 2, "max_tokens": 4},
            2,
            "grpo trains the actor on batches of prompts.count x grpo.num_generations = "
            "2 x 2 rollouts, which its 8 data-parallel shards cannot split evenly; use a "
            "prompts.count x grpo.num_generations that is a multiple of 8.",
        ),
        (
            "ppo",
            {"max_tokens": 4},
            4,
            "ppo trains the actor on minibatches of prompts.count / ppo.num_minibatches = "
            "4 / 1 rollouts, which its 8 data-parallel shards cannot split evenly; use a "
            "prompts.count that is a multiple of 8.",
        ),
        (
            "ppo",
            {"max_tokens": 4, "num_minibatches": 2},
            8,
            "ppo trains the actor on minibatches of prompts.count / ppo.num_minibatches = "
            "8 / 2 rollouts, which its 8 data-parallel shards cannot split evenly; use a "
            "prompts.count that is a multiple of 16.",
        ),
    ],
)
def test_rollouts_that_do_not_split_into_the_shards_are_refused_at_start(
    tmp_path, capsys, stage, section, count, want
):
    """``prompts.count: 4`` (the tiniest PPO) stopped after the first rollout, compiled,
    with "batch[tokens] has leading size 4, which does not divide into 8 data-parallel
    shards ... Use a batch size that is a multiple of 8", naming no setting."""
    raw = {k: v for k, v in GRPO.items() if k != "grpo"}
    raw[stage] = section
    raw["prompts"] = {**GRPO["prompts"], "count": count}
    config = _config(tmp_path, raw)
    assert rlhf.cli.main([stage, config, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == f"jaxcore rlhf {stage}: {want}"


def test_a_reward_model_with_a_shorter_context_than_the_rollouts_is_refused_at_start(
    tmp_path, capsys
):
    """A reward model trained with ``max_seq_len: 16`` scoring PPO rollouts of 28 tokens
    stopped after the first rollout with "batch[tokens] has rows of 28 tokens but the
    model's max_seq_len is 16", which names neither the reward model nor a setting (the
    policy's max_seq_len is 32)."""
    import jaxcore as jc
    from rlhf.cli import _optimizer, _save_state
    from rlhf.config import parse_config
    from rlhf.models import scalar_head_factory

    short = {**MODEL, "d_model": 8, "n_heads": 2, "n_kv_heads": 1, "d_ff": 16, "max_seq_len": 16}
    rm = parse_config("reward", {"model": short, "train": {"out": str(tmp_path / "rm")}})
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = engine.prepare(scalar_head_factory(rm.model), _optimizer(1e-3))
    _save_state(engine, rm, tmp_path / "rm" / "checkpoints", state, 1)
    raw = {k: v for k, v in GRPO.items() if k not in ("grpo", "rewards")}
    raw |= {
        "serving": {"slots": 8, "max_len": 32},
        "ppo": {"max_tokens": 8},
        "prompts": {"count": 8, "length": 20, "low": 4},
        "reward": {"model": str(tmp_path / "rm")},
    }
    config = _config(tmp_path, raw)
    assert rlhf.cli.main(["ppo", config, "--out", str(tmp_path / "run")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"jaxcore rlhf ppo: reward.model: {tmp_path / 'rm'} was trained with "
            "model.max_seq_len=16, but the rollouts it scores run to 28 tokens (the longest "
            "prompt + max_tokens); train it with a model.max_seq_len of at least 28, or "
            "shorten the prompts or lower max_tokens."
        )
    )


def test_an_sft_row_longer_than_the_model_is_a_config_error():
    """``loss.length: 40`` with ``max_seq_len: 32`` stopped the first SFT step, after
    compiling, with "batch[tokens] has rows of 41 tokens but the model's max_seq_len is
    32", naming neither loss.length nor the model."""
    from rlhf.config import parse_config

    raw = {"model": MODEL, "train": {"out": "x"}}
    with pytest.raises(jc.ConfigError) as e:
        parse_config("sft", {**raw, "loss": {"length": 33}})
    assert str(e.value) == (
        "loss.length=33: SFT rows hold loss.length + 1 = 34 tokens, past "
        "model.max_seq_len=32 (+1 for the shifted target); use a loss.length of at most 32."
    )
    assert parse_config("sft", {**raw, "loss": {"length": 32}}).loss.length == 32
    assert parse_config("dpo", {**raw, "loss": {"length": 33}}).loss.length == 33  # SFT's
