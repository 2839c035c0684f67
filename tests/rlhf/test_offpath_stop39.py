"""TRL users' datasets and losses against the rlhf stages: preference and SFT records in
TRL's formats (text, conversational with an explicit or implicit prompt; JSONL and
Parquet), chat answers that keep the template's end-of-turn tokens, empty answers refused
naming the record, and the DPO / Bradley-Terry / SFT losses and sequence log-probs held
against float64 NumPy and `transformers` on a tiny Qwen2 checkpoint."""

import json
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcore import ConfigError

# A template with an end-of-turn marker after every message, as ChatML's <|im_end|>.
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</t>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
PAIR = ("prompt", "chosen", "rejected")
SFT = ("prompt", "completion")


def _tok(tmp_path):
    from tests.inference.helpers import byte_level_tokenizer

    return str(byte_level_tokenizer(tmp_path / "tok", chat_template=TEMPLATE))


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _user(text):
    return {"role": "user", "content": text}


def _bot(text):
    return {"role": "assistant", "content": text}


def test_chat_answers_keep_the_templates_end_of_turn_tokens(tmp_path):
    """TRL renders prompt + answer with the template and trains on what follows the
    prompt, end-of-turn marker included; the content alone never teaches the model to stop."""
    from rlhf.sft import chat_example
    from rlhf.tasks import read_jsonl

    tok = _tok(tmp_path)
    assert chat_example(tok, [_user("hi"), _bot("yo")]) == (
        list(b"<user>hi</t><assistant>"),
        list(b"yo</t>"),
    )
    path = _jsonl(
        tmp_path / "pairs.jsonl",
        [{"prompt": [_user("hi")], "chosen": [_bot("yo")], "rejected": [_bot("no")]}],
    )
    assert read_jsonl(path, PAIR, tokenizer=tok) == [
        {
            "prompt": list(b"<user>hi</t><assistant>"),
            "chosen": list(b"yo</t>"),
            "rejected": list(b"no</t>"),
        }
    ]


def test_preference_conversations_with_an_implicit_prompt(tmp_path):
    """TRL's implicit-prompt format: chosen and rejected are whole conversations and the
    prompt is the messages they share (TRL's ``maybe_extract_prompt``)."""
    from rlhf.tasks import read_jsonl

    tok = _tok(tmp_path)
    shared = [_user("hi"), _bot("hey"), _user("2+2?")]
    path = _jsonl(
        tmp_path / "implicit.jsonl",
        [{"chosen": [*shared, _bot("4")], "rejected": [*shared, _bot("5")]}],
    )
    assert read_jsonl(path, PAIR, tokenizer=tok) == [
        {
            "prompt": list(b"<user>hi</t><assistant>hey</t><user>2+2?</t><assistant>"),
            "chosen": list(b"4</t>"),
            "rejected": list(b"5</t>"),
        }
    ]
    bad = _jsonl(tmp_path / "bad.jsonl", [{"chosen": "4", "rejected": "5"}])
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: record lacks \['prompt'\]"):
        read_jsonl(bad, PAIR, tokenizer=tok)


def _parquet(path, records):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def test_parquet_files_read_as_jsonl_do(tmp_path):
    """``datasets``' ``to_parquet`` output (TRL's hub datasets are Parquet) reads like the
    same records in JSONL; a bad row is named by its row number."""
    from rlhf.tasks import read_jsonl

    tok = _tok(tmp_path)
    pairs = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
    ]
    want = read_jsonl(_jsonl(tmp_path / "p.jsonl", pairs), PAIR, tokenizer=tok)
    assert read_jsonl(_parquet(tmp_path / "p.parquet", pairs), PAIR, tokenizer=tok) == want
    chats = [{"messages": [_user("hi"), _bot("yo")]}]
    got = read_jsonl(_parquet(tmp_path / "c.parquet", chats), SFT, tokenizer=tok)
    assert got == read_jsonl(_jsonl(tmp_path / "c.jsonl", chats), SFT, tokenizer=tok)
    ids = [{"prompt": [1, 2], "completion": [3]}, {"prompt": [4], "completion": [5, 6]}]
    assert read_jsonl(_parquet(tmp_path / "ids.parquet", ids), SFT) == ids
    bad = _parquet(tmp_path / "bad.parquet", [pairs[0], {**pairs[1], "chosen": None}])
    with pytest.raises(ConfigError, match=r"bad.parquet: row 2: chosen must be"):
        read_jsonl(bad, PAIR, tokenizer=tok)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 not really")
    with pytest.raises(ConfigError, match=r"junk.parquet: not a readable Parquet file"):
        read_jsonl(junk, PAIR)


