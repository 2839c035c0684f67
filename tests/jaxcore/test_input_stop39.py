"""Off-path input pipeline checks: special-token ids against the vocabulary, tokenizer
folders without tokenizer.json, and packing against a plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore.errors import ConfigError

TEXTS = ["hello world é 😀 \r\n line", "another doc", "x" * 50] * 4


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(
        TEXTS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return jc.load_tokenizer(tk)


@pytest.mark.parametrize("name", ["eos_id", "pad_id"])
def test_negative_special_ids_refused(name):
    # A negative id would be packed into rows as-is and index the embedding from the end.
    with pytest.raises(ConfigError, match=rf"InputConfig.{name}=-1.*>= 0"):
        jc.InputConfig(global_batch_size=2, seq_len=4, **{name: -1})


@pytest.mark.parametrize(("name", "mode"), [("eos_id", "pack"), ("pad_id", "pad")])
def test_special_id_outside_tokenizer_vocab_refused(tok, name, mode):
    cfg = jc.InputConfig(global_batch_size=2, seq_len=4, mode=mode, **{name: tok.vocab_size})
    with pytest.raises(ConfigError, match=rf"{name}={tok.vocab_size}.*vocab_size={tok.vocab_size}"):
        jc.Loader(jc.TextSource(TEXTS, tok), cfg)
    # The last id of the vocabulary is fine.
    ok = jc.InputConfig(global_batch_size=2, seq_len=4, mode=mode, **{name: tok.vocab_size - 1})
    batch = next(iter(jc.Loader(jc.TextSource(TEXTS, tok), ok)))
    assert batch["tokens"].max() < tok.vocab_size


def test_gpt2_style_folder_names_the_way_out(tok, tmp_path):
    tok.backend.model.save(str(tmp_path))  # vocab.json + merges.txt, no tokenizer.json
    with pytest.raises(ConfigError, match=r"vocab.json.*AutoTokenizer.from_pretrained"):
        jc.load_tokenizer(tmp_path)
    (tmp_path / "vocab.json").unlink()
    (tmp_path / "merges.txt").unlink()
    (tmp_path / "tokenizer.model").write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r"tokenizer.model.*AutoTokenizer.from_pretrained"):
        jc.load_tokenizer(tmp_path)


def _reference_rows(docs, order_epochs, width, eos):
    stream = []
    for order in order_epochs:
        epoch = []
        for j in order:
            epoch += list(docs[j]) + ([] if eos is None else [eos])
        rows = len(epoch) // width
        stream += [epoch[r * width : (r + 1) * width] for r in range(rows)]
    return stream


@settings(max_examples=40, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 99), max_size=12), min_size=1, max_size=6),
    seq_len=st.integers(1, 7),
    eos=st.one_of(st.none(), st.integers(100, 110)),
)
def test_pack_matches_plain_python(docs, seq_len, eos):
    width = seq_len + 1
    total = sum(map(len, docs)) + (0 if eos is None else len(docs))
    if total < width:
        return
    source = [np.asarray(d, np.int32) for d in docs]
    cfg = jc.InputConfig(global_batch_size=1, seq_len=seq_len, shuffle=False, eos_id=eos)
    loader = jc.Loader(source, cfg)
    rows_per_epoch = loader.rows_per_epoch
    expect = _reference_rows(docs, [range(len(docs))] * 2, width, eos)
    assert rows_per_epoch == total // width
    got = [loader.local_batch(s)["tokens"][0].tolist() for s in range(2 * rows_per_epoch)]
    assert got == expect


def test_gpt2_files_through_transformers_object_match_ids(tok, tmp_path):
    from transformers import GPT2TokenizerFast

    tok.backend.model.save(str(tmp_path))
    hf = GPT2TokenizerFast(
        vocab_file=str(tmp_path / "vocab.json"), merges_file=str(tmp_path / "merges.txt")
    )
    ours = jc.load_tokenizer(hf)
    for text in [*TEXTS, "new \r\n 😀 ünïcode \u200d " * 300]:
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    source = jc.TextSource(TEXTS, hf)
    assert source.lengths.tolist() == [len(hf(t)["input_ids"]) for t in TEXTS]


def test_resume_refuses_same_count_different_tokens():
    # Same number of documents, other lengths (another tokenizer, edited texts): the saved
    # step would point at other rows, so resuming must refuse rather than go on silently.
    cfg = jc.InputConfig(global_batch_size=2, seq_len=4, eos_id=0)
    first = jc.Loader([np.arange(1, 9, dtype=np.int32)] * 6, cfg)
    for _ in range(3):
        next(first)
    state = first.state_dict()
    same = jc.Loader([np.arange(1, 9, dtype=np.int32)] * 6, cfg)
    same.load_state_dict(state)
    assert np.array_equal(next(same)["tokens"], next(first)["tokens"])
    other = jc.Loader([np.arange(1, 12, dtype=np.int32)] * 6, cfg)
    with pytest.raises(ConfigError, match=r"66 tokens.*48.*same source and tokenizer"):
        other.load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "num_tokens"}  # positions saved before
    same.load_state_dict(older)


def test_worker_processes_resume_across_an_epoch_boundary_exactly():
    # Grain worker processes (random-access source, shuffled): the batches after a resume
    # (even with another worker count) equal the uninterrupted run's, past the epoch's end.
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 50, size=int(n), dtype=np.int32) for n in rng.integers(1, 9, 10)]

    def cfg(workers):
        return jc.InputConfig(global_batch_size=2, seq_len=3, eos_id=0, worker_count=workers)

    whole = jc.Loader(docs, cfg(0))
    steps = 2 * whole.rows_per_epoch // 2 + 2  # into the third epoch
    expect = [next(whole)["tokens"] for _ in range(steps)]
    whole.close()
    run = jc.Loader(docs, cfg(2))
    got = [next(run)["tokens"] for _ in range(3)]
    state = run.state_dict()
    run.close()
    for workers in (2, 0):
        resumed = jc.Loader(docs, cfg(workers))
        resumed.load_state_dict(state)
        rest = [next(resumed)["tokens"] for _ in range(steps - 3)]
        resumed.close()
        assert all(np.array_equal(a, b) for a, b in zip(got + rest, expect, strict=True))
