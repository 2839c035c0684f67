"""The engine driven by models a researcher writes in Flax NNX (not the reference
Transformer), checked against plain optax on one device, plus the errors a wrong batch or
``param_rules`` gets."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcore as jc


class Count(nnx.Variable):
    """An integer counter the model updates itself."""


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(6, 16, rngs=rngs)
        self.fc2 = nnx.Linear(16, 3, rngs=rngs)
        self.odd = nnx.Param(jnp.full((7, 3), 0.1))
        self.scale = nnx.Param(jnp.asarray(0.5))

    def __call__(self, x):
        return self.fc2(jax.nn.relu(self.fc1(x))) * self.scale[...] + self.odd[...].sum(0)


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.0, rngs=rngs)
        self.head = nnx.Linear(4, 2, rngs=rngs)
        self.calls = Count(jnp.asarray(0, jnp.int32))

    def __call__(self, x):
        self.calls[...] += 1
        h = self.drop(jax.nn.relu(self.bn(self.conv(x))))
        return self.head(h.mean((1, 2)))


class Tied(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.emb = nnx.Embed(11, 8, rngs=rngs)
        self.mix = nnx.Linear(8, 8, rngs=rngs)

    def __call__(self, tokens):
        return self.emb.attend(jnp.tanh(self.mix(self.emb(tokens))))


def mse(model, batch, rng):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}


def xent(model, batch, rng):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


def lm(model, batch, rng):
    t = batch["tokens"]
    return optax.softmax_cross_entropy_with_integer_labels(model(t[:, :-1]), t[:, 1:]).mean(), {}


def _batches(kind: str, rows: int = 16, n: int = 2) -> list[dict]:
    rng = np.random.default_rng(0)
    if kind == "mlp":
        make = lambda: {
            "x": rng.normal(size=(rows, 6)).astype(np.float32),
            "y": rng.normal(size=(rows, 3)).astype(np.float32),
        }
    elif kind == "cnn":
        make = lambda: {
            "x": rng.normal(size=(rows, 5, 5, 3)).astype(np.float32),
            "y": rng.integers(0, 2, rows).astype(np.int32),
        }
    else:
        make = lambda: {"tokens": rng.integers(0, 11, (rows, 6)).astype(np.int32)}
    return [make() for _ in range(n)]


def _host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def _oracle(factory, loss_fn, tx, params, model_state, batches, accum):
    """Plain optax on one device: the mean gradient over ``accum`` microbatches."""
    model = factory(nnx.Rngs(0))
    nnx.update(model, *(nnx.State(jax.tree.map(jnp.asarray, t)) for t in (params, model_state)))
    opt = tx.init(nnx.state(model, nnx.Param))
    for batch in batches:
        micro = [
            jax.tree.map(lambda x, i=i: x.reshape(-1, accum, *x.shape[1:])[:, i], batch)
            for i in range(accum)
        ]
        grads = [nnx.grad(lambda m, mb=mb: loss_fn(m, mb, None)[0])(model) for mb in micro]
        grads = jax.tree.map(lambda *g: sum(g) / accum, *grads)
        p = nnx.state(model, nnx.Param)
        updates, opt = tx.update(grads, opt, p)
        nnx.update(model, optax.apply_updates(p, updates))
    return (
        nnx.to_pure_dict(nnx.state(model, nnx.Param)),
        nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param))),
    )


def _train(engine, factory, loss_fn, tx, batches):
    plan = engine.plan(factory, tx)
    state = plan.init()
    start = _host((state.params, _no_keys(state.model_state)))
    step = plan.train_step(loss_fn)
    for batch in batches:
        state, metrics = step(state, batch)
    step.check()
    return start, state, metrics


def _no_keys(tree):
    """``tree`` without the PRNG keys (a Dropout's ``rngs``), which NumPy cannot hold."""
    return jax.tree.map(lambda x: None if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x, tree)


LAYOUTS = {
    "data8": dict(parallel=jc.ParallelConfig(data=8, fsdp=1), zero=0),
    "zero1": dict(parallel=jc.ParallelConfig(fsdp=8), zero=1),
    "zero2": dict(parallel=jc.ParallelConfig(fsdp=8), zero=2),
    "zero3": dict(parallel=jc.ParallelConfig(fsdp=8), zero=3),
    "fsdp4-tensor2-rules": dict(
        parallel=jc.ParallelConfig(fsdp=4, tensor=2),
        param_rules=((r"fc1/kernel", ("embed", "mlp")), (r"fc2/kernel", ("mlp", "embed"))),
    ),
}


@pytest.mark.parametrize(("layout", "accum"), [(k, 2 if "zero" in k else 4) for k in LAYOUTS])
def test_mlp_with_odd_and_scalar_params_matches_optax(layout, accum):
    engine = jc.Engine(grad_accum=accum, **LAYOUTS[layout])
    tx = optax.adamw(1e-2)
    batches = _batches("mlp", rows=32)
    (params, _), state, _ = _train(engine, MLP, mse, tx, batches)
    want, _ = _oracle(MLP, mse, tx, params, {}, batches, accum)
    got = _host(state.params)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5), got, want)
    if layout.startswith("fsdp4"):  # the custom rule really splits fc1 over `tensor`
        assert state.params["fc1"]["kernel"].sharding.spec[1] == "tensor"