def test_a_binary_file_given_as_jsonl_is_a_config_error(tmp_path):
    from rlhf.tasks import read_jsonl

    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": [1], "completion": [2]}\n\xff\xfe\x00binary\n')
    with pytest.raises(ConfigError, match=r"data.jsonl:2: not UTF-8 text"):
        read_jsonl(path, SFT)


@pytest.mark.parametrize(
    "record, keys, match",
    [
        ({"prompt": "a", "completion": ""}, SFT, r"x.jsonl:2: completion is empty"),
        ({"prompt": [1], "completion": []}, SFT, r"x.jsonl:2: completion is empty"),
        ({"prompt": "a", "chosen": "", "rejected": "b"}, PAIR, r"x.jsonl:2: chosen is empty"),
        ({"messages": [_user("hi"), _bot("")]}, SFT, r"x.jsonl:2: completion is empty"),
    ],
    ids=["text", "ids", "chosen", "chat"],
)
def test_an_empty_answer_is_refused_naming_its_line(tmp_path, record, keys, match):
    """An empty answer has no token to train on (SFT) or a log-prob of 0 (DPO, reward):
    it is refused at load, as TRL's tokenize step would leave it untrainable."""
    from rlhf.tasks import read_jsonl

    ok = {"prompt": "a", "completion": "b", "chosen": "b", "rejected": "c"}
    path = _jsonl(tmp_path / "x.jsonl", [{k: ok[k] for k in keys}, record])
    # The chat template renders an end-of-turn marker even for empty content: the text
    # template here is checked on content, so the marker alone does not count as an answer.
    with pytest.raises(ConfigError, match=match):
        read_jsonl(path, keys, tokenizer=_tok(tmp_path))


def _log_sigmoid64(x):
    return -np.logaddexp(0.0, -x)


finite = st.floats(-60.0, 60.0, allow_nan=False, width=32)


@settings(deadline=None, max_examples=60)
@given(
    logps=st.lists(st.tuples(finite, finite, finite, finite), min_size=1, max_size=8),
    beta=st.floats(0.01, 2.0),
    smoothing=st.floats(0.0, 0.5),
)
def test_dpo_loss_and_rewards_equal_the_paper_formula_in_float64(logps, beta, smoothing):
    """Rafailov et al. eq. 7 with cDPO's label smoothing, from the same log-probs."""
    from rlhf.losses import dpo_loss

    c, r, rc, rr = (np.array(col, np.float32) for col in zip(*logps, strict=True))
    loss, stats = dpo_loss(c, r, rc, rr, beta=beta, label_smoothing=smoothing)
    c64, r64, rc64, rr64 = (x.astype(np.float64) for x in (c, r, rc, rr))
    h = beta * ((c64 - rc64) - (r64 - rr64))
    want = np.mean(-(1 - smoothing) * _log_sigmoid64(h) - smoothing * _log_sigmoid64(-h))
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-5)
    margin = beta * (c64 - rc64) - beta * (r64 - rr64)
    np.testing.assert_allclose(float(stats["reward_margin"]), margin.mean(), rtol=1e-5, atol=1e-4)


