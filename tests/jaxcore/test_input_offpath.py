"""Input and resume off the tested path: NaN and missing best metrics in retention,
resumes whose input config changed, streams that yield no batch."""

import grain
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.checkpoint import CheckpointConfig, Checkpointer
from jaxcore.input import InputConfig, Loader

from .helpers import factory

NAN = float("nan")


@pytest.fixture(scope="module")
def engine_state():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    return engine, engine.prepare(factory, optax.sgd(0.1))


def _kept(directory, engine_state, values, mode):
    engine, state = engine_state
    cfg = CheckpointConfig(
        directory=directory,
        save_every_steps=1,
        keep_last=1,
        keep_best=1,
        best_metric="loss",
        best_mode=mode,
        async_save=False,
        announce=False,
    )
    with Checkpointer(cfg, engine=engine) as ckpt:
        for step, value in enumerate(values, 1):
            ckpt.save(state.replace(step=jnp.int32(step)), metrics={"loss": value})
        return ckpt.all_steps()


@pytest.mark.parametrize(
    "mode,values,best",
    [
        ("min", [2.0, NAN, 3.0, 4.0], 1),
        ("min", [3.0, NAN, 1.0, NAN, 5.0, NAN, 6.0], 3),
        ("max", [2.0, NAN, 1.0, 0.5], 1),
    ],
)
def test_keep_best_ranks_a_nan_metric_last(tmp_path, engine_state, mode, values, best):
    # Before: sorting with NaN keys kept step 3 (or only the last step), deleting the best.
    assert _kept(tmp_path, engine_state, values, mode) == [best, len(values)]


def test_keep_best_with_the_metric_missing_names_it(tmp_path, engine_state):
    engine, state = engine_state
    cfg = CheckpointConfig(
        directory=tmp_path, save_every_steps=1, keep_best=1, best_metric="loss", announce=False
    )
    with (
        Checkpointer(cfg, engine=engine) as ckpt,
        pytest.raises(
            jc.ConfigError, match=r"got \['acc'\] but CheckpointConfig.best_metric='loss'"
        ),
    ):
        ckpt.save(state.replace(step=jnp.int32(1)), metrics={"acc": 0.5})


def _docs():
    return grain.MapDataset.source(
        [np.arange(1 + i % 5, dtype=np.int32) + 100 * i for i in range(12)]
    )


@pytest.mark.parametrize("change", [{"shuffle": False}, {"eos_id": 0}])
def test_resume_with_a_changed_order_or_packing_is_refused(change):
    cfg = InputConfig(global_batch_size=2, seq_len=4, seed=1)
    first = Loader(_docs(), cfg)
    next(first)
    position = first.state_dict()
    first.close()
    changed = Loader(_docs(), InputConfig(**{**vars(cfg), **change}))
    ((key, value),) = change.items()
    with pytest.raises(jc.ConfigError, match=rf"InputConfig.{key}={value!r} differs"):
        changed.load_state_dict(position)
    # A position saved before these keys were recorded still resumes.
    old = {k: v for k, v in position.items() if k not in ("shuffle", "eos_id")}
    Loader(_docs(), cfg).load_state_dict(old)


@pytest.mark.parametrize("docs", [[], [[1, 2]]])
def test_a_stream_with_no_full_batch_raises_instead_of_ending(docs):
    stream = grain.MapDataset.source([np.asarray(d, np.int32) for d in docs]).to_iter_dataset()
    loader = Loader(stream, InputConfig(global_batch_size=4, seq_len=4, mode="pad"))
    with pytest.raises(jc.ConfigError, match="no complete batch"):
        next(loader)
    loader.close()


@pytest.fixture(scope="module")
def tokenizer():
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.train_from_iterator(["some text", "more text"], tokenizers.trainers.BpeTrainer())
    return tok


def test_text_with_non_utf8_bytes_names_the_document(tokenizer):
    # open(..., errors="surrogateescape") turns a non-UTF-8 byte into a lone surrogate;
    # before: TypeError "TextEncodeInput must be Union[...]" from tokenizers.
    texts = ["fine", "also fine", b"caf\xe9 bytes".decode("utf-8", "surrogateescape")]
    with pytest.raises(jc.ConfigError, match=r"element 2 is not valid Unicode.*'\\udce9'"):
        jc.TextSource(texts, tokenizer, batch_size=2)
    with pytest.raises(jc.ConfigError, match=r"element 0 is a dict with keys \['content'\]"):
        jc.TextSource([{"content": "x"}], tokenizer)


def test_resume_with_an_optimizer_of_other_structure_is_a_config_error(tmp_path, engine_state):
    # adamw and adam have the same leaves (adamw's extra chain entry is an empty state),
    # so the record's leaf table matches; before: CheckpointError blaming Orbax or storage.
    engine, _ = engine_state
    cfg = CheckpointConfig(directory=tmp_path, async_save=False, announce=False)
    with Checkpointer(cfg, engine=engine) as ckpt:
        state, _ = ckpt.restore_or_init(engine, factory, optax.adamw(1e-3))
        ckpt.save(state, force=True)
    with Checkpointer(cfg, engine=engine) as ckpt:
        with pytest.raises(jc.ConfigError, match=r"(?s)another structure.*opt_state.*optimizer"):
            ckpt.restore_or_init(engine, factory, optax.adam(1e-3))
        assert ckpt.all_steps() == [0], "nothing moved"


def test_resuming_a_step_without_input_position_says_the_loader_did_not_move(
    tmp_path, engine_state, caplog
):
    engine, state = engine_state
    cfg = CheckpointConfig(directory=tmp_path, async_save=False, announce=False)
    with Checkpointer(cfg, engine=engine) as ckpt:  # no loader: no position saved
        ckpt.save(state.replace(step=jnp.int32(5)), force=True)
    loader = Loader(_docs(), InputConfig(global_batch_size=8, seq_len=4))
    with Checkpointer(cfg, engine=engine, loader=loader) as ckpt:
        restored, loader = ckpt.restore_or_init(engine, factory, optax.sgd(0.1))
    assert int(restored.step) == 5 and loader.step == 0
    assert "holds no input position" in caplog.text and "loader.seek(5)" in caplog.text


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_token_ids_that_do_not_fit_int32_are_refused_not_wrapped(mode):
    """Rows are int32: an int64 id of 2**32 + 5 used to become 5, a valid id, silently."""
    docs = [np.array([1, 2, 2**32 + 5, 3], np.int64), np.array([4, 5, 6, 7], np.int64)]
    with pytest.raises(jc.ConfigError, match=r"token id 4294967301, outside int32"):
        next(Loader(docs, InputConfig(global_batch_size=8, seq_len=3, mode=mode)))
    fine = Loader([d % 100 for d in docs], InputConfig(global_batch_size=8, seq_len=3, mode=mode))
    assert next(fine)["tokens"].dtype == np.int32
    fine.close()
