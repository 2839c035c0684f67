"""Pipeline parallelism: parity with one device, the bubble metric, errors, re-layout."""

import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcore as jc
from jaxcore.models import Transformer, TransformerConfig, lm_loss

from .helpers import host, max_rel_diff

CFG = TransformerConfig.tiny(n_layers=8, max_seq_len=64)
BATCHES = [
    {"tokens": np.random.default_rng(s).integers(0, 256, (16, 17)).astype(np.int32)}
    for s in range(3)
]
TX = optax.sgd(0.1, momentum=0.9)


def factory(rngs: nnx.Rngs) -> Transformer:
    return Transformer(CFG, rngs=rngs)


def train(engine: jc.Engine, batches=BATCHES, state=None):
    state = engine.prepare(factory, TX) if state is None else state
    step = engine.train_step(lm_loss)
    losses, metrics = [], None
    for b in batches:
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    return np.array(losses), state, metrics


@pytest.fixture(scope="module")
def reference():
    losses, state, _ = train(
        jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    )
    return losses, host(state.params)


LAYOUTS = {
    "pipeline=2": (dict(pipeline=2, fsdp=1), 2, {}),
    "pipeline=4": (dict(pipeline=4, fsdp=1), 4, {}),
    "pipeline=2,fsdp=2,tensor=2": (dict(pipeline=2, fsdp=2, tensor=2), 8, {}),
    "pipeline=2,data=2,fsdp=2 zero3": (dict(pipeline=2, data=2, fsdp=2), 8, dict(zero=3)),
}
SCHEDULES = {"gpipe": {}, "circular": dict(pipeline_schedule="circular")}


@pytest.mark.slow
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pipeline_matches_single_device(layout, schedule, reference):
    ref_losses, ref_params = reference
    parallel, n, extra = LAYOUTS[layout]
    stages = parallel["pipeline"]
    micro = 2 * stages
    engine = jc.Engine(
        parallel=jc.ParallelConfig(**parallel),
        devices=jax.devices()[:n],
        microbatches=micro,
        **extra,
        **SCHEDULES[schedule],
    )
    losses, state, metrics = train(engine)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_diff(host(state.params), ref_params) < 1e-5
    repeats = 2 if schedule == "circular" else 1
    expected_bubble = (stages - 1) / (repeats * micro + stages - 1)
    assert float(metrics["pipeline_bubble"]) == pytest.approx(expected_bubble, rel=1e-6)
    # The layers really are split over the pipeline axis.
    assert "pipeline" in str(state.params["wq"].sharding.spec[0])


def test_grad_accum_folds_into_pipeline_microbatches(reference):
    ref_losses, ref_params = reference
    engine = jc.Engine(
        parallel=jc.ParallelConfig(pipeline=2, fsdp=1),
        devices=jax.devices()[:2],
        microbatches=2,
        grad_accum=2,
    )
    assert engine.pipeline.microbatches == 4
    losses, state, metrics = train(engine)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_diff(host(state.params), ref_params) < 1e-5
    assert float(metrics["pipeline_bubble"]) == pytest.approx(1 / 5)


def test_state_moves_between_pipeline_and_flat_layouts(reference):
    ref_losses, ref_params = reference
    piped = jc.Engine(parallel=jc.ParallelConfig(pipeline=2, fsdp=4), microbatches=2)
    flat = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    flat.prepare(factory, TX)
    first, state, _ = train(piped, BATCHES[:1])
    # The train state keeps layers in natural order under every layout, so re-layout
    # is a device_put onto the other engine's shardings.
    state = jax.device_put(state, flat.state_shardings)
    rest, state, _ = train(flat, BATCHES[1:], state=state)
    np.testing.assert_allclose(np.concatenate([first, rest]), ref_losses, rtol=1e-5)
    # ...and back onto the pipeline layout.
    piped.prepare(factory, TX)
    back = jax.device_put(state, piped.state_shardings)
    assert max_rel_diff(host(back.params), ref_params) < 1e-5