@settings(deadline=None, max_examples=60)
@given(
    scores=st.lists(st.tuples(finite, finite, st.floats(-5, 5)), min_size=1, max_size=8),
    center=st.one_of(st.none(), st.floats(0.0, 0.1)),
)
def test_bradley_terry_loss_equals_the_float64_formula(scores, center):
    """TRL's RewardTrainer: -log sigmoid(r_c - r_r - margin) + c * mean((r_c + r_r)^2)."""
    from rlhf.losses import bradley_terry_loss

    c, r, m = (np.array(col, np.float32) for col in zip(*scores, strict=True))
    got = bradley_terry_loss(c, r, margin=m, center_coef=center)
    c64, r64, m64 = c.astype(np.float64), r.astype(np.float64), m.astype(np.float64)
    want = -np.mean(_log_sigmoid64(c64 - r64 - m64))
    if center:
        want += center * np.mean((c64 + r64) ** 2)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-4)


def _qwen2(tmp_path):
    from tests.jaxcore.hf_models import save_model

    return save_model("qwen2", tmp_path / "qwen2")


def _torch_sum_logprobs(model, ids, start):
    """Sum of transformers' float64 log-softmax over ids[start:] given what precedes."""
    import torch

    with torch.no_grad():
        t = torch.as_tensor([ids], dtype=torch.long)
        logp = torch.log_softmax(model(t).logits.double(), -1)[0]
    return sum(float(logp[j - 1, ids[j]]) for j in range(start, len(ids)))


def test_dpo_sequence_logprobs_and_sft_loss_equal_transformers_on_a_qwen2_checkpoint(tmp_path):
    """The chosen/rejected log-probs DPO uses (reference pass and policy pass) are the
    sums of transformers' per-token log-softmax over completion tokens only (right
    padding ignored); SFT's loss is the mean NLL over completion tokens only."""
    import optax

    import jaxcore as jc
    from jaxcore import hf
    from rlhf.dpo import dpo_objective, with_reference
    from rlhf.layout import copy_role
    from rlhf.sft import pack, sft_loss

    torch_model, folder = _qwen2(tmp_path)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = engine.prepare(hf.model_factory(folder, engine), optax.sgd(0.0))
    rng = np.random.default_rng(0)
    n, p, c = 8, 5, 7
    records = [
        (
            rng.integers(0, 256, p).tolist(),
            rng.integers(0, 256, rng.integers(1, c + 1)).tolist(),
            rng.integers(0, 256, rng.integers(1, c + 1)).tolist(),
        )
        for _ in range(n)
    ]
    batch = {}
    for col, key in ((1, "chosen"), (2, "rejected")):
        tokens = np.zeros((n, p + c), np.int32)
        mask = np.zeros((n, p + c), np.float32)
        for i, rec in enumerate(records):
            ids = rec[0] + rec[col]
            tokens[i, : len(ids)] = ids
            mask[i, p : len(ids)] = 1.0
        batch[key], batch[key + "_mask"] = tokens, mask
    (scored,) = with_reference(engine, copy_role(state), [batch])
    for col, key in ((1, "chosen"), (2, "rejected")):
        want = [_torch_sum_logprobs(torch_model, r[0] + r[col], p) for r in records]
        np.testing.assert_allclose(scored["ref_" + key], want, atol=2e-5, rtol=1e-5)
    # The policy pass inside the loss: with policy == reference every implicit reward is 0.
    metrics = engine.eval_step(dpo_objective(beta=0.1))(state, scored)
    np.testing.assert_allclose(float(metrics["loss"]), np.log(2.0), atol=1e-6)
    assert abs(float(metrics["reward_margin"])) < 1e-6

    rows = pack([(r[0], r[1]) for r in records], p + c, packing=False)
    got = float(engine.eval_step(sft_loss())(state, rows)["loss"])
    nll = [-_torch_sum_logprobs(torch_model, r[0] + r[1], p) for r in records]
    want = sum(nll) / sum(len(r[1]) for r in records)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_dpo_from_a_hf_checkpoint_exports_to_transformers(tmp_path, capsys):
    """A TRL user's path: ``model: {hf: DIR}`` starts DPO from a ``save_pretrained``
    checkpoint (its config.json is the model section), text pairs are read with its
    tokenizer, and ``jaxcore export --hf`` of the final checkpoint loads in transformers,
    whose float64 log-probs reproduce the run's held-out reward margin and loss."""
    import torch
    import transformers

    from jaxcore.hf.export import main as export
    from rlhf.cli import main
    from tests.rlhf.helpers import read_metrics, write_config

    _, folder = _qwen2(tmp_path)
    tok = _tok(tmp_path)
    pairs = [{"prompt": f"q{i}?", "chosen": f" a{i}!", "rejected": " no"} for i in range(24)]
    data = _jsonl(tmp_path / "pairs.jsonl", pairs)
    raw = {
        "model": {"hf": str(folder)},
        "parallel": {"fsdp": 8},
        "train": {"steps": 2, "lr": 1e-2, "batch_size": 8},
        "loss": {"beta": 0.5},
        "data": {"path": str(data), "tokenizer": tok, "held_out": 8},
    }
    out = tmp_path / "out"
    config = write_config(tmp_path, "dpo.yaml", raw)
    assert main(["dpo", str(config), "--out", str(out)]) == 0, capsys.readouterr().err
    final = read_metrics(out)[-1]
    assert (
        export(
            ["--hf", str(out / "checkpoints" / "2"), str(tmp_path / "hf"), "--config", str(folder)]
        )
        == 0
    )

    before = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    after = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    margins, losses = [], []
    for rec in pairs[-8:]:
        prompt = list(rec["prompt"].encode())
        logits = {}
        for key in ("chosen", "rejected"):
            ids = prompt + list(rec[key].encode())
            logits[key] = [_torch_sum_logprobs(m, ids, len(prompt)) for m in (after, before)]
        h = 0.5 * (
            (logits["chosen"][0] - logits["chosen"][1])
            - (logits["rejected"][0] - logits["rejected"][1])
        )
        margins.append(h)
        losses.append(-_log_sigmoid64(h))
    assert abs(np.mean(margins)) > 1e-3  # the run trained the exported weights
    np.testing.assert_allclose(
        final["held_out_reward_margin"], np.mean(margins), rtol=1e-3, atol=1e-4
    )
    np.testing.assert_allclose(final["held_out_loss"], np.mean(losses), rtol=1e-3, atol=1e-5)
    del torch