def test_cnn_batchnorm_and_int_counter_follow_every_microbatch():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3, grad_accum=2)
    tx = optax.sgd(0.1)
    batches = _batches("cnn")
    (params, model_state), state, _ = _train(engine, CNN, xent, tx, batches)
    model_state = jax.tree.map(lambda x: x, model_state)
    del model_state["drop"]
    want_params, want_state = _oracle(CNN, xent, tx, params, model_state, batches, 2)
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5), _host(state.params), want_params
    )
    got_state = _host(_no_keys(state.model_state))
    assert int(got_state["calls"]) == int(want_state["calls"]) == 4  # 2 steps x 2 microbatches
    for k in ("mean", "var"):
        np.testing.assert_allclose(got_state["bn"][k], want_state["bn"][k], atol=1e-5)


def test_weight_tied_embedding_matches_optax_under_fsdp_and_tensor():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=4, tensor=2), grad_accum=2)
    tx = optax.adamw(1e-2)
    batches = _batches("tied")
    (params, _), state, _ = _train(engine, Tied, lm, tx, batches)
    want, _ = _oracle(Tied, lm, tx, params, {}, batches, 2)
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5), _host(state.params), want
    )


def test_fp16_overflow_skips_the_step_and_keeps_the_weights():
    engine = jc.Engine(
        parallel=jc.ParallelConfig(fsdp=8),
        precision="fp16",
        loss_scale=jc.LossScaleConfig(hysteresis=1),
    )
    plan = engine.plan(MLP, optax.sgd(0.1))
    state = plan.init()
    before = _host(state.params)
    step = plan.train_step(lambda m, b, r: (mse(m, b, r)[0] * b["boost"][0], {}))
    batch = {**_batches("mlp", n=1)[0], "boost": np.full((16,), 1e4, np.float32)}
    state, metrics = step(state, batch)  # 1e4 x 65536 overflows float16
    assert int(metrics["skipped"]) == 1
    assert float(metrics["loss_scale"]) == 2.0**15
    jax.tree.map(np.testing.assert_array_equal, _host(state.params), before)


def test_nonfinite_raise_stops_on_a_nan_batch():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), nonfinite="raise", clip_grad_norm=1.0)
    state = engine.prepare(MLP, optax.sgd(0.1))
    step = engine.train_step(mse)
    batch = _batches("mlp", n=1)[0]
    batch["x"][3, 2] = np.nan
    with pytest.raises(jc.TrainingDivergedError):
        state, _ = step(state, batch)
        step.check()


# --- errors that name the mistake and the fix -------------------------------------------


@pytest.fixture(scope="module")
def mlp_step():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    return engine, engine.prepare(MLP, optax.sgd(0.1)), engine.train_step(mse)


def test_leaves_with_different_row_counts_are_a_batch_error(mlp_step):
    _, state, step = mlp_step
    batch = _batches("mlp", n=1)[0]
    batch["y"] = batch["y"][:8]
    with pytest.raises(jc.BatchError, match=r"batch\[y\] has 8 rows but batch\[x\] has 16"):
        step(state, batch)


def test_an_empty_batch_is_a_batch_error(mlp_step):
    _, state, step = mlp_step
    batch = {k: v[:0] for k, v in _batches("mlp", n=1)[0].items()}
    with pytest.raises(jc.BatchError, match="no rows"):
        step(state, batch)


def test_nested_lists_in_a_batch_say_to_pass_arrays(mlp_step):
    _, state, step = mlp_step
    batch = _batches("mlp", n=1)[0]
    batch["x"] = batch["x"].tolist()
    with pytest.raises(jc.BatchError, match=r"batch\[x/0/0\] is a Python float.*np.asarray"):
        step(state, batch)


def test_param_rules_without_the_outer_list_name_the_fix():
    with pytest.raises(jc.ConfigError, match=r"\(regex, logical names\) pair.*outer list"):
        jc.Engine(param_rules=(r"fc1/kernel", ("embed", "mlp")))


def test_param_rules_with_a_misspelt_name_name_the_known_ones():
    with pytest.raises(jc.ConfigError, match=r"names \['mpl'\].*'mlp'"):
        jc.Engine(param_rules=((r"fc1/kernel", ("embed", "mpl")),))
