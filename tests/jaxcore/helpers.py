"""Shared pieces of the engine tests: the tiny model, batches and a plain reference loop."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

import jaxcore as jc
from jaxcore.models import Transformer, TransformerConfig, lm_loss

CFG = TransformerConfig.tiny(max_seq_len=64)
SEQ = 16


def factory(rngs: nnx.Rngs) -> Transformer:
    return Transformer(CFG, rngs=rngs)


def make_batch(batch: int, seed: int, *, padded: bool = False) -> dict[str, np.ndarray]:
    """Random byte tokens; with ``padded``, each row ends in a random amount of padding."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (batch, SEQ + 1)).astype(np.int32)
    out = {"tokens": tokens}
    if padded:
        lengths = rng.integers(2, SEQ + 2, batch)
        out["mask"] = (np.arange(SEQ + 1)[None, :] < lengths[:, None]).astype(np.int32)
    return out


def host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def reference_run(init_params, batches, tx, model=factory):
    """Plain single-device jax.jit + optax loop: the losses and the final parameters
    (``model``: the factory the parameters are of)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: model(nnx.Rngs(0))))

    def loss_fn(params, batch):
        state = jax.tree.map(lambda x: x, abstract)
        nnx.replace_by_pure_dict(state, params)
        return lm_loss(nnx.merge(graphdef, state), batch, None)[0]

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    device = jax.devices()[0]
    params = jax.device_put(init_params, device)
    opt_state = tx.init(params)
    losses = []
    for b in batches:
        params, opt_state, loss = step(params, opt_state, jax.device_put(b, device))
        losses.append(float(loss))
    return np.array(losses), host(params)


def engine_run(engine: jc.Engine, batches, tx):
    """Losses and final parameters from the engine, plus its initial parameters."""
    state = engine.prepare(factory, tx)
    init = host(state.params)
    step = engine.train_step(lm_loss)
    losses = []
    for b in batches:
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    return np.array(losses), host(state.params), init, state


def max_rel_diff(a, b) -> float:
    """max |a - b| / max |b| over every leaf of two parameter trees."""
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        worst = max(worst, float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-12)))
    return worst


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that nobody reaped counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"