def test_dpo_killed_mid_run_or_in_its_final_save_reruns_to_the_uninterrupted_run(tmp_path):
    """DPO keeps no checkpoint between steps unless preempted (SIGTERM): after ``kill -9``
    mid-run, or inside the final save, the same command starts over and ends with the
    uninterrupted run's metrics lines and weights, bit for bit."""
    import signal

    import safetensors.numpy

    from jaxcore.hf.export import export_hf
    from rlhf.config import load_config
    from tests.rlhf.helpers import read_metrics, write_config
    from tests.rlhf.test_cli import cli, finish

    raw = {
        "model": dict(
            vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16
        ),
        "parallel": {"fsdp": 8},
        "train": {"steps": 3, "lr": 3e-3, "batch_size": 8},
        "data": {"n": 32, "held_out": 8},
    }
    config = write_config(tmp_path, "dpo.yaml", raw)
    cache = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    model = load_config("dpo", config).model

    def weights(out):
        path = export_hf(out / "checkpoints" / "3", out.parent / (out.name + "-hf"), model)
        return safetensors.numpy.load_file(path / "model.safetensors")

    whole = tmp_path / "whole"
    rc, log = finish(cli("dpo", config, whole, cache))
    assert rc == 0, log
    want_metrics, want_weights = read_metrics(whole), weights(whole)
    assert [m["step"] for m in want_metrics] == [0, 1, 2, 3]
    for name, point, lines in (("mid", "2:step", [0, 1]), ("save", "3:saving", [0, 1, 2, 3])):
        out = tmp_path / name
        rc, log = finish(cli("dpo", config, out, {**cache, "JAXCORE_RLHF_KILL_AT": point}))
        assert rc == -signal.SIGKILL, log
        assert [m["step"] for m in read_metrics(out)] == lines
        rc, log = finish(cli("dpo", config, out, cache))
        assert rc == 0, log
        got = read_metrics(out)
        assert [m["step"] for m in got] == [0, 1, 2, 3]
        for a, b in zip(want_metrics, got, strict=True):
            assert {k: v for k, v in a.items() if not k.endswith("_s")} == {
                k: v for k, v in b.items() if not k.endswith("_s")
            }
        got_weights = weights(out)
        assert sorted(got_weights) == sorted(want_weights)
        for k, v in want_weights.items():
            np.testing.assert_array_equal(got_weights[k], v, err_msg=f"{name}: {k}")