@pytest.mark.parametrize(
    ("save_layout", "restore_layout"),
    [
        (dict(pipeline=2, fsdp=4), dict(fsdp=8)),
        (dict(fsdp=8), dict(pipeline=4, fsdp=2)),
    ],
)
def test_checkpoint_moves_between_pipeline_and_flat_layouts(
    save_layout, restore_layout, reference, tmp_path
):
    ref_losses, ref_params = reference
    config = jc.CheckpointConfig(
        directory=tmp_path / "ckpt", async_save=False, save_on_sigterm=False, announce=False
    )
    saver = jc.Engine(parallel=jc.ParallelConfig(**save_layout), microbatches=4)
    with jc.Checkpointer(config) as ckpt:
        first, state, _ = train(saver, BATCHES[:1])
        ckpt.save(state, force=True)
    loader_engine = jc.Engine(parallel=jc.ParallelConfig(**restore_layout), microbatches=4)
    with jc.Checkpointer(config) as ckpt:
        state, _ = ckpt.restore_or_init(loader_engine, factory, TX)
        assert ckpt.resumed_step == 1
    rest, state, _ = train(loader_engine, BATCHES[1:], state=state)
    np.testing.assert_allclose(np.concatenate([first, rest]), ref_losses, rtol=1e-5)
    assert max_rel_diff(host(state.params), ref_params) < 1e-5


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (
            dict(parallel=jc.ParallelConfig(pipeline=2, fsdp=4), microbatches=3),
            ["microbatches=3", "multiple of the stages"],
        ),
        (
            dict(parallel=jc.ParallelConfig(pipeline=4, fsdp=2), microbatches=2),
            ["microbatches=2", "at least 4"],
        ),
        (
            dict(parallel=jc.ParallelConfig(pipeline=2, fsdp=4), pipeline_repeats=2),
            ["pipeline_schedule='circular'"],
        ),
        (dict(pipeline_schedule="1f1b"), ["pipeline_schedule='1f1b'", "gpipe"]),
    ],
)
def test_bad_pipeline_settings(kwargs, words):
    with pytest.raises(jc.ConfigError) as err:
        jc.Engine(**kwargs)
    for w in words:
        assert w in str(err.value)


def test_layers_that_do_not_split_into_stages():
    engine = jc.Engine(parallel=jc.ParallelConfig(pipeline=4, fsdp=2), pipeline_schedule="circular")
    cfg = TransformerConfig.tiny(n_layers=4)
    with pytest.raises(jc.ConfigError, match="4 layers do not split into 4 pipeline stages x 2"):
        engine.prepare(lambda r: Transformer(cfg, rngs=r), TX)


def test_batch_that_does_not_split_into_microbatches():
    engine = jc.Engine(parallel=jc.ParallelConfig(pipeline=2, fsdp=4), microbatches=4)
    state = engine.prepare(factory, TX)
    with pytest.raises(jc.BatchError, match="4 pipeline microbatches"):
        engine.train_step(lm_loss)(state, {"tokens": BATCHES[0]["tokens"][:8]})


def _while_bodies(hlo: str) -> dict[str, str]:
    """The text of every while-loop body computation in a compiled HLO module."""
    names = set(re.findall(r"body=%?([\w.\-]+)", hlo))
    bodies, current, lines = {}, None, []
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            current, lines = head.group(1), []
        elif line.startswith("}") and current is not None:
            if current in names:
                bodies[current] = "\n".join(lines)
            current = None
        elif current is not None:
            lines.append(line)
    return bodies


def _only_in_root(body: str) -> bool:
    """Whether a loop body's collective-permute result is read by its root tuple only."""
    name = re.search(r"%?([\w.\-]+) = \S+ collective-permute(?:-done)?\(", body).group(1)
    readers = [line for line in body.splitlines() if re.search(rf"%{re.escape(name)}\b[^.]", line)]
    readers = [line for line in readers if not re.search(rf"%{re.escape(name)} = ", line)]
    return bool(readers) and all(line.lstrip().startswith("ROOT ") for line in readers)