@pytest.mark.parametrize(
    "stage, model, match",
    [
        ("dpo", {"hf": "DIR", "vocab_size": 16}, r"model.hf with model.vocab_size: the checkpoint"),
        ("sft", {"hf": "MISSING"}, r"MISSING: no config.json"),
        ("sft", {"hf": 3}, r"model.hf: expected a str"),
    ],
    ids=["extra-key", "missing", "not-a-path"],
)
def test_model_hf_mistakes_are_config_errors(tmp_path, stage, model, match):
    from rlhf.config import load_config
    from tests.rlhf.helpers import write_config

    _, folder = _qwen2(tmp_path)
    model = {
        k: str(folder) if v == "DIR" else str(tmp_path / v) if v == "MISSING" else v
        for k, v in model.items()
    }
    raw = {"model": model, "train": {"steps": 1}, "rewards": [{"fn": "rlhf.tasks:token_share"}]}
    with pytest.raises(ConfigError, match=match):
        load_config(stage, write_config(tmp_path, "c.yaml", raw))
    ok = load_config(
        "sft", write_config(tmp_path, "ok.yaml", {**raw, "model": {"hf": str(folder)}})
    )
    assert (ok.model.vocab_size, ok.model.d_model, ok.model.qkv_bias) == (256, 64, True)
    assert ok.model_hf == str(folder)


def test_sft_from_a_hf_checkpoint_on_chat_records(tmp_path, capsys):
    """SFT from ``model: {hf: DIR}`` on TRL ``messages`` records: the first step's loss is
    the transformers model's mean NLL over the assistant answers (end-of-turn included)."""
    import transformers

    from rlhf.cli import main
    from rlhf.sft import chat_example
    from tests.rlhf.helpers import read_metrics, write_config

    _, folder = _qwen2(tmp_path)
    tok = _tok(tmp_path)
    chats = [{"messages": [_user(f"say {i}"), _bot(f"ok {i}")]} for i in range(16)]
    raw = {
        "model": {"hf": str(folder)},
        "parallel": {"fsdp": 8},
        "train": {"steps": 1, "lr": 1e-2, "batch_size": 8},
        "loss": {"packing": False, "length": 40},
        "data": {
            "path": str(_jsonl(tmp_path / "chat.jsonl", chats)),
            "tokenizer": tok,
            "held_out": 8,
        },
    }
    out = tmp_path / "out"
    assert main(["sft", str(write_config(tmp_path, "sft.yaml", raw)), "--out", str(out)]) == 0, (
        capsys.readouterr().err
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    nll, count = 0.0, 0
    for chat in chats[:8]:
        prompt, answer = chat_example(tok, chat["messages"])
        assert bytes(answer).endswith(b"</t>")
        nll -= _torch_sum_logprobs(model, prompt + answer, len(prompt))
        count += len(answer)
    np.testing.assert_allclose(read_metrics(out)[0]["loss"], nll / count, rtol=1e-5)


def test_an_sft_record_longer_than_a_row_is_refused_naming_it(tmp_path, capsys):
    """A record longer than ``loss.length + 1`` tokens (one packed row) stops the run at
    start naming the record and the setting to raise (it said only "pack: an example
    has 34 tokens")."""
    from rlhf.cli import main
    from tests.rlhf.helpers import write_config

    records = [{"prompt": [1, 2], "completion": [3, 4]}] * 20
    records[3] = {"prompt": [1] * 6, "completion": [2] * 6}
    raw = {
        "model": dict(
            vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=32
        ),
        "parallel": {"fsdp": 8},
        "train": {"steps": 1, "batch_size": 8},
        "loss": {"length": 10},
        "data": {"path": str(_jsonl(tmp_path / "sft.jsonl", records)), "held_out": 8},
    }
    assert (
        main(["sft", str(write_config(tmp_path, "sft.yaml", raw)), "--out", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert "sft.jsonl: record 4: prompt + completion is 12 tokens; an SFT row holds" in err
    assert "loss.length + 1 = 11" in err


def test_chatml_answers_equal_transformers_tokenization_after_the_prompt(tmp_path):
    """With a ``save_pretrained`` ChatML tokenizer (special ``<|im_start|>``/``<|im_end|>``)
    the prompt and answer ids are transformers' ``apply_chat_template(tokenize=True)`` of
    the prompt (generation prompt on) and of the whole chat past it, as TRL splits them."""
    import tokenizers
    import transformers

    from rlhf.sft import chat_example
    from tests.inference.helpers import byte_level_tokenizer

    raw = tokenizers.Tokenizer.from_file(
        str(byte_level_tokenizer(tmp_path / "raw") / "tokenizer.json")
    )
    chatml = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=chatml,
    )
    tok.save_pretrained(tmp_path / "chatml")
    chat = [_user("hi"), _bot("yo"), _user("2+2?"), _bot("4")]
    prompt, answer = chat_example(str(tmp_path / "chatml"), chat)
    head = tok.apply_chat_template(chat[:-1], tokenize=True, add_generation_prompt=True)
    full = tok.apply_chat_template(chat, tokenize=True)
    head, full = head["input_ids"], full["input_ids"]
    assert prompt == head and full[: len(head)] == head
    assert answer == full[len(head) :] == [ord("4"), tok.convert_tokens_to_ids("<|im_end|>"), 10]


def test_model_hf_lends_its_tokenizer_to_text_records(tmp_path):
    """As TRL loads the tokenizer from ``model_name_or_path``: with ``model.hf`` holding a
    ``tokenizer.json`` and no ``data.tokenizer``, text records are read with it."""
    import shutil

    from rlhf.config import load_config
    from rlhf.tasks import read_jsonl
    from tests.rlhf.helpers import write_config

    _, folder = _qwen2(tmp_path)
    raw = {"model": {"hf": str(folder)}, "train": {"steps": 1}, "data": {"path": "x.jsonl"}}
    bare = load_config("dpo", write_config(tmp_path, "bare.yaml", raw))
    assert bare.data.tokenizer is None  # none in the folder: ids only, as before
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(_tok(tmp_path)) / name, folder / name)
    cfg = load_config("dpo", write_config(tmp_path, "c.yaml", raw))
    assert cfg.data.tokenizer == str(folder)
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "hi", "chosen": "a", "rejected": "b"}])
    assert read_jsonl(path, PAIR, tokenizer=cfg.data.tokenizer) == [
        {"prompt": list(b"hi"), "chosen": list(b"a"), "rejected": list(b"b")}
    ]
    mine = {**raw, "data": {"path": "x.jsonl", "tokenizer": "other/"}}
    assert load_config("dpo", write_config(tmp_path, "m.yaml", mine)).data.tokenizer == "other/"