@pytest.mark.parametrize("zero", [0, 3])
def test_pipeline_loop_moves_only_the_stage_buffer(zero):
    # Per iteration, the only data a GPipe loop may move between devices is the stage
    # buffer's shift (one collective-permute forward, one backward): an all-reduce of the
    # last stage's output, of the stage-0 feed's cotangent, or of the weight gradients
    # over the data shards in every iteration is a fixed cost per microbatch. Under ZeRO-3
    # the weights stay sharded, so their per-iteration gather/reduce-scatter is expected.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxcore import trace_context
    from jaxcore.pipeline import PipelineConfig, scan_layers
    from jaxcore.sharding import DEFAULT_RULES

    S, M, batch, feat, rows = 4, 8, 32, 8, 3
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(S, 2), ("pipeline", "fsdp"))
    pipe = PipelineConfig(stages=S, microbatches=M, reduce_grads_once=zero < 3)
    ctx = trace_context.TraceContext(mesh=mesh, rules=DEFAULT_RULES, pipeline=pipe)
    extra = np.ones((batch, rows, 1), np.float32)

    def loss(p, x):
        with trace_context.tracing(ctx):
            return scan_layers(lambda h, w, e: jnp.tanh(h @ w) * e, x, p, (extra,)).sum()

    p_spec = PartitionSpec("pipeline", "fsdp" if zero == 3 else None)
    shard = lambda spec: NamedSharding(mesh, spec)
    params = jax.device_put(jnp.ones((2 * S, feat, feat)) * 0.1, shard(p_spec))
    x = jax.device_put(jnp.ones((batch, rows, feat)), shard(PartitionSpec("fsdp")))
    grad = jax.jit(jax.grad(loss))
    hlo = grad.lower(params, x).compile().as_text()
    bodies = _while_bodies(hlo)
    assert bodies, "the pipeline compiled to no loop"
    collectives = r"\b(all-reduce|all-gather|reduce-scatter|all-to-all)(-start)?\("
    permutes = [len(re.findall(r"\bcollective-permute(-start)?\(", b)) for b in bodies.values()]
    assert sorted(permutes)[-2:] == [1, 1]  # the forward and the backward shift
    # GPipe's forward iteration ends with the shift: its result is the next iteration's
    # stage buffer as it stands (stage 0's microbatch came through the wrap-around), not
    # the input of a per-iteration select after it.
    assert any(_only_in_root(b) for b in bodies.values() if "collective-permute" in b)
    others = sum(len(re.findall(collectives, b)) for b in bodies.values())
    if zero < 3:
        assert others == 0, [n for n, b in bodies.items() if re.search(collectives, b)]
        # Nor may it copy a layer's weights (f32[8,8]) out of the stage's stacked layers:
        # that slice is the same size at any M, so it is a fixed cost per microbatch.
        weight_slices = [
            hit for b in bodies.values() for hit in re.findall(r"\S*slice\S* = f32\[8,8\]", b)
        ]
        assert not weight_slices, weight_slices
    else:
        assert others > 0  # ZeRO-3's per-iteration weight gather (memory over speed)
    ref = jax.grad(
        lambda p, x: jax.lax.scan(lambda h, w: (jnp.tanh(h @ w) * extra, None), x, p)[0].sum()
    )(np.asarray(params), np.asarray(x))
    np.testing.assert_allclose(grad(params, x), ref, rtol=1e-5, atol=1e-6)


def _dot_batch_dims(jaxpr) -> list[tuple]:
    """The batch dimensions of every ``dot_general`` in ``jaxpr``, nested jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (_, _), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
            found.append((tuple(lhs_batch), tuple(rhs_batch)))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(_dot_batch_dims(sub))
    return found


@pytest.mark.parametrize("zero", [0, 3])
def test_stages_run_as_per_device_code(zero):
    # Each device computes its stage's matmuls as plain 2-D dots. Vmapping the stage over
    # the stage (and data-shard) axes gave every projection size-1 batch dimensions, and
    # XLA's CPU backend then accumulated weight gradients through transposes: the steps
    # of benchmarks/pipeline_bubble.py ran 3-5% slower (training_speed.md, round 7).
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxcore import trace_context
    from jaxcore.pipeline import PipelineConfig, scan_layers
    from jaxcore.sharding import DEFAULT_RULES

    S, M, batch, feat = 4, 8, 32, 8
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(S, 2), ("pipeline", "fsdp"))
    pipe = PipelineConfig(stages=S, microbatches=M, reduce_grads_once=zero < 3)
    ctx = trace_context.TraceContext(mesh=mesh, rules=DEFAULT_RULES, pipeline=pipe)

    def loss(p, x):
        with trace_context.tracing(ctx):
            return scan_layers(lambda h, w: jnp.tanh(h @ w), x, p).sum()

    p_spec = PartitionSpec("pipeline", "fsdp" if zero == 3 else None)
    params = jax.device_put(jnp.ones((2 * S, feat, feat)) * 0.1, NamedSharding(mesh, p_spec))
    x = jax.device_put(jnp.ones((batch, feat)), NamedSharding(mesh, PartitionSpec("fsdp")))
    dots = _dot_batch_dims(jax.make_jaxpr(jax.grad(loss))(params, x).jaxpr)
    assert dots, "the pipelined step traced no matmul"
    assert all(d == ((), ()) for d in dots), dots