def test_ppo_killed_inside_a_checkpoint_save_resumes_to_the_uninterrupted_run(tmp_path):
    """``kill -9`` while iteration 2's roles are being written (its step not yet marked
    complete): the rerun resumes from iteration 1, and its metrics and final actor,
    critic and reference weights equal the uninterrupted run's bit for bit."""
    import signal

    import safetensors.numpy

    from jaxcore.checkpointing.portable import export_checkpoint
    from tests.rlhf.helpers import read_metrics, write_config
    from tests.rlhf.test_cli import PPO, TIMINGS, cli, finish

    raw = {
        **PPO,
        "model": dict(
            vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16
        ),
    }
    config = write_config(tmp_path, "ppo.yaml", raw)
    cache = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }

    def weights(out, role):
        flat = export_checkpoint(
            out / "checkpoints" / role / "3", tmp_path / f"{out.name}-{role}.st"
        )
        return safetensors.numpy.load_file(flat)

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    rc, log = finish(cli("ppo", config, whole, cache))
    assert rc == 0, log
    rc, log = finish(cli("ppo", config, killed, {**cache, "JAXCORE_RLHF_KILL_AT": "2:saving"}))
    assert rc == -signal.SIGKILL, log
    assert [m["step"] for m in read_metrics(killed)] == [0, 1]
    rc, log = finish(cli("ppo", config, killed, cache))
    assert rc == 0, log
    want, got = read_metrics(whole), read_metrics(killed)
    assert [m["step"] for m in got] == [0, 1, 2]
    for a, b in zip(want, got, strict=True):
        assert {k: v for k, v in a.items() if k not in TIMINGS} == {
            k: v for k, v in b.items() if k not in TIMINGS
        }
    for role in ("actor", "critic", "reference"):
        a, b = weights(whole, role), weights(killed, role)
        assert a and sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{role}: {k}")


def test_reference_free_dpo_equals_the_float64_formula_on_a_qwen2_checkpoint(tmp_path):
    """TRL's ``reference_free=True``: the reference is a uniform model (log-prob 0), so
    the loss is -log sigmoid(beta * (logp_chosen - logp_rejected)) and batches need no
    reference pass."""
    import optax

    import jaxcore as jc
    from jaxcore import hf
    from rlhf.dpo import dpo_objective

    torch_model, folder = _qwen2(tmp_path)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = engine.prepare(hf.model_factory(folder, engine), optax.sgd(0.0))
    rng = np.random.default_rng(1)
    n, p, c = 8, 4, 5
    prompts = rng.integers(0, 256, (n, p))
    batch = {}
    for key in ("chosen", "rejected"):
        batch[key] = np.concatenate([prompts, rng.integers(0, 256, (n, c))], 1).astype(np.int32)
        batch[key + "_mask"] = np.concatenate([np.zeros((n, p)), np.ones((n, c))], 1).astype(
            np.float32
        )
    beta, smoothing = 0.3, 0.1
    metrics = engine.eval_step(
        dpo_objective(beta=beta, label_smoothing=smoothing, reference_free=True)
    )(state, batch)
    lp = {
        k: np.array([_torch_sum_logprobs(torch_model, row.tolist(), p) for row in batch[k]])
        for k in ("chosen", "rejected")
    }
    h = beta * (lp["chosen"] - lp["rejected"])
    want = np.mean(-(1 - smoothing) * _log_sigmoid64(h) - smoothing * _log_sigmoid64(-h))
    np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["reward_margin"]), h.mean(), rtol=1e-5, atol=1e-5)


def test_reference_free_dpo_through_the_cli(tmp_path, capsys):
    from rlhf.cli import main
    from tests.rlhf.helpers import read_metrics, write_config

    raw = {
        "model": dict(
            vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16
        ),
        "parallel": {"fsdp": 8},
        "train": {"steps": 2, "batch_size": 8},
        "loss": {"reference_free": True},
        "data": {"n": 16, "held_out": 8},
    }
    out = tmp_path / "o"
    assert main(["dpo", str(write_config(tmp_path, "d.yaml", raw)), "--out", str(out)]) == 0, (
        capsys.readouterr().err
    )
    first = read_metrics(out)[0]
    # Against a reference the first step's margin is 0 (policy == reference); here it is
    # the policy's own beta * (logp_chosen - logp_rejected), not 0.
    assert abs(first["reward_margin"]) > 1e-4


def test_run_records_of_earlier_runs_still_match_and_new_settings_are_recorded(tmp_path):
    """run.json gains ``loss.reference_free`` and ``model_hf`` only when set: a run
    recorded before they existed resumes, and switching one on is refused."""
    from rlhf.cli import RUN_RECORD, _settings, check_out
    from rlhf.config import load_config
    from tests.rlhf.helpers import write_config

    raw = {
        "model": dict(
            vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16
        ),
        "train": {"steps": 2, "batch_size": 8},
    }
    out = tmp_path / "o"
    out.mkdir()
    cfg = load_config(
        "dpo", write_config(tmp_path, "a.yaml", {**raw, "train": {**raw["train"], "out": "x"}})
    )
    plain = _settings(cfg)
    assert "loss.reference_free" not in plain and "model_hf" not in plain
    (out / RUN_RECORD).write_text(json.dumps(plain))
    import dataclasses

    check_out(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=str(out))))
    free = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, out=str(out)),
        loss=dataclasses.replace(cfg.loss, reference_free=True),
    )
    with pytest.raises(ConfigError, match=r"loss.reference_free: None -> True"):
        check_out(free)


@pytest.mark.parametrize(
    "record, keys, match",
    [
        (
            {"prompt": [_user("hi")], "chosen": "yo", "rejected": [_bot("no")]},
            PAIR,
            r"x.jsonl:2: prompt is chat messages but chosen is text",
        ),
        (
            {"prompt": "hi", "completion": [_bot("yo")]},
            SFT,
            r"x.jsonl:2: prompt is text but completion is chat messages",
        ),
    ],
    ids=["chat-prompt-text-answer", "text-prompt-chat-answer"],
)
def test_a_record_mixing_text_and_chat_is_refused_naming_its_line(tmp_path, record, keys, match):
    """TRL reads a record as conversational or as text (a chat prompt with a text answer
    fails in its chat-template step); here the text answer silently lost the template's
    end-of-turn tokens and a text prompt got none of the template."""
    from rlhf.tasks import read_jsonl

    ok = {"prompt": "a", "completion": "b", "chosen": "b", "rejected": "c"}
    path = _jsonl(tmp_path / "x.jsonl", [{k: ok[k] for k in keys}, record])
    with pytest.raises(ConfigError, match=match):
        read_jsonl(path, keys, tokenizer=_tok(tmp_path))
    ids = _jsonl(tmp_path / "ids.jsonl", [{"prompt": [_user("hi")], "completion": [104, 105]}])
    assert read_jsonl(ids, SFT, tokenizer=_tok(tmp_path))[0]["completion"] == [104, 105]


def test_dpo_from_a_hf_checkpoint_preempted_resumes_to_the_uninterrupted_run(tmp_path):
    """SIGTERM mid-run of a ``model.hf`` DPO run: the rerun restores the preemption
    checkpoint over the HF weights (the reference stays the checkpoint's) and ends with
    the uninterrupted run's metrics and exported weights, bit for bit."""
    import safetensors.numpy

    from jaxcore import PREEMPTION_EXIT_CODE
    from jaxcore.checkpointing.portable import export_checkpoint
    from tests.rlhf.helpers import read_metrics, write_config
    from tests.rlhf.test_cli import cli, finish

    _, folder = _qwen2(tmp_path)
    pairs = [{"prompt": f"q{i}?", "chosen": f" a{i}!", "rejected": " no"} for i in range(24)]
    raw = {
        "model": {"hf": str(folder)},
        "parallel": {"fsdp": 8},
        "train": {"steps": 3, "lr": 1e-2, "batch_size": 8},
        "data": {
            "path": str(_jsonl(tmp_path / "p.jsonl", pairs)),
            "tokenizer": _tok(tmp_path),
            "held_out": 8,
        },
    }
    config = write_config(tmp_path, "dpo.yaml", raw)
    cache = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    rc, log = finish(cli("dpo", config, whole, cache))
    assert rc == 0, log
    rc, log = finish(cli("dpo", config, cut, {**cache, "JAXCORE_RLHF_TERM_AT": "1:step"}))
    assert rc == PREEMPTION_EXIT_CODE, log
    assert [m["step"] for m in read_metrics(cut)] == [0, 1]
    rc, log = finish(cli("dpo", config, cut, cache))
    assert rc == 0, log
    assert read_metrics(cut) == read_metrics(whole)
    a, b = (
        safetensors.numpy.load_file(
            export_checkpoint(o / "checkpoints" / "3", tmp_path / f"{o.name}.st")
        )
        for o in (whole, cut)
    )
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
